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

import json
import math
import random
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from parity_tracker.compare import PASSING, STATUSES
from parity_tracker.env import ENV_KEYS
from parity_tracker.tables import MODULES_SCHEMA, OPS_SCHEMA, rows_to_table

#: Statuses that count as neither passing nor failing (the pair could not be judged).
NEUTRAL = frozenset({"skipped"})
#: Row kinds that are weights: reported apart from module divergences.
WEIGHT_KINDS = ("buffer", "param")
#: Execution statuses of a run (``summary["status"]``) and the MLflow run status each maps to.
RUN_STATUSES = {"completed": "FINISHED", "failed": "FAILED", "killed": "KILLED"}
#: Settings keys that are not part of the configuration fingerprint.
NOT_FINGERPRINTED = frozenset({*ENV_KEYS, "mode", "mode_reason", "config_fingerprint"})


# ---------------------------------------------------------------------------------------------
# mode selection and fingerprint


def _off(value: Any, *off_values: str) -> bool:
    """True when a setting value means "not in play" (None, False, '', or one of off_values)."""
    if value is None or value is False:
        return True
    return str(value).strip().lower() in {"", "false", "0", "no", *off_values}


def choose_mode(settings: Mapping[str, Any], requested: str = "auto") -> tuple[str, str]:
    """The comparison mode for a run and the reason, following the seed's section 2.

    ``equal`` (bitwise, ``torch.equal``) is expected when both sides run the same LibTorch
    kernels on the same values; ``allclose`` is prescribed when any of these settings is on:
    ``quantization`` (not ``none``), ``cache`` (not ``off``), ``distributed`` (not ``none``),
    ``random`` (truthy: dropout, sampling) or ``implementation`` (present and not ``same``).

    Args:
        settings: the run's settings.
        requested: ``"auto"``, ``"equal"`` or ``"allclose"``; anything but auto is kept.

    Returns:
        ``(mode, reason)``, e.g. ``("allclose", "quantization=int8 (seed §2: approximate
        arithmetic)")``.

    Raises:
        InputError: ``requested`` is not one of the three modes.
    """
    from parity_tracker.errors import InputError

    if requested not in ("auto", "equal", "allclose"):
        raise InputError(f"mode must be 'auto', 'equal' or 'allclose', got {requested!r}")
    if requested != "auto":
        return requested, f"mode={requested} requested explicitly"
    checks = (
        ("quantization", ("none",), "approximate arithmetic"),
        ("cache", ("off", "none"), "some computation is skipped or reused"),
        ("distributed", ("none",), "reduction order across ranks varies"),
        ("random", (), "random operators draw differently per run"),
        ("implementation", ("same",), "the two implementations run different kernels"),
    )
    reasons = [
        f"{key}={settings[key]} (seed §2: {why})"
        for key, off, why in checks
        if key in settings and not _off(settings[key], *off)
    ]
    if reasons:
        return "allclose", "; ".join(reasons)
    return "equal", "no quantization, cache, distribution, random ops or other implementation"


def config_fingerprint(settings: Mapping[str, Any]) -> str:
    """The baseline key of a configuration: xxh64 of its settings, environment left out.

    Hashes ``target``, ``candidate``, ``device``, ``dtype`` and every other setting (sorted by
    key, each value as ``str(value)``), leaving out the recorded environment (``ENV_KEYS``:
    commit, versions, ...) and the judged ``mode`` (derived from the settings, or a CLI
    override), so the same configuration has the same fingerprint on every commit.

    Returns:
        16 lowercase hex digits.
    """
    import xxhash

    items = sorted((str(k), str(v)) for k, v in settings.items() if k not in NOT_FINGERPRINTED)
    return xxhash.xxh64(json.dumps(items, separators=(",", ":")).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# the result record


@dataclass(eq=False)
class RunResult:
    """The record of one parity run, ready to be written to disk or MLflow.

    Attributes:
        run_id: the parity run id (32 hex digits), also in every table row's ``run_id`` and the
            MLflow tag ``parity.run_id``. Not the MLflow run id (see ``tracking_run_id``).
        modules: one row per compared tag and step (``tables.MODULES_SCHEMA``).
        ops: one row per compared op output (``tables.OPS_SCHEMA``); empty unless ops captured.
        summary: JSON-clean dict (no NaN/inf: non-finite floats become None): ``status``
            (completed | failed | killed), ``passed``, ``counts`` / ``ops_counts`` (rows per
            status, every status present), ``tensors_compared/passing/failing/skipped``,
            ``weights_failing`` (failing param/buffer rows),
            ``first_divergence`` (tag, module, kind, step, exec_order, status, max_abs_diff) or
            None, ``root_causes``, ``output_max_abs_diff``, ``output_sqnr_db``, ``output_equal``,
            ``mode``, ``mode_reason``, ``requested_mode``, ``settings``, ``environment``,
            ``config_fingerprint``, ``error`` ({type, message, traceback, side} or None),
            ``steps``, ``durations_s`` (reference, candidate, compare, isolate) and
            ``start_time_ms`` (ms since the epoch).
        settings: the settings as logged (MLflow params), including the chosen ``mode``.
        dump_dir: local folder of dumped tensors (``.npy`` + index), None when nothing dumped or
            when loaded from the store (the tensors stay in the store under ``tensors/``).
        tracking_run_id: the MLflow run id once logged or loaded, else None.
    """

    run_id: str
    modules: pa.Table
    ops: pa.Table
    summary: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    dump_dir: Path | None = None
    tracking_run_id: str | None = None

    @property
    def first_divergence(self) -> dict[str, Any] | None:
        """The first non-passing tag in execution order (step, then exec_order), or None."""
        return self.summary.get("first_divergence")

    @property
    def error(self) -> dict[str, Any] | None:
        """``{type, message, traceback, side}`` when a forward raised, else None."""
        return self.summary.get("error")

    @property
    def environment(self) -> dict[str, Any]:
        """The recorded environment (``env.ENV_KEYS``)."""
        return self.summary.get("environment", {})

    @property
    def status(self) -> str:
        """``completed``, ``failed`` (a forward raised) or ``killed`` (KeyboardInterrupt)."""
        return self.summary["status"]

    @property
    def mode(self) -> str:
        """The comparison mode used: ``equal`` or ``allclose``."""
        return self.summary["mode"]

    @property
    def passed(self) -> bool:
        """Parity holds for the mode: the run completed and no compared tag or op failed."""
        return bool(self.summary.get("passed"))

    @property
    def fingerprint(self) -> str:
        """``config_fingerprint(self.settings)``."""
        return self.summary["config_fingerprint"]

    def to_pandas(self) -> tuple[Any, Any]:
        """``(modules_df, ops_df)`` as pandas DataFrames (nullable dtypes kept as arrow types)."""
        import pandas as pd

        kw = {"types_mapper": pd.ArrowDtype}
        return self.modules.to_pandas(**kw), self.ops.to_pandas(**kw)


# ---------------------------------------------------------------------------------------------
# summary


def _finite(x: Any) -> float | None:
    """``float(x)`` when finite, else None (summary.json must stay strict JSON)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _json_clean(obj: Any) -> Any:
    """Round-trip through strict JSON so a stored and a loaded summary compare equal."""
    if isinstance(obj, float):
        return _finite(obj)
    if isinstance(obj, Mapping):
        return {str(k): _json_clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_clean(v) for v in obj]
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    return str(obj)


def status_counts(table: pa.Table) -> dict[str, int]:
    """Rows per status, every status of the contract present (zero when absent)."""
    counts = dict.fromkeys(STATUSES, 0)
    if table.num_rows:
        for item in pc.value_counts(table.column("status")).to_pylist():
            counts[item["values"]] = counts.get(item["values"], 0) + int(item["counts"])
    return counts


def _failing_mask(table: pa.Table, weights: bool | None = None) -> pa.ChunkedArray:
    """Mask of rows whose status fails (anything but equal, close, skipped).

    ``weights`` True keeps only param/buffer rows, False only the others, None all.
    """
    bad = pc.invert(pc.is_in(table.column("status"), pa.array(sorted(PASSING | NEUTRAL))))
    if weights is not None:
        is_weight = pc.fill_null(pc.is_in(table.column("kind"), pa.array(WEIGHT_KINDS)), False)
        bad = pc.and_(bad, is_weight if weights else pc.invert(is_weight))
    return bad


def _not_cache_hit(table: pa.Table) -> pa.ChunkedArray:
    """True for rows not marked ``cache_hit`` (null counts as not a hit)."""
    return pc.invert(pc.fill_null(table.column("cache_hit"), False))


def first_divergence(table: pa.Table) -> dict[str, Any] | None:
    """The first failing row (by step, then exec_order, then table order), weights left out.

    Rows marked ``cache_hit`` are left out too: their error belongs to the cache that skipped
    the module, not to the module (issue 7; counted in ``summary["cache_hits_failing"]``).
    ``skipped`` rows are not divergences; parameters and buffers are reported apart
    (``summary["weights_failing"]``) so a weight-loading error is never blamed on a module
    (the TensorChecker's rule). Returns the keys tag, module, kind, step, exec_order, status,
    max_abs_diff, message; None when no such row fails.
    """
    if not table.num_rows:
        return None
    bad = pc.and_(_failing_mask(table, weights=False), _not_cache_hit(table))
    failing = table.append_column("_row", pa.array(range(table.num_rows), pa.int64())).filter(bad)
    if not failing.num_rows:
        return None
    failing = failing.sort_by(
        [("step", "ascending"), ("exec_order", "ascending"), ("_row", "ascending")]
    )
    row = failing.slice(0, 1).to_pylist()[0]
    keys = ("tag", "module", "kind", "step", "exec_order", "status", "max_abs_diff", "message")
    return {k: row[k] for k in keys}


def output_metrics(table: pa.Table, root: str = "model") -> dict[str, Any]:
    """Output-level metrics from the root model's output rows (``module == root``).

    ``root`` is the root's tag name: ``"model"``, or ``"root"`` when the model has a child
    named ``model`` (``parity_tracker.capture.root_name``; Hugging Face ``*ForCausalLM``).

    Over every root output row (all steps, all structured-output leaves):
    ``output_max_abs_diff`` is the largest max_abs_diff, ``output_sqnr_db`` the smallest
    sqnr_db (the worst), ``output_equal`` whether all are ``equal``. Values are None when no
    root output was compared (e.g. a candidate that is not an nn.Module) or not computable;
    an infinite SQNR (identical outputs) is stored as None with ``output_equal`` True.
    """
    rows = [
        r
        for r in table.select(["module", "kind", "status", "max_abs_diff", "sqnr_db"]).to_pylist()
        if r["module"] == root and r["kind"] == "output"
    ]
    if not rows:
        return {"output_max_abs_diff": None, "output_sqnr_db": None, "output_equal": None}
    diffs = [r["max_abs_diff"] for r in rows if r["max_abs_diff"] is not None]
    sqnrs = [r["sqnr_db"] for r in rows if r["sqnr_db"] is not None]
    return {
        "output_max_abs_diff": _finite(max(diffs)) if diffs else None,
        "output_sqnr_db": _finite(min(sqnrs)) if sqnrs else None,
        "output_equal": all(r["status"] == "equal" for r in rows),
    }


def build_summary(
    modules: pa.Table,
    ops: pa.Table,
    *,
    run_id: str,
    status: str,
    mode: str,
    mode_reason: str,
    requested_mode: str,
    settings: Mapping[str, Any],
    environment: Mapping[str, Any],
    error: Mapping[str, Any] | None = None,
    root_causes: list[dict[str, Any]] | None = None,
    durations_s: Mapping[str, float] | None = None,
    start_time_ms: int | None = None,
    root: str = "model",
) -> dict[str, Any]:
    """The run summary (see ``RunResult.summary``), JSON-clean.

    ``passed`` is True only when the run completed, at least one tensor was compared, and no
    modules or ops row has a failing status (anything but equal, close, skipped). In ``equal``
    mode the comparison core never returns ``close``, so passing there means bitwise equal.
    """
    counts, ops_counts = status_counts(modules), status_counts(ops)
    passing = counts["equal"] + counts["close"]
    skipped = counts["skipped"]
    failing = modules.num_rows - passing - skipped
    ops_failing = ops.num_rows - ops_counts["equal"] - ops_counts["close"] - ops_counts["skipped"]
    steps = sorted({s for s in modules.column("step").to_pylist() if s is not None})
    summary = {
        "run_id": run_id,
        "status": status,
        "passed": status == "completed" and failing == 0 and ops_failing == 0 and passing > 0,
        "counts": counts,
        "ops_counts": ops_counts,
        "tensors_compared": modules.num_rows,
        "tensors_passing": passing,
        "tensors_failing": failing,
        "tensors_skipped": skipped,
        "ops_compared": ops.num_rows,
        "ops_failing": ops_failing,
        "weights_failing": _failing_mask(modules, weights=True).to_pylist().count(True)
        if modules.num_rows
        else 0,
        "first_divergence": first_divergence(modules),
        "first_divergent_op": first_divergence(ops),
        "root_causes": list(root_causes or []),
        "cache_hits_failing": pc.sum(
            pc.and_(_failing_mask(modules, weights=False), pc.invert(_not_cache_hit(modules)))
        ).as_py()
        or 0
        if modules.num_rows
        else 0,
        **output_metrics(modules, root),
        "mode": mode,
        "mode_reason": mode_reason,
        "requested_mode": requested_mode,
        "settings": dict(settings),
        "environment": dict(environment),
        "config_fingerprint": config_fingerprint(settings),
        "error": dict(error) if error else None,
        "steps": len(steps),
        "durations_s": dict(durations_s or {}),
        "start_time_ms": start_time_ms,
    }
    return _json_clean(summary)


# ---------------------------------------------------------------------------------------------
# running both sides


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


def _clone_inputs(inputs: Any) -> Any:
    """A deep copy of every tensor leaf (detached), structure and other leaves kept."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, inputs)


def _seed_all(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
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
        (m, [(sub, sub.training) for sub in m.modules()])
        for m in models
        if isinstance(m, torch.nn.Module)
    ]
    for m, _ in saved:
        m.eval()
    try:
        yield
    finally:
        for _, flags in saved:
            for sub, flag in flags:
                sub.training = flag


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


def _prefix_dump_paths(rows: list[dict[str, Any]]) -> None:
    """``check-NNNN/file.npy`` (relative to dump_path) → ``tensors/file.npy`` (artifact path)."""
    for row in rows:
        p = row.get("dump_path")
        if p:
            row["dump_path"] = "tensors/" + p.split("/", 1)[-1]


def _name_unreached(rows: list[dict[str, Any]], error: Mapping[str, Any] | None) -> None:
    """Say in each row the failed side never reached that it was the exception that stopped it."""
    if not error:
        return
    absent = "missing_candidate" if error["side"] == "candidate" else "missing_reference"
    note = f"the {error['side']}'s forward raised {error['type']}: {error['message']}"[:500]
    for row in rows:
        if row["status"] == absent:
            row["message"] = f"{row.get('message') or ''} ({note} before reaching it)".strip()


def _apply_isolation(rows: list[dict[str, Any]], local: Mapping[tuple[str, int], Any]) -> None:
    """Fill ``local_status`` / ``local_max_abs_diff`` of module output rows.

    ``localize.isolate`` counts a module's calls over the whole run, the table per step: the
    n-th distinct (step, call_index) of a module, in that order, is its n-th call of the run.
    """
    calls: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        if row["kind"] == "output" and row["module"] is not None:
            key = (row["step"] or 0, row["call_index"] or 0)
            if key not in calls.setdefault(row["module"], []):
                calls[row["module"]].append(key)
    index = {
        (m, step, ci): n for m, keys in calls.items() for n, (step, ci) in enumerate(sorted(keys))
    }
    for row in rows:
        if row["kind"] != "output" or row["module"] is None:
            continue
        n = index[(row["module"], row["step"] or 0, row["call_index"] or 0)]
        if (row["module"], n) in local:
            row["local_status"], row["local_max_abs_diff"] = local[(row["module"], n)]


def _isolate(plans: list[_Plan], rows: list[dict[str, Any]], mode: str, tol: Any, seed: int):
    """Re-run the failing modules of the candidate on the reference's inputs (localize)."""
    from parity_tracker.localize import isolate

    failing = {
        r["module"]
        for r in rows
        if r["kind"] == "output" and r["module"] and r["status"] not in PASSING | NEUTRAL
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


def _validate(reference: Any, candidate: Any, inputs: Any, drive: Any, cand_drive: Any) -> bool:
    """Check run_parity's arguments; returns whether the candidate is an ``nn.Module``."""
    import torch

    from parity_tracker.errors import InputError

    if (inputs is None) == (drive is None and cand_drive is None):
        raise InputError("run_parity needs exactly one of `inputs` or `drive`/`candidate_drive`")
    if not isinstance(reference, torch.nn.Module):
        raise InputError(f"the reference must be a torch.nn.Module, got {type(reference).__name__}")
    cand_is_module = isinstance(candidate, torch.nn.Module)
    if not cand_is_module and cand_drive is None:
        raise InputError(
            f"candidate {type(candidate).__name__} is not a torch.nn.Module: pass candidate_drive"
            "(model, rec) that registers its tensors with rec.register(tag, tensor)"
        )
    return cand_is_module


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
            distributed, ...), logged as MLflow params and used by ``mode="auto"``.
        mode: ``"auto"`` (``choose_mode``), ``"equal"`` or ``"allclose"``.
        capture_ops: also record every aten op of both forwards (``parity_tracker.ops``) and
            build the ``ops`` table and root causes (seed §4 step 2).
        isolate: re-run each failing candidate module on the reference's inputs
            (``parity_tracker.localize.isolate``) to fill ``local_status`` /
            ``local_max_abs_diff``: its own error, apart from the error it inherited.
        dump_mode: which tensors to save as ``.npy`` (``DumpMode``; default ``NOT_EQUAL``).
        dump_path: dump root (default ``./.parity/dumps/<run_id>``); the check's folder becomes
            ``RunResult.dump_dir`` and is logged as ``tensors/``.
        tolerances: per-tag ``{glob: (rtol, atol)}`` for allclose.
        align: ``align(tag, reference, candidate)`` applied before each comparison.
        seed: the fixed seed.
        environment: the recorded environment (default: ``env.collect_environment()`` now).

    Returns:
        The ``RunResult``. A forward that raises does not propagate: everything compared so far
        is kept, tags the failed side never reached are ``missing_*`` with the exception named,
        ``summary["status"]`` is ``"failed"`` and ``summary["error"]`` holds type, message,
        traceback and side. A ``KeyboardInterrupt`` likewise gives status ``"killed"`` (the
        caller logs the result and exits 130). Hooks are always removed.

    Raises:
        InputError: neither or both of ``inputs`` and a drive; an unknown ``mode``; a
            reference that is not an ``nn.Module``; a non-module candidate without a drive.
    """
    from parity_tracker.capture import root_name
    from parity_tracker.env import collect_environment
    from parity_tracker.store import parity_home
    from parity_tracker.tensor_checker import DumpMode, TensorChecker

    settings = dict(settings or {})
    requested = settings.get("mode", mode) if mode == "auto" else mode
    chosen, reason = choose_mode(settings, requested or "auto")
    settings["mode"] = chosen
    candidate_drive = candidate_drive or drive
    cand_is_module = _validate(reference, candidate, inputs, drive, candidate_drive)
    run_id = uuid.uuid4().hex
    dump_mode = DumpMode.NOT_EQUAL if dump_mode is None else DumpMode(dump_mode)
    if dump_mode is not DumpMode.NOT and dump_path is None:
        dump_path = parity_home() / "dumps" / run_id
    env = dict(environment) if environment is not None else collect_environment()
    plans = [
        _Plan(0, reference, drive, inputs),
        _Plan(1, candidate, candidate_drive, inputs),
    ]
    # snapshots and op captures past their resident budgets spill here; deleted after the check
    spill = tempfile.TemporaryDirectory(prefix="parity-spill-")
    checker = TensorChecker(
        verbose=False, align=align, eager_mode=chosen, tolerances=dict(tolerances or {}),
        dump_mode=dump_mode, spill_dir=spill.name,
    )  # fmt: skip
    ops = None
    if capture_ops:
        from parity_tracker.ops import OpSession

        ops = OpSession(
            mode=chosen, tolerances=tolerances, step_getter=lambda: checker.step,
            spill_dir=spill.name,
        )  # fmt: skip
    start_ms = int(time.time() * 1000)
    try:
        status, error, durations = _run_both(
            plans, checker, ops, seed, hook_candidate=cand_is_module
        )
        t0 = time.perf_counter()
        check = checker.check(chosen, dump_mode=dump_mode, dump_path=dump_path)
        rows = [{**r, "run_id": run_id} for r in check.to_rows()]
        _prefix_dump_paths(rows)
        _name_unreached(rows, error)
        op_rows, root_causes = [], []
        if ops is not None:
            op_rows = [{**r, "run_id": run_id} for r in ops.rows()]
            _name_unreached(op_rows, error)
            root_causes = ops.root_causes()
            ops.close()
    finally:
        spill.cleanup()
    durations["compare"] = time.perf_counter() - t0
    if isolate and status == "completed" and cand_is_module:
        t0 = time.perf_counter()
        with _eval_mode(reference, candidate):
            _apply_isolation(rows, _isolate(plans, rows, chosen, tolerances, seed))
        durations["isolate"] = time.perf_counter() - t0
    modules, ops_table = rows_to_table(rows, MODULES_SCHEMA), rows_to_table(op_rows, OPS_SCHEMA)
    summary = build_summary(
        modules, ops_table, run_id=run_id, status=status, mode=chosen, mode_reason=reason,
        requested_mode=requested or "auto", settings=settings, environment=env, error=error,
        root_causes=[_root_cause_record(r) for r in root_causes], durations_s=durations,
        start_time_ms=start_ms, root=root_name(reference),
    )  # fmt: skip
    dump_dir = Path(dump_path) / check.dump_dir if check.dump_dir else None
    return RunResult(run_id, modules, ops_table, summary, settings, dump_dir)


def _root_cause_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """The summary's view of a root-cause op row."""
    keys = ("tag", "module", "op", "op_index", "step", "exec_order", "status", "cause")
    return {k: row.get(k) for k in keys} | {"message": row.get("message")}


def run_case(case: Any, **kwargs: Any) -> RunResult:
    """``run_parity`` on a ``parity_tracker.case.ParityCase`` (its settings, tolerances, align).

    Keyword arguments override the case's and are passed through (``mode``, ``capture_ops``,
    ``isolate``, ``dump_mode``, ``dump_path``, ``seed``, ``settings`` ...).
    """
    kw: dict[str, Any] = {
        "drive": case.drive,
        "candidate_drive": case.candidate_drive,
        "settings": dict(case.settings),
        "tolerances": case.tolerances,
        "align": case.align,
    }
    kw.update(kwargs)
    from parity_tracker.distributed.launch import ShardedCandidate

    if isinstance(case.candidate, ShardedCandidate):  # ranks spawned, merged here
        from parity_tracker.distributed.launch import launch

        kw.pop("candidate_drive", None)
        return launch(case.reference, case.candidate, case.inputs, **kw)
    return run_parity(case.reference, case.candidate, case.inputs, **kw)
