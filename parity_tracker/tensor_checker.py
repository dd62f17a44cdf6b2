"""The seed-compatible TensorChecker (design.md, "Public names"; seed document, section 3).

An engine team switches from ``dtorch.util.tensor_checker`` by changing one import::

    from parity_tracker.tensor_checker import tensor_checker, module_register_tensor_checker

    module_register_tensor_checker(torch_model, tensor_checker)    # side 0: the reference
    module_register_tensor_checker(engine_model, tensor_checker)   # side 1: the candidate
    with torch.no_grad():
        torch_model(x)
        engine_model(x)
    tensor_checker.check_equal()     # TensorChecker: 2 tensors equal in checker_conv_in ...

Tensors are grouped by tag (and step, for multi-step runs). The first tensor registered under a
tag is the reference and every other is compared with it (seed semantics); tensors captured by
hooks carry their model's side, so a tag seen on one side only is reported as
``missing_reference`` / ``missing_candidate`` instead of being silently dropped.

Two capture paths give identical results:

- deferred (default): every tensor is detached and cloned at capture and compared in
  ``check``;
- eager (``eager_mode="equal"`` or ``"allclose"``, the low-memory path of ``run_parity``): when
  the second side's tensor of a tag arrives it is compared at once, without cloning it (a small
  pair: both copied, compared in bulk at ``check``, ``compare.batch``), and the reference's
  snapshot is released unless a planned dump needs it.

The memory bound: on the eager path the reference runs first, so its snapshots wait for the
candidate's. They are kept in a store that holds at most ``max_resident_bytes`` of snapshot storage
resident (each snapshot counted once, however many captures share it; parameters are pinned, not
copied (``Snapshotter.pin``: a lazy clone), and not counted, except a small one held as its bytes,
``capture.holder``). Past the budget the oldest snapshots
are written to ``spill_dir`` (``parity_tracker.capture.store``, shared with the op store) and read
back memory-mapped when their pair is compared or dumped. After every capture::

    resident_bytes <= max_resident_bytes        (whatever the model depth)

Spilling changes where a snapshot lives, never its value: results are identical.

This module is the seed facade: the hooks and capture records live in
:mod:`parity_tracker.capture.modules`, the snapshot store in
:mod:`parity_tracker.capture.snapshot`, pairing and diagnosis in
:mod:`parity_tracker.compare.pairing`, the result records and the printout in
:mod:`parity_tracker.compare.results`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from parity_tracker.capture.holder import Holder
from parity_tracker.capture.hooks import HookHandle, install
from parity_tracker.capture.modules import CaptureLog, Group
from parity_tracker.capture.ops import suspended
from parity_tracker.capture.sides import BudgetSides
from parity_tracker.capture.snapshot import SnapshotStore, Snapshotter, VerifiedPairs
from parity_tracker.capture.store import SpillCounters, Spilled
from parity_tracker.compare.assemble import check_result
from parity_tracker.compare.convert import as_tensor
from parity_tracker.compare.core import Comparison
from parity_tracker.compare.pairing import (
    RELEASED,
    PairComparer,
    dump_plan,
    load,
    order_key,
    resolve,
)
from parity_tracker.compare.results import (
    CheckResult,
    DumpMode,
    TagResult,
    format_line,
    print_result,
)
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.errors import InputError
from parity_tracker.statuses import (  # noqa: F401  (NEUTRAL, PASSING: old import path)
    BUDGET,
    NEUTRAL,
    PASSING,
    RUN_MODES,
    WEIGHT_KINDS,
    is_failing,
)

__all__ = [
    "CheckResult",
    "DumpMode",
    "HookHandle",
    "TagResult",
    "TensorChecker",
    "format_line",
    "module_register_tensor_checker",
    "tensor_checker",
]

_ROLE = {True: "reference", False: "candidate"}
#: Default resident budget of the eager path's snapshots (bytes): 256 MiB. With the op store's
#: 512 MiB (``parity_tracker.ops.DEFAULT_MAX_RESIDENT_BYTES``) it leaves room under the 1 GiB
#: extra-memory target of a parity run (issue 5/9) for the comparison temporaries of one pair.
DEFAULT_EAGER_RESIDENT_BYTES = 256 << 20
#: Resident budget of the module snapshots in an op-level run (bytes): 8 MiB. There the op
#: store (``parity_tracker.ops.DEFAULT_MAX_RESIDENT_BYTES``, 16 MiB) holds the same
#: activations, so together they keep the run's extra memory flat in depth (issue 19, item 5).
OPS_RUN_RESIDENT_BYTES = 8 << 20


class TensorChecker(SpillCounters):
    """Collects tensors by tag from two (or more) implementations and compares them.

    Args:
        verbose: print one line per tag in ``check_*`` (the seed's printout).
        align: ``align(tag, reference, candidate) -> (reference, candidate) | None``, applied
            right before each comparison (e.g. slice a full recompute to a KV-cache step's
            last position); ``None`` keeps the pair.
        eager_mode: ``"equal"`` / ``"allclose"`` / ``"budget"`` to compare each pair as soon as
            both sides are captured (low memory: the candidate is never cloned and the
            reference's copy is released), or ``None`` to compare everything in ``check``.
        tolerances: per-tag overrides ``{glob: (rtol, atol)}`` for allclose, matched with
            ``fnmatch`` against the tag; the first matching glob wins, and an override beats
            the check's ``rtol``/``atol`` (``compare.tolerances.Tolerances``). Integer and bool
            tensors are always compared exactly. Raises ``InputError`` when a pair is
            incomplete or negative.
        rtol: default relative tolerance for the eager path (``None``: the comparison core's
            per-dtype default, from ``torch.testing.assert_close``).
        atol: default absolute tolerance for the eager path (as ``rtol``).
        dump_mode: the dump the eager path must keep tensors for (``check``'s ``dump_mode``
            can only dump what was kept). Ignored by the deferred path, which keeps all.
        max_resident_bytes: resident budget for snapshot storage, in bytes; the oldest
            snapshots past it are spilled to disk and read back memory-mapped when compared
            (0 spills every snapshot, ``math.inf`` never spills). Default (``None``):
            ``DEFAULT_EAGER_RESIDENT_BYTES`` (256 MiB) with ``eager_mode``, unbounded without.
        spill_dir: folder for spilled snapshots (a fresh temporary folder is made inside it
            and deleted by ``clear``); default: the system temporary folder.
        budget: the golden and twin sides of ``budget`` checks
            (:class:`~parity_tracker.capture.sides.BudgetSides`); required with
            ``eager_mode="budget"``, else set by :meth:`check_budget`.
        reduce_to: ``reduce(tag, step, tensor) -> value`` kept instead of each captured tensor
            (a twin's checker: :func:`parity_tracker.capture.sides.twin_reducer`); such a
            checker only feeds a budget and cannot ``check`` its own pairs.
        on_compared: ``on_compared(tag, step, reference, candidate, comparison)`` after every
            comparison of two tensors, eager or in ``check`` (``compare.pairing.PairComparer``);
            the tensors are the checker's and must not be written.

    Raises:
        InputError: ``eager_mode`` is not ``"equal"``, ``"allclose"``, ``"budget"`` or
            ``None``; ``"budget"`` without ``budget``; ``max_resident_bytes`` is negative.
    """

    def __init__(
        self,
        *,
        verbose: bool = True,
        align: Callable[[str, Any, Any], tuple[Any, Any] | None] | None = None,
        eager_mode: str | None = None,
        tolerances: dict[str, tuple[float, float]] | None = None,
        rtol: float | None = None,
        atol: float | None = None,
        dump_mode: DumpMode = DumpMode.NOT,
        max_resident_bytes: float | None = None,
        spill_dir: Any = None,
        budget: BudgetSides | None = None,
        reduce_to: Callable[[str, int, torch.Tensor], Any] | None = None,
        on_compared: Callable[[str, int, Any, Any, Comparison], None] | None = None,
    ) -> None:
        max_resident_bytes = _checked_init(eager_mode, budget, max_resident_bytes)
        self.budget, self.reduce_to = budget, reduce_to
        self._store = SnapshotStore(max_resident_bytes, spill_dir)
        self.verbose = verbose
        self.align = align
        self.eager_mode = eager_mode
        self.tolerances = dict(tolerances or {})
        self.rtol, self.atol = _fill_pair(rtol, atol)
        self._eager_tol = Tolerances(self.tolerances, rtol=self.rtol, atol=self.atol)
        self.dump_mode = DumpMode(dump_mode)
        self._hold = Holder(self)
        self._log = CaptureLog(self._hold.on_tensor)
        self._snap = Snapshotter()
        self._store.intact = self._snap.intact  # copy-on-write snapshots spill only intact
        self._pairs = PairComparer(align, owned=self._snap.owns, on_compared=on_compared)
        if budget is not None:
            budget.on_compared = on_compared
        #: Callables ``f(side, tag, tensor)`` told of every manual ``register_tensor`` (the op
        #: recorder forwards them into its op stream).
        self.manual_listeners: list[Callable[[int, str, torch.Tensor], None]] = []
        #: Run params a drive recorded (``StepRecorder.note``), merged into the run's settings.
        self.run_notes: dict[str, Any] = {}
        self._reset()

    # ------------------------------------------------------------------ state
    def _reset(self) -> None:
        self._log.reset()
        self._hold.reset()
        self._pairs.clear()
        self._snap.clear()
        self._store.clear()

    def clear(self) -> None:
        """Forget every registered tensor and result, ready for the next round (hooks stay)."""
        live = {h.side for h in self._log.handles}
        self._log.hooked = {s: names for s, names in self._log.hooked.items() if s in live}
        self._log.unhooked = {s: m for s, m in self._log.unhooked.items() if s in live}
        self._reset()

    # capture state, read by tests and by module_register_tensor_checker
    _groups = property(lambda self: self._log.groups)
    _handles = property(lambda self: self._log.handles)
    _hooked = property(lambda self: self._log.hooked)
    _stack = property(lambda self: self._log.stack)

    @property
    def max_resident_bytes(self) -> float:
        """The resident budget for snapshot storage, in bytes (``math.inf``: unbounded)."""
        return self._store.max_resident_bytes

    def borrow_spills(self, lender: Any) -> None:
        """Snapshots of buffers ``lender`` (``OpSession.lender``) holds reuse its spill files."""
        self._store.lender = lender
        self._snap.sealed_spill = lender.sealed_spill  # permuted outputs (w9lend)

    @property
    def step(self) -> int:
        """The current step; every capture carries it (set it before each step of a run)."""
        return self._log.step

    @step.setter
    def step(self, value: int) -> None:
        self._log.step = int(value)

    def mark_cache_hit(self, module: str, side: int | None = None) -> None:
        """Record that a cache skipped ``module`` (and its submodules) at the current step.

        Tags of that module missing on the skipped side at this step become ``skipped`` with
        ``cache_hit=True`` instead of ``missing_*``; from the first call on, every result
        carries ``cache_hit`` True/False (it is ``None`` while no cache is in play).

        Args:
            module: the module's display name (``model`` for the root).
            side: the side whose cache hit (``None``: the side whose forward is running, or
                any side outside a forward).
        """
        if side is None:
            side = self._log.active_side()
        self._log.cache_hits.add((module, self._log.step, side))

    def mark_not_observable(self, tag: str, reason: str, step: int | None = None) -> None:
        """Record that the candidate cannot expose ``tag``'s value (a compiled or foreign engine).

        If no candidate tensor arrives for ``tag`` at that step, the tag is ``skipped`` with
        ``reason`` as its message (not ``missing_candidate``): nothing was compared, and
        nothing passes (``parity_tracker.adapters``).

        Args:
            tag: the reference's tag, e.g. ``checker_encoder.mid_block.attentions.0``.
            reason: why the candidate cannot show it (shown in the row's message).
            step: the step (default: the current step).
        """
        log = self._log
        log.not_observable[(tag, log.step if step is None else int(step))] = reason

    # --------------------------------------------------------------- capture
    def register_tensor(
        self, tag: str, tensor: Any, *, side: int | None = None, step: int | None = None
    ) -> None:
        """Register one tensor under ``tag`` (seed API; kind ``manual``).

        Inside a hooked model's forward the tensor belongs to that model's side; elsewhere the
        first registration of a tag is the reference and later ones are candidates.

        Args:
            tag: the tag, e.g. ``"my_module.x1"``.
            tensor: a torch tensor of any dtype and device, a numpy array, or an object
                exposing ``__dlpack__`` or ``__array__``. It is copied (or compared at once on
                the eager path), so later in-place changes do not matter.
            side: force the side (0 reference, 1.. candidates).
            step: force the step (default: ``self.step``).

        Raises:
            InputError: ``tensor`` is not tensor-like.
        """
        value = as_tensor(tensor, tag)
        log = self._log
        step = log.step if step is None else int(step)
        if side is not None:
            log.explicit_manual = True
            side = int(side)
        else:
            active = log.active_side()
            group = log.groups.get((tag, step))
            side = active if active is not None else (len(group.captures) if group else 0)
        module = log.active_module(side)
        with suspended():
            group = log.capture(
                tag,
                value,
                side=side,
                kind="manual",
                module=module,
                slot="manual",
                call_index=0,
                step=step,
            )
            log.commit([group])
            for listener in self.manual_listeners:
                listener(side, tag, value)

    # ---------------------------------------------------------------- check
    def check_equal(self, dump_mode: DumpMode = DumpMode.NOT, dump_path: Any = None) -> CheckResult:
        """Compare every tag exactly (``torch.equal`` semantics; seed section 3.1).

        Prints ``TensorChecker: 2 tensors equal in checker_conv_in`` (``not equal``) per tag.

        Args:
            dump_mode: which tensors to write as ``.npy`` (see :class:`DumpMode`).
            dump_path: the dump folder (required unless ``dump_mode`` is ``NOT``).

        Returns:
            The :class:`CheckResult`.
        """
        return self.check("equal", dump_mode=dump_mode, dump_path=dump_path)

    def check_allclose(
        self,
        rtol: float | None = None,
        atol: float | None = None,
        dump_mode: DumpMode = DumpMode.NOT,
        dump_path: Any = None,
    ) -> CheckResult:
        """Compare every tag with ``|c - r| <= atol + rtol * |r|`` (``torch.allclose``).

        ``None`` tolerances take the comparison core's per-dtype defaults (those of
        ``torch.testing.assert_close``). Prints ``close`` / ``not close`` per tag.
        """
        return self.check(
            "allclose", rtol=rtol, atol=atol, dump_mode=dump_mode, dump_path=dump_path
        )

    def check_budget(
        self,
        golden: TensorChecker,
        twin: TensorChecker | None = None,
        *,
        k: float | None = None,
        budgets: dict[str, float] | None = None,
        dump_mode: DumpMode = DumpMode.NOT,
        dump_path: Any = None,
    ) -> CheckResult:
        """Compare every tag by error budget (issue 15; :mod:`parity_tracker.compare.budget`).

        The golden and the twin are captured by two more checkers hooked on models with the
        reference's module names: ``golden_copy(torch_model)`` run under ``golden_mode()`` on
        float64 inputs, and ``make_twin(torch_model, dtype)`` on inputs cast to ``dtype``
        (``parity_tracker.capture.golden`` / ``.twin``; README "Error budgets" shows the
        calls). Statuses: ``equal`` (bitwise the reference), ``close`` (``error_ratio ≤ k``),
        ``mismatch``; columns ``golden_max_abs_err``, ``twin_max_abs_err``, ``error_ratio``.

        Args:
            golden: the checker holding the float64 golden's captures.
            twin: the twin's checker; ``None``: the reference is the twin (a candidate of the
                reference's dtype).
            k: the factor of tags without an override (default 2, FlashAttention's tests).
            budgets: per-tag ``{glob: k}`` (first matching glob wins).
            dump_mode: which tensors to dump (see :class:`DumpMode`).
            dump_path: the dump folder.

        Raises:
            InputError: a ``k`` not ≥ 1; an eager checker of another mode.
        """
        from parity_tracker.compare.budget import DEFAULT_K, Budgets

        table = Budgets(budgets, k=DEFAULT_K if k is None else k)
        twin_log = None if twin is None else twin._log
        self.budget = BudgetSides(golden._log, twin_log, table, self.align)
        return self.check(BUDGET, dump_mode=dump_mode, dump_path=dump_path)

    def check(
        self,
        mode: str,
        *,
        rtol: float | None = None,
        atol: float | None = None,
        dump_mode: DumpMode = DumpMode.NOT,
        dump_path: Any = None,
        verbose: bool | None = None,
    ) -> CheckResult:
        """Compare every registered tag and assemble the results (the general form).

        Args:
            mode: ``"equal"``, ``"allclose"`` or ``"budget"`` (needs the checker's ``budget``;
                see :meth:`check_budget`).
            rtol: relative tolerance for allclose. Both ``None``: the per-dtype defaults of
                ``torch.testing.assert_close``; only one given: the other takes
                ``torch.allclose``'s default (rtol 1e-5, atol 1e-8).
            atol: absolute tolerance for allclose (see ``rtol``).
            dump_mode: which tensors to dump (see :class:`DumpMode`).
            dump_path: the dump folder; each check writes into a new ``check-NNNN`` subfolder,
                so a second check never overwrites the first one's files.
            verbose: print the per-tag lines (default: the checker's ``verbose``).

        Returns:
            The :class:`CheckResult`.

        Raises:
            InputError: unknown ``mode``; ``dump_path`` missing for a dump; on the eager path, a
                ``mode`` or tolerance different from the one the pairs were compared with.
        """
        mode, tol = _check_args(self, mode, rtol, atol, dump_mode, dump_path)
        out = _assemble(self, mode, _resolve_all(self, mode, tol), dump_mode, dump_path)
        if self.verbose if verbose is None else verbose:
            print_result(out)
        return out


def _checked_init(eager_mode: str | None, budget: Any, max_resident_bytes: float | None) -> float:
    """Validate the constructor's mode and budget; the resident byte budget to use."""
    if eager_mode is not None and eager_mode not in RUN_MODES:
        raise InputError(
            f"eager_mode must be one of {', '.join(RUN_MODES)} or None, got {eager_mode!r}"
        )
    if eager_mode == BUDGET and budget is None:
        raise InputError("eager_mode='budget' needs budget=BudgetSides(golden_log, ...)")
    if max_resident_bytes is None:
        max_resident_bytes = DEFAULT_EAGER_RESIDENT_BYTES if eager_mode else math.inf
    if not max_resident_bytes >= 0:
        raise InputError(
            f"max_resident_bytes={max_resident_bytes}: use a byte count >= 0 (math.inf for "
            "no bound)"
        )
    return max_resident_bytes


def _assemble(self: TensorChecker, mode: str, resolved, dump_mode, dump_path) -> CheckResult:
    """Order the resolved groups, write the planned dumps and build the :class:`CheckResult`."""
    ordered = sorted(resolved, key=lambda x: order_key(x[0]))
    plan = dump_plan(DumpMode(dump_mode), ordered)
    paths, dump_dir = _write_dumps(self, plan, dump_path) if plan else ({}, None)
    return check_result(self._log, mode, ordered, paths, dump_dir)


def _check_args(self: TensorChecker, mode, rtol, atol, dump_mode, dump_path):
    """Validate a check's mode, dump and tolerances; the mode and ``Tolerances`` to use."""
    if mode not in RUN_MODES:
        raise InputError(f"check mode must be one of {', '.join(RUN_MODES)}, got {mode!r}")
    if mode == BUDGET and self.budget is None:
        raise InputError("check('budget') needs the golden side: use check_budget(golden)")
    if self.reduce_to is not None:
        raise InputError("this checker reduces its tensors (reduce_to): it only feeds a budget")
    if DumpMode(dump_mode) is not DumpMode.NOT and dump_path is None:
        raise InputError(f"dump_mode={DumpMode(dump_mode).name} needs a dump_path folder")
    if self.eager_mode is not None:
        if mode != self.eager_mode:
            raise InputError(
                f"this TensorChecker compared pairs eagerly in {self.eager_mode!r} mode; "
                f"check({mode!r}) cannot re-compare released tensors. Use "
                f"check({self.eager_mode!r}) or eager_mode=None"
            )
        for name, given, used in (("rtol", rtol, self.rtol), ("atol", atol, self.atol)):
            if given is not None and given != used:
                raise InputError(
                    f"{name}={given} differs from the eager path's {name}={used}; pass it "
                    "to TensorChecker(...) instead"
                )
        return mode, self._eager_tol
    rtol, atol = _fill_pair(rtol, atol)
    return mode, Tolerances(self.tolerances, rtol=rtol, atol=atol)


def _resolve_all(self: TensorChecker, mode, tol) -> list[tuple[Group, Comparison, int]]:
    """Every group with a value, resolved to its comparison (eager verdicts reused)."""
    self._hold.settle()  # small eager pairs compared in bulk; held bytes made tensors again
    ref_side = self._log.reference_side()
    out = []
    verified = VerifiedPairs(self._pairs, self._snap)  # copy-on-write snapshots checked
    for g in self._log.groups.values():
        caps = g.captures  # the first capture asked alone: no generator for most groups
        if g.kind == "param":  # pinned weights compared as themselves (Snapshotter.unpin)
            for c in caps:
                c.value = self._snap.unpin(c.value)
        if (not caps or caps[0].value is None) and all(c.value is None for c in caps):
            continue  # None on every side: no value, nothing to compare or to report
        pairs = (
            VerifiedPairs(self.budget.for_step(g.step), self._snap) if mode == BUDGET else verified
        )
        out.append((g, resolve(self._log, g, mode, tol, ref_side, pairs), len(g.captures)))
    return out


def _write_dumps(checker: TensorChecker, plan, dump_path) -> tuple[dict[int, tuple[str, ...]], str]:
    """Write the planned dumps of a check (``DumpWriter``); warn about tags already released."""
    from parity_tracker.files.dump import DumpWriter

    writer = DumpWriter(dump_path)
    paths: dict[int, tuple[str, ...]] = {}
    ref_side = checker._log.reference_side()
    for g in plan:
        written = []
        for cap in g.captures:
            if not isinstance(cap.value, (torch.Tensor, Spilled)):
                continue
            role = _ROLE[cap.side == ref_side]
            written.append(
                writer.write(g.tag, load(cap.value), side=cap.side, role=role, step=g.step)
            )
        paths[id(g)] = tuple(p for p in written if p is not None)
    writer.close()
    released = [g.tag for g in plan if any(c.value is RELEASED for c in g.captures)]
    if released:
        warnings.warn(
            f"TensorChecker: the eager path already released the tensors of "
            f"{len(released)} tag(s) this dump asked for (first: {released[0]}); pass "
            "dump_mode=... to TensorChecker(...) so it keeps them",
            UserWarning,
            stacklevel=5,
        )
    return paths, writer.subdir


def _fill_pair(rtol: float | None, atol: float | None) -> tuple[float | None, float | None]:
    """Complete a half-given pair with ``torch.allclose``'s defaults (rtol 1e-5, atol 1e-8).

    The seed's ``check_allclose(rtol, atol)`` mirrors ``torch.allclose``, where each has a
    default; the comparison core wants both or neither.
    """
    if (rtol is None) == (atol is None):
        return rtol, atol
    return (1e-5 if rtol is None else rtol), (1e-8 if atol is None else atol)


def module_register_tensor_checker(
    model: torch.nn.Module, checker: TensorChecker | None = None, *, side: int | None = None
) -> HookHandle:
    """Hook every submodule of ``model`` so a forward registers its tensors in ``checker``.

    Registers, per module call, the output(s), the positional and keyword inputs (captured
    before the forward, so an in-place op inside it cannot rewrite them) and, on the first
    call, the module's own parameters and buffers (weights of modules that are never called
    are registered at the end of the root's forward). Tags follow design.md, "Public names".
    Pure containers (``ModuleList``/``ModuleDict``) have no forward and are not hooked.

    Args:
        model: the model; its ``named_modules()`` names must match the other side's.
        checker: the checker (default: the shared ``tensor_checker``).
        side: 0 for the reference, 1 for the candidate; by default the lowest side not held
            by another live handle on this checker (the first model hooked is the reference).

    Returns:
        A :class:`HookHandle`; ``remove()`` it or use it as a context manager.

    Raises:
        InputError: not an ``nn.Module``, TorchScript, or sharing a module with another side.
    """
    if not isinstance(model, torch.nn.Module):
        raise InputError(
            f"module_register_tensor_checker needs a torch.nn.Module, got {type(model).__name__}"
            "; register a foreign engine's tensors with tensor_checker.register_tensor instead"
        )
    if isinstance(model, torch.jit.ScriptModule):
        raise InputError(
            f"{type(model).__name__} is a TorchScript module, which takes no Python hooks; hook "
            "the eager module before scripting, or register its outputs with "
            "tensor_checker.register_tensor"
        )
    log = (tensor_checker if checker is None else checker)._log
    handle = HookHandle(log, log.claim_side(side), model)
    handle.explicit = side is not None
    try:
        install(model, log, handle)  # refuses a module object hooked for two sides
    except BaseException:
        handle.remove()
        raise
    log.hooked.setdefault(handle.side, {}).update(dict.fromkeys(handle.module_names))
    log.unhooked.setdefault(handle.side, {}).update(handle.unhooked)
    log.handles.append(handle)
    return handle


#: The shared instance of the seed API.
tensor_checker = TensorChecker()
