"""One parity run: hook both models, run reference then candidate, compare, build the tables.

``run_parity`` is the library entry point behind ``parity-tracker run``; it returns a
``RunResult`` that ``parity_tracker.track.log_run`` records as one MLflow run. This module never
imports mlflow.

The procedure is the seed's coarse step (seed §4.1): both models in eval mode under
``torch.no_grad()`` with fixed seeds, every submodule hooked (reference on side 0, candidate on
side 1), one forward each on separate clones of the same inputs (or a ``drive`` callable for
multi-step runs), compared eagerly as the candidate runs, so the first divergent module is known.
"""

from __future__ import annotations

import logging
import random
import tempfile
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity_tracker.capture.tags import named_modules
from parity_tracker.files.tables import OPS_SCHEMA, rows_to_table
from parity_tracker.localize.keep import DEFAULT_REPRO_BYTES
from parity_tracker.localize.root_cause import fallback_root_causes
from parity_tracker.run.budget import twin_fallback
from parity_tracker.run.heap import MODULE_YOUNG_THRESHOLD, frozen_heap, raise_young
from parity_tracker.run.histogram import WorstPair
from parity_tracker.run.keep import keep_for_run
from parity_tracker.run.mode import (
    BUDGET_NOTE,
    REFERENCE_SIDE,
    choose_mode,
    side_names,
    twin_reference_side,
)
from parity_tracker.run.result import RunResult
from parity_tracker.run.rows import ModuleRows, with_isolation, with_unreached_named
from parity_tracker.run.spill import LazySpillRoot
from parity_tracker.run.summary import build_summary, worst_tensor
from parity_tracker.run.validate import validate
from parity_tracker.statuses import BUDGET, is_failing

_log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# running both sides


def default_dump_root() -> Path:
    """``<system temp>/parity-dumps``: where ``run_parity`` dumps when no ``dump_path`` is given.

    The run stage does not know the tracking store's folders (``./.parity``); a caller that
    wants the dumps kept elsewhere passes ``dump_path``. ``log_run`` uploads them as ``tensors/``;
    ``run.dumps.discard_default_dump`` then removes the run's folder (``pipeline.run_target``
    does, once the run is logged or spooled), so a run leaves no orphaned temporary data.
    """
    return Path(tempfile.gettempdir()) / "parity-dumps"


class StepRecorder:
    """What a ``drive(model, rec)`` callable gets: sets the step and registers tensors by hand.

    ``rec(k)`` sets the current step to ``k`` (every capture after it carries ``step=k``); it
    returns the recorder, so ``with rec(k):`` works too. ``rec.register(tag, tensor)`` is the
    seed's ``register_tensor`` for this side (a candidate that is not an ``nn.Module``, e.g. an
    onnxruntime session, takes part only this way). ``rec.mark_cache_hit(module)`` records that
    a cache skipped ``module`` at the current step on this side (its missing tags become
    ``skipped`` with ``cache_hit=True``).

    Attributes:
        side: 0 for the reference, 1 for the candidate.
    """

    def __init__(self, checker: Any, side: int, ops: Any = None) -> None:
        self.checker, self.side, self._ops = checker, side, ops

    @property
    def step(self) -> int:
        """The current step."""
        return self.checker.step

    def __call__(self, step: int) -> StepRecorder:
        """Set the current step to ``step``; returns the recorder (``with rec(k):`` works)."""
        self.checker.step = int(step)
        return self

    def __enter__(self) -> StepRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def register(self, tag: str, tensor: Any) -> None:
        """Register ``tensor`` under ``tag`` for this side at the current step (kind manual)."""
        import torch

        self.checker.register_tensor(tag, tensor, side=self.side)
        if self._ops is not None and isinstance(tensor, torch.Tensor):
            self._ops.record_manual(self.side, tag, tensor)

    def mark_cache_hit(self, module: str) -> None:
        """A cache skipped ``module`` (display name, ``model`` for the root) at this step."""
        self.checker.mark_cache_hit(module, side=self.side)

    def mark_not_observable(self, tag: str, reason: str) -> None:
        """This side's engine cannot expose ``tag`` at this step: ``skipped`` with ``reason``."""
        self.checker.mark_not_observable(tag, reason)

    def note(self, key: str, value: Any) -> None:
        """Record a run param measured while driving (``summary["settings"]``, MLflow params)."""
        self.checker.run_notes[key] = value


def _clone_inputs(inputs: Any) -> Any:
    """A deep copy of every tensor leaf (detached), structure and other leaves kept.

    A plain tuple of plain tensors (or one plain tensor), the usual ``inputs``, is copied
    without ``tree_map``'s pytree walk (≈ 4 instead of ≈ 10 µs, issue 19); the same copies.
    """
    import torch
    from torch.utils._pytree import tree_map

    if type(inputs) is torch.Tensor:
        return inputs.detach().clone()
    if type(inputs) is tuple and all(type(t) is torch.Tensor for t in inputs):
        return tuple(t.detach().clone() for t in inputs)
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, inputs)


def _seed_all(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and not accelerator.is_available():
        # no accelerator can ever start in this process: the CPU generator is the only one.
        # torch.manual_seed would also queue lazy CUDA/XPU seeds, each recording a
        # traceback.format_stack() (≈ 0.3 ms per side, a tenth of a small model's forwards)
        torch.random.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def _forward(model: Any, inputs: Any) -> Any:
    """One forward on ``inputs`` (a tuple → positional, a mapping → keywords, else one arg)."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, tuple | list):
        return model(*inputs)
    return model(inputs)


def _error_record(exc: BaseException, side: int) -> dict[str, Any]:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "side": "reference" if side == 0 else "candidate",
    }


@contextmanager
def _eval_mode(*models: Any) -> Iterator[None]:
    """``eval()`` every nn.Module for the block, restoring each submodule's training flag."""
    import torch

    saved = [
        (m, [(sub, sub.training) for sub in _tree(m)])
        for m in models
        if isinstance(m, torch.nn.Module)
    ]
    for m, flags in saved:
        if not _all_eval(flags):
            m.eval()
    try:
        yield
    finally:
        for _, flags in saved:
            for sub, flag in flags:
                if sub.training is not flag:  # only what changed (a setattr each, issue 19)
                    sub.training = flag


def _tree(model: Any) -> list[Any]:
    """Every module of ``model``'s tree once: the modules ``eval()``/``train()`` reach.

    ``train`` recurses through ``children()`` (the ``_modules`` dicts); this walks them with
    an identity set, the set ``Module.modules()`` yields without building its dotted names
    (issue 19: 301 modules ≈ 0.05 ms instead of ≈ 0.13 ms).
    """
    out, seen = [model], {id(model)}
    for module in out:  # grows while walked: breadth first
        for sub in module._modules.values():
            if sub is not None and id(sub) not in seen:
                seen.add(id(sub))
                out.append(sub)
    return out


def _all_eval(flags: list[tuple[Any, bool]]) -> bool:
    """Every module already in eval mode, none with its own ``train()``: ``eval()`` is a no-op.

    Skipping it saves a recursive ``train(False)`` (≈ 2 µs per module, issue 19); a module
    class that overrides ``train`` always gets the call.
    """
    import torch

    base = torch.nn.Module.train
    return not any(flag or type(sub).train is not base for sub, flag in flags)


@dataclass
class _Plan:
    """Everything ``run_parity`` needs to run one side."""

    side: int
    model: Any
    drive: Callable[..., Any] | None
    inputs: Any


def _run_side(plan: _Plan, checker: Any, ops: Any, seed: int) -> None:
    """Run one side: seed, optional op recording, forward or drive, step reset to 0 first."""
    import torch

    _seed_all(seed)
    checker.step = 0
    rec = StepRecorder(checker, plan.side, ops)
    inputs = _clone_inputs(plan.inputs)  # outside the op recording: not an op of the model
    with ExitStack() as stack:
        if ops is not None:
            stack.enter_context(ops.recording(plan.side, model=plan.model))
        stack.enter_context(torch.no_grad())
        if plan.drive is not None:
            plan.drive(plan.model, rec)
        else:
            _forward(plan.model, inputs)


def _isolate(plans: list[_Plan], rows: list[dict[str, Any]], mode: str, tol: Any, seed: int):
    """Re-run the failing modules of the candidate on the reference's inputs (localize)."""
    from parity_tracker.localize.isolate import isolate

    failing = {
        r["module"]
        for r in rows
        if r["kind"] == "output" and r["module"] and is_failing(r["status"])
    }
    if not failing:
        return {}
    ref, cand = plans

    def run_reference() -> None:
        class _NoChecker:
            step = 0

            def register_tensor(self, *a: Any, **k: Any) -> None: ...

            def mark_cache_hit(self, *a: Any, **k: Any) -> None: ...

        _run_side(ref, _NoChecker(), None, seed)

    return isolate(ref.model, cand.model, run_reference, sorted(failing), mode=mode, tolerances=tol)


def _run_both(
    plans: list[_Plan], checker: Any, ops: Any, seed: int, *, hook_candidate: bool
) -> tuple[str, dict[str, Any] | None, dict[str, float]]:
    """Hook both models, run reference then candidate; a raising side stops the run.

    Returns:
        ``(status, error, durations_s)``: status ``completed`` / ``failed`` / ``killed``.
    """
    from parity_tracker.tensor_checker import module_register_tensor_checker

    status, error, durations = "completed", None, {}
    ref, cand = plans
    with _eval_mode(ref.model, cand.model), ExitStack() as hooks:
        hooks.enter_context(module_register_tensor_checker(ref.model, checker, side=0))
        if hook_candidate:
            hooks.enter_context(module_register_tensor_checker(cand.model, checker, side=1))
        for plan in plans:
            t0 = time.perf_counter()
            try:
                _run_side(plan, checker, ops, seed)
            except KeyboardInterrupt as exc:
                status, error = "killed", _error_record(exc, plan.side)
            except Exception as exc:
                status, error = "failed", _error_record(exc, plan.side)
            durations["reference" if plan.side == 0 else "candidate"] = time.perf_counter() - t0
            if error:
                break
    return status, error, durations


@frozen_heap()  # issue 19: collections walk what the run made, not the whole heap
def run_parity(
    reference: Any,
    candidate: Any,
    inputs: Any = None,
    *,
    drive: Callable[..., Any] | None = None,
    candidate_drive: Callable[..., Any] | None = None,
    settings: Mapping[str, Any] | None = None,
    mode: str = "auto",
    capture_ops: bool = False,
    isolate: bool = False,
    dump_mode: Any = None,
    dump_path: str | Path | None = None,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    align: Callable[[str, Any, Any], Any] | None = None,
    seed: int = 0,
    environment: Mapping[str, Any] | None = None,
    twin: Any = None,
    budgets: Mapping[str, float] | None = None,
    keep_repro: int = DEFAULT_REPRO_BYTES,
) -> RunResult:
    """Run reference then candidate with every module hooked, compare, and build the tables.

    Both models are put in eval mode (restored afterwards) and run under ``torch.no_grad()``
    with ``seed`` set in ``random``, numpy and torch before each side. The reference is hooked
    as side 0, the candidate as side 1 (when it is an ``nn.Module``); each side gets its own
    clone of ``inputs``. Pairs are compared eagerly (as the candidate produces them, so the
    reference's copies are released early) in the chosen mode.

    Args:
        reference: the reference ``torch.nn.Module``.
        candidate: the candidate: an ``nn.Module`` (hooked like the reference) or anything
            else driven by ``candidate_drive`` that registers its tensors with
            ``rec.register(tag, tensor)``.
        inputs: positional inputs of one forward (a tuple; a single tensor; a mapping is passed
            as keywords). Exactly one of ``inputs`` and ``drive``/``candidate_drive``.
        drive: ``drive(model, rec)`` for multi-step runs (see ``StepRecorder``).
        candidate_drive: a separate driver for the candidate (default: ``drive``).
        settings: the run's settings (target, candidate, quantization, cache, device, dtype,
            distributed, ...), logged as MLflow params and used by ``mode="auto"``. The run
            adds ``reference_model`` / ``candidate_model`` (the sides' class names,
            ``run.mode.side_names``; values given here win), left out of the fingerprint.
        mode: ``"auto"`` (``choose_mode``), ``"equal"``, ``"allclose"`` or ``"budget"`` (error
            budget, issue 15: golden and twin passes first, ``parity_tracker.run.budget``;
            ``auto`` falls back to allclose with the reason when the budget cannot run).
        capture_ops: also record every aten op of both forwards (``parity_tracker.ops``) and
            build the ``ops`` table and root causes (seed §4 step 2).
        isolate: re-run each failing candidate module on the reference's inputs
            (``parity_tracker.localize.isolate``) to fill ``local_status`` /
            ``local_max_abs_diff``: its own error, apart from the error it inherited.
        dump_mode: which tensors to save as ``.npy`` (``DumpMode``; default ``NOT_EQUAL``).
        dump_path: dump root (default ``default_dump_root() / <run_id>``, under the system
            temporary folder, so a run never writes into the working tree unless asked; logged
            at INFO; removed by ``run.dumps.discard_default_dump`` once stored); the check's
            folder becomes ``RunResult.dump_dir`` and is logged as ``tensors/``.
        tolerances: per-tag ``{glob: (rtol, atol)}`` for allclose.
        align: ``align(tag, reference, candidate)`` applied before each comparison.
        seed: the fixed seed.
        environment: the recorded environment (default: ``env.start_environment()``: read
            at the start, git's answer collected after the forwards).
        twin: budget mode: the caller's twin (PyTorch at the candidate's precision, e.g. a
            fake-quantized reference); default: the reference cast to the candidate's
            compute dtype (``capture.twin.make_twin``), or the reference itself.
        budgets: budget mode: per-tag ``{glob: k}`` (default k = 2 for every tag).
        keep_repro: size limit in bytes of each reproducer kept for the first divergence and
            the first root causes (``run.keep``; default 64 MiB; 0 keeps none), written under
            the dump folder as ``repro/`` (logged as ``tensors/repro/``); nothing is kept when
            there is no dump folder (``dump_mode=NOT`` without ``dump_path``).

    Returns:
        The ``RunResult``. A forward that raises does not propagate: everything compared so far
        is kept, tags the failed side never reached are ``missing_*`` with the exception named,
        ``summary["status"]`` is ``"failed"`` and ``summary["error"]`` holds type, message,
        traceback and side. A ``KeyboardInterrupt`` likewise gives status ``"killed"`` (the
        caller logs the result and exits 130). Hooks are always removed.

    Raises:
        InputError: neither or both of ``inputs`` and a drive; an unknown ``mode``; a
            reference that is not an ``nn.Module``; a non-module candidate without a drive;
            an explicit ``budget`` that cannot run (``run.budget.prepare`` names why).
    """
    from parity_tracker.adapters.compiled import CompileStats, is_compiled
    from parity_tracker.capture.tags import root_name
    from parity_tracker.run.environment import start_environment
    from parity_tracker.tensor_checker import DumpMode

    if not capture_ops:  # its records live until the check: no early collections (issue 19)
        raise_young(MODULE_YOUNG_THRESHOLD)
    settings = {**(settings or {})}
    for key, name in side_names(reference, candidate).items():  # the caller's names win
        settings.setdefault(key, name)
    compiled = CompileStats(candidate) if is_compiled(candidate) else None
    if compiled is not None:  # before any side runs: a missing C++ compiler stops here
        compiled.start()
        settings.setdefault("implementation", compiled.implementation())
    requested = settings.get("mode", mode) if mode == "auto" else mode
    chosen, reason = choose_mode(settings, requested or "auto")
    settings["mode"] = chosen
    candidate_drive = candidate_drive or drive
    # budget: the golden runs before any hook is installed, so shared modules are found first
    is_budget = chosen == BUDGET
    cand_is_module = validate(
        reference,
        candidate,
        inputs,
        drive,
        candidate_drive,
        walk_shared=is_budget,
        twin=twin if is_budget else None,
    )
    run_id = uuid.uuid4().hex
    dump_mode = DumpMode.NOT_EQUAL if dump_mode is None else DumpMode(dump_mode)
    if dump_mode is not DumpMode.NOT and dump_path is None:
        dump_path = default_dump_root() / run_id
        _log.info("parity run %s: dumped tensors go to %s", run_id, dump_path)
    # git is read in the background while the forwards run (read back for the summary)
    env = (lambda: dict(environment)) if environment is not None else start_environment()
    plans = [
        _Plan(0, reference, drive, inputs),
        _Plan(1, candidate, candidate_drive, inputs),
    ]
    # snapshots and op captures past their resident budgets spill here; deleted after the check
    spill = LazySpillRoot()  # made by the first store that spills
    passes = None
    base_reason = reason.removesuffix(BUDGET_NOTE)  # an allclose fall-back's (no budget notes)
    if chosen == BUDGET:
        try:
            passes = _budget_passes(plans, requested, twin, budgets, align, settings, seed, spill,
                                    capture_ops, isolate)  # fmt: skip
        except BaseException:
            spill.cleanup()
            raise
        if passes.sides is None:
            chosen, reason = "allclose", f"{base_reason}; {passes.reason}"
            settings["mode"] = chosen
        elif passes.twin is not None:  # the twin is the reference side (run.budget)
            plans[0] = _Plan(0, passes.twin, drive, passes.twin_inputs)
            side = twin_reference_side(passes.twin_dtype)
            settings[REFERENCE_SIDE] = side
            reason = f"{reason}; {REFERENCE_SIDE}: {side}"
    checker, ops, worst = _checker(chosen, passes, capture_ops, tolerances, align, dump_mode,
                                   spill, keep_repro)  # fmt: skip
    start_ms = int(time.time() * 1000)
    try:
        status, error, durations = _run_both(
            plans, checker, ops, seed, hook_candidate=cand_is_module
        )
        fallback = twin_fallback(error, explicit=requested == BUDGET) if passes else None
        if fallback and passes.twin is not None:  # auto: the twin could not run (issue 15)
            _discard(checker, ops)
            chosen, reason = "allclose", f"{base_reason}; {fallback}"
            settings["mode"] = chosen
            settings.pop(REFERENCE_SIDE, None)
            plans[0] = _Plan(0, reference, drive, inputs)
            checker, ops, worst = _checker(chosen, None, capture_ops, tolerances, align,
                                           dump_mode, spill, keep_repro)  # fmt: skip
            status, error, durations = _run_both(
                plans, checker, ops, seed, hook_candidate=cand_is_module
            )
        if compiled is not None:  # torch.compile: backend, graph breaks, graphs (run params)
            settings.update(compiled.params())
        settings.update(checker.run_notes)  # rec.note(...) of the drives
        t0 = time.perf_counter()
        check = checker.check(chosen, dump_mode=dump_mode, dump_path=dump_path)
        rows = ModuleRows(check, run_id, error)  # by column; dicts only where a step reads them
        hist = None if check.passed else worst.histogram(worst_tensor(rows.rows()))
        op_rows, root_causes, kept = [], [], ([], [])
        if ops is not None:
            op_rows = with_unreached_named([{**r, "run_id": run_id} for r in ops.rows()], error)
            # with no failing modules row, the fallback never names one: no dicts to make
            module_rows = [] if check.passed else rows.rows()
            root_causes = ops.root_causes() or fallback_root_causes(op_rows, module_rows)
            kept = ops.kept()
            ops.close()
    finally:
        _unlink(checker)  # its records are freed with it, not by the collector (issue 19)
        spill.cleanup()
    durations["compare"] = time.perf_counter() - t0
    if chosen == BUDGET:
        durations.update(passes.durations_s or {})
    if isolate and status == "completed" and cand_is_module:
        t0 = time.perf_counter()
        with _eval_mode(reference, candidate):
            local = _isolate(plans, rows.rows(), chosen, tolerances, seed)
            rows.replace_rows(with_isolation(rows.rows(), local))
        durations["isolate"] = time.perf_counter() - t0
    dump_dir = Path(dump_path) / check.dump_dir if check.dump_dir else None
    failing = kept[0] or kept[1] or not check.passed  # check.passed: no is_failing status
    if keep_repro > 0 and dump_path is not None and failing and status != "killed":
        t0 = time.perf_counter()
        dump_dir = _keep(plans, rows.rows(), kept, run_id, keep_repro, seed, dump_path, dump_dir)
        durations["keep_repro"] = time.perf_counter() - t0
    modules, ops_table = rows.table(), rows_to_table(op_rows, OPS_SCHEMA)
    summary = build_summary(
        modules, ops_table, run_id=run_id, status=status, mode=chosen, mode_reason=reason,
        requested_mode=requested or "auto", settings=settings, environment=env(), error=error,
        root_causes=[_root_cause_record(r) for r in root_causes], durations_s=durations,
        start_time_ms=start_ms, root=root_name(reference), worst_tensor_histogram=hist,
    )  # fmt: skip
    return RunResult(run_id, modules, ops_table, summary, settings, dump_dir)


def _checker(chosen, passes, capture_ops, tolerances, align, dump_mode, spill, keep_repro):
    """``(checker, op session or None, WorstPair)`` of a run in mode ``chosen``."""
    from parity_tracker.tensor_checker import OPS_RUN_RESIDENT_BYTES, TensorChecker

    worst = WorstPair()  # the worst mismatching pair, for the summary's histogram
    # op-level: the op store holds the same activations; a small snapshot budget (issue 19)
    budget_kw = {"max_resident_bytes": OPS_RUN_RESIDENT_BYTES} if capture_ops else {}
    checker = TensorChecker(
        verbose=False, align=align, eager_mode=chosen, tolerances=dict(tolerances or {}),
        dump_mode=dump_mode, spill_dir=spill.name, on_compared=worst,
        budget=passes.sides if chosen == BUDGET else None, **budget_kw,
    )  # fmt: skip
    ops = None
    if capture_ops:
        from parity_tracker.ops import OpSession

        ops = OpSession(
            mode=chosen, tolerances=tolerances, step_getter=lambda: checker.step,
            spill_dir=spill.name, keep_bytes=keep_repro,
        )  # fmt: skip
        checker.borrow_spills(ops.lender)  # a buffer both stores hold is spilled once
    return checker, ops, worst


def _discard(checker: Any, ops: Any) -> None:
    """Let go of a checker (and op session) whose run is not kept."""
    if ops is not None:
        ops.close()
    _unlink(checker)


def _unlink(checker: Any) -> None:
    """Make the checker's holder refer to it through a weak proxy: no reference cycle is left.

    The checker and its holder refer to each other (``capture.holder.Holder.c``), so
    everything the run captured (groups, captures, snapshots, comparisons: ≈ 18,800 objects
    in a 16-step llama-tiny decode) is otherwise freed only by a collection of the cyclic
    garbage collector after the run, which walks all of it (issue 19, measurement 10). With
    the proxy, it is freed when the checker is (at the run's end, unless a caller keeps it;
    the checker stays usable while it lives). Nothing changes when the checker has no such
    holder or cannot be weakly referenced.
    """
    hold = getattr(checker, "_hold", None)
    if hold is not None and getattr(hold, "c", None) is checker:
        # no weak references to it (TypeError): the cycle stays, the collector frees it
        with suppress(TypeError):
            hold.c = weakref.proxy(checker)


def _budget_passes(plans, requested, twin, budgets, align, settings, seed, spill, ops, isolate):
    """The golden and twin passes (``run.budget.prepare``) for the reference's plan."""
    import sys

    from parity_tracker.run.budget import prepare

    ref, cand = plans
    return prepare(
        sys.modules[__name__], ref.model, cand.model, ref.inputs, drive=ref.drive,
        explicit=requested == BUDGET, twin=twin, budgets=budgets, k=None, align=align,
        settings=settings, seed=seed, spill=spill.name, capture_ops=ops, isolate=isolate,
    )  # fmt: skip


def _keep(plans, rows, kept, run_id, limit, seed, dump_path, dump_dir) -> Path | None:
    """Write the reproducer material (``run.keep``) into the dump folder; warn on failure."""
    import warnings

    from parity_tracker.files.dump import new_check_dir
    from parity_tracker.run.keep import catch_call

    def run_module(side: int, module: str, step: int, call: int) -> Any:
        plan = plans[side]
        mods = named_modules(plan.model) if hasattr(plan.model, "named_modules") else {}
        if module not in mods:
            return None, None
        with _eval_mode(plan.model):
            runner = lambda stepper: _run_side(plan, stepper, None, seed)  # noqa: E731
            return catch_call(plan.model, module, step, call, runner), mods[module]

    try:
        folder = dump_dir or new_check_dir(dump_path)
        keep_for_run(
            folder, run_id=run_id, rows=rows, kept_ops=kept[0], unkept_ops=kept[1],
            run_module=run_module, limit_bytes=limit,
        )  # fmt: skip
        return folder
    except Exception as exc:  # never lose the run for its reproducer
        warnings.warn(f"reproducer material not kept: {exc!r}", RuntimeWarning, stacklevel=3)
        return dump_dir


def _root_cause_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """The summary's view of a root-cause op row."""
    keys = ("tag", "module", "op", "op_index", "step", "exec_order", "status", "cause")
    return {k: row.get(k) for k in keys} | {"message": row.get("message")}


def run_case(case: Any, **kwargs: Any) -> RunResult:
    """``run_parity`` on a ``pipeline.case.ParityCase`` (its settings, tolerances, align).

    Keyword arguments override the case's and are passed through (``mode``, ``capture_ops``,
    ``isolate``, ``dump_mode``, ``dump_path``, ``seed``, ``settings`` ...). A sharded candidate
    (``parity_tracker.distributed.ShardedCandidate``) runs on ranks: use
    ``parity_tracker.pipeline.run_target.run_case``, which launches them.
    """
    return run_parity(case.reference, case.candidate, case.inputs, **case_kwargs(case, **kwargs))


def case_kwargs(case: Any, **kwargs: Any) -> dict[str, Any]:
    """The ``run_parity`` keywords of a ``ParityCase`` (drives, settings, tolerances, align).

    Keyword arguments override the case's.
    """
    kw: dict[str, Any] = {
        "drive": case.drive,
        "candidate_drive": case.candidate_drive,
        "settings": dict(case.settings),
        "tolerances": case.tolerances,
        "align": case.align,
        "twin": case.twin,
        "budgets": case.budgets,
    }
    kw.update(kwargs)
    return kw
