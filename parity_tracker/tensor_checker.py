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
  the second side's tensor of a tag arrives it is compared at once, without cloning it, and
  the reference's snapshot is released unless a planned dump needs it.

The memory bound: on the eager path the reference runs first, so its snapshots wait for the
candidate's. They are kept in a store that holds at most ``max_resident_bytes`` of snapshot
storage resident (each snapshot counted once, however many captures share it; parameters and
buffers are referenced, not copied, and not counted). Past the budget the oldest snapshots are
written to ``spill_dir`` (``parity_tracker.spill``, shared with the op store) and read back
memory-mapped when their pair is compared or dumped. After every capture::

    resident_bytes <= max_resident_bytes        (whatever the model depth)

Spilling changes where a snapshot lives, never its value: results are identical.
"""

from __future__ import annotations

import enum
import itertools
import math
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from parity_tracker.capture import (
    NonTensor,
    Snapshotter,
    as_tensor,
    call_base,
    input_leaves,
    module_display_name,
    output_leaves,
    own_tensors,
    param_tag,
    root_name,
    tensor_version,
)
from parity_tracker.compare import PASSING, Comparison, compare_tensors
from parity_tracker.errors import InputError
from parity_tracker.spill import SpillCounters, SpillDir, Spilled
from parity_tracker.tolerances import Tolerances

try:  # the op recorder must not record the checker's own copies and comparisons
    from parity_tracker.ops import suspended
except ImportError:  # pragma: no cover - ops is optional for the checker
    from contextlib import nullcontext as suspended

__all__ = [
    "CheckResult",
    "DumpMode",
    "HookHandle",
    "TagResult",
    "TensorChecker",
    "module_register_tensor_checker",
    "tensor_checker",
]

MODES = ("equal", "allclose")
WEIGHT_KINDS = frozenset({"param", "buffer"})
#: Statuses that are neither passing nor a divergence: nothing could be compared.
NEUTRAL = frozenset({"skipped"})
_ROLE = {True: "reference", False: "candidate"}
#: Default resident budget of the eager path's snapshots (bytes): 256 MiB. With the op store's
#: 512 MiB (``parity_tracker.ops.DEFAULT_MAX_RESIDENT_BYTES``) it leaves room under the 1 GiB
#: extra-memory target of a parity run (issue 5/9) for the comparison temporaries of one pair.
DEFAULT_EAGER_RESIDENT_BYTES = 256 << 20


class DumpMode(enum.Enum):
    """Which tensors ``check_*`` writes as ``.npy`` files (seed document, section 3.3).

    Attributes:
        NOT: write nothing (the default).
        ALL: every tensor of every tag.
        NOT_EQUAL: the tensors of every tag that does not pass (not equal / not close,
            missing, shape mismatch, error).
        FIRST_NOT_EQUAL: the tensors of the first failing tag in execution order (the first
            divergence; the first failing weight when only weights fail).
    """

    NOT = "not"
    ALL = "all"
    NOT_EQUAL = "not_equal"
    FIRST_NOT_EQUAL = "first_not_equal"


@dataclass(frozen=True)
class TagResult:
    """The verdict for one compared tag at one step.

    Attributes:
        tag: e.g. ``checker_conv_in`` (design.md, "Public names").
        module: the module's display name (``model`` for the root; no ``@k``), or ``None`` for
            a manual registration made outside any hooked forward.
        kind: ``param`` | ``buffer`` | ``input`` | ``output`` | ``manual`` (``op`` from the
            op recorder).
        slot: where in the module the tensor sits: ``output``, ``output.{path}``,
            ``input.{i}`` / ``input.{name}``, the local parameter/buffer name, or ``manual``.
        call_index: k for the k-th call of the module in the step (0 for the first).
        exec_order: position of the reference's capture in its side's execution order (a
            counter over the whole run, so it also orders steps); -1 when nothing was captured.
        step: the step of a multi-step run (0 for one forward; weights are always step 0).
        cache_hit: whether a cache skipped the module at this step; ``None`` when no cache is
            in play (``mark_cache_hit`` never called).
        comparison: the comparison record (for groups of more than two tensors, the first
            non-passing candidate's, else the first candidate's).
        dump_paths: dumped ``.npy`` files, relative to the check's ``dump_path``.
        n_tensors: how many tensors were registered under the tag (the printout's count).
    """

    tag: str
    module: str | None
    kind: str
    slot: str
    call_index: int
    exec_order: int
    step: int
    cache_hit: bool | None
    comparison: Comparison
    dump_paths: tuple[str, ...] = ()
    n_tensors: int = 2

    @property
    def status(self) -> str:
        """The comparison's status."""
        return self.comparison.status

    @property
    def passed(self) -> bool:
        """True for ``equal`` / ``close``."""
        return self.comparison.status in PASSING

    @property
    def failed(self) -> bool:
        """True for a divergence: not passing and not ``skipped``."""
        return self.comparison.status not in PASSING and self.comparison.status not in NEUTRAL

    def to_row(self) -> dict[str, Any]:
        """One ``modules`` table row: exactly ``tables.MODULES_SCHEMA``'s column names."""
        from parity_tracker.tables import MODULES_SCHEMA

        merged = self.comparison.to_dict()
        merged.update(
            tag=self.tag,
            module=self.module,
            kind=self.kind,
            slot=self.slot,
            call_index=self.call_index,
            exec_order=self.exec_order if self.exec_order >= 0 else None,
            step=self.step,
            cache_hit=self.cache_hit,
            dump_path=self.dump_paths[0] if self.dump_paths else None,
        )
        return {name: merged.get(name) for name in MODULES_SCHEMA.names}


@dataclass
class CheckResult:
    """What ``check_*`` returns.

    Attributes:
        results: every compared tag in first-registration order, weights included.
        weights: the parameter/buffer pre-flight, reported apart so that a weight-loading
            error is never blamed on a module.
        first_divergence: the first failing non-weight tag in execution order (``exec_order``,
            then ``step``), or ``None``.
        passed: no tag failed (``skipped`` tags, e.g. never-called modules, do not fail).
        mode: ``"equal"`` or ``"allclose"``.
        dump_dir: the per-check dump folder relative to ``dump_path`` (``None`` if no dump).
    """

    results: list[TagResult]
    weights: list[TagResult]
    first_divergence: TagResult | None
    passed: bool
    mode: str = "equal"
    dump_dir: str | None = None

    def to_rows(self) -> list[dict[str, Any]]:
        """``modules`` table rows, one per result."""
        return [r.to_row() for r in self.results]

    @property
    def failing(self) -> list[TagResult]:
        """The failing results, in first-registration order."""
        return [r for r in self.results if r.failed]

    def get(self, tag: str, step: int = 0) -> TagResult | None:
        """The result for ``tag`` at ``step``, or ``None``."""
        return next((r for r in self.results if r.tag == tag and r.step == step), None)

    def __getitem__(self, tag: str) -> TagResult:
        found = self.get(tag)
        if found is None:
            raise KeyError(tag)
        return found


class _Released:
    """Marker for a tensor the eager path compared and let go."""

    def __repr__(self) -> str:
        return "<released>"


_RELEASED = _Released()


@dataclass
class _Capture:
    side: int
    value: Any  # torch.Tensor | None | NonTensor | _RELEASED
    exec_order: int
    is_tensor: bool
    meta: tuple[tuple[int, ...], str, str] | None = None  # shape, dtype, device


@dataclass
class _Group:
    tag: str
    step: int
    kind: str
    module: str | None
    slot: str
    call_index: int
    created: int
    order: int | None = None
    captures: list[_Capture] = field(default_factory=list)
    ref_index: int | None = None  # set by the eager path
    pairs: dict[int, Comparison] = field(default_factory=dict)  # eager: cand index -> result


def _meta(t: torch.Tensor) -> tuple[tuple[int, ...], str, str]:
    return tuple(t.shape), str(t.dtype).removeprefix("torch."), str(t.device)


def _leaf_desc(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, NonTensor):
        return f"a non-tensor {value.type_name}"
    if isinstance(value, Spilled):
        return f"a tensor of shape {value.size}"
    return f"a tensor of shape {tuple(value.shape)}"


def _load(value: Any) -> Any:
    """A captured value ready to compare: spilled snapshots read back onto their device."""
    return value.load(to_device=True) if isinstance(value, Spilled) else value


class _SnapshotStore:
    """Keeps snapshots within ``max_resident_bytes``, spilling the oldest to ``spill_dir``.

    Each snapshot is tracked by a weak reference: it stops counting as soon as no capture
    holds it (the eager path releasing a pair), and a spilled snapshot's file is deleted once
    no capture holds its ``Spilled`` record.
    """

    def __init__(self, max_resident_bytes: float, spill_dir: Any) -> None:
        self.max_resident_bytes = max_resident_bytes
        self._dir = SpillDir(spill_dir, prefix="checker-spill-")
        self._ids = itertools.count()
        self._resident: OrderedDict[int, tuple[weakref.ref, int, list[_Capture]]] = OrderedDict()
        self.clear()

    def clear(self) -> None:
        """Forget every snapshot and delete the spill folder."""
        self._resident = OrderedDict()
        self._dir.close()
        self.resident_bytes = self.peak_resident_bytes = 0
        self.spilled_bytes = self.spilled_count = 0

    def admit(self, copy: torch.Tensor, cap: _Capture) -> None:
        """Count ``copy`` (held by ``cap``) and spill the oldest snapshots past the budget."""
        key = id(copy)
        entry = self._resident.get(key)
        if entry is not None and entry[0]() is copy:
            entry[2].append(cap)  # a snapshot shared with an earlier capture counts once
            return
        nbytes = copy.untyped_storage().nbytes()
        self._resident[key] = (weakref.ref(copy, self._gone(key)), nbytes, [cap])
        self.resident_bytes += nbytes
        while self.resident_bytes > self.max_resident_bytes and self._resident:
            self._spill(*self._resident.popitem(last=False)[1])
        self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)

    def _gone(self, key: int) -> Callable[[weakref.ref], None]:
        def callback(ref: weakref.ref) -> None:
            entry = self._resident.get(key)
            if entry is not None and entry[0] is ref:
                del self._resident[key]
                self.resident_bytes -= entry[1]

        return callback

    def _spill(self, ref: weakref.ref, nbytes: int, caps: list[_Capture]) -> None:
        self.resident_bytes -= nbytes
        copy = ref()
        if copy is None:
            return
        spilled = self._dir.write(copy, f"{next(self._ids)}.bin")
        weakref.finalize(spilled, spilled.path.unlink, True)
        for c in caps:
            if c.value is copy:
                c.value = spilled
        self.spilled_bytes += nbytes
        self.spilled_count += 1


class TensorChecker(SpillCounters):
    """Collects tensors by tag from two (or more) implementations and compares them.

    Args:
        verbose: print one line per tag in ``check_*`` (the seed's printout).
        align: ``align(tag, reference, candidate) -> (reference, candidate) | None``, applied
            right before each comparison (e.g. slice a full recompute to a KV-cache step's
            last position); ``None`` keeps the pair.
        eager_mode: ``"equal"`` / ``"allclose"`` to compare each pair as soon as both sides
            are captured (low memory: the candidate is never cloned and the reference's copy is
            released), or ``None`` to compare everything in ``check``.
        tolerances: per-tag overrides ``{glob: (rtol, atol)}`` for allclose, matched with
            ``fnmatch`` against the tag; the first matching glob wins, and an override beats
            the check's ``rtol``/``atol`` (``parity_tracker.tolerances.Tolerances``). Integer
            and bool tensors are always compared exactly. Raises ``InputError`` when a pair is
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

    Raises:
        InputError: ``eager_mode`` is not ``"equal"``, ``"allclose"`` or ``None``;
            ``max_resident_bytes`` is negative.
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
    ) -> None:
        if eager_mode is not None and eager_mode not in MODES:
            raise InputError(f"eager_mode must be 'equal', 'allclose' or None, got {eager_mode!r}")
        if max_resident_bytes is None:
            max_resident_bytes = DEFAULT_EAGER_RESIDENT_BYTES if eager_mode else math.inf
        if not max_resident_bytes >= 0:
            raise InputError(
                f"max_resident_bytes={max_resident_bytes}: use a byte count >= 0 (math.inf for "
                "no bound)"
            )
        self._store = _SnapshotStore(max_resident_bytes, spill_dir)
        self.verbose = verbose
        self.align = align
        self.eager_mode = eager_mode
        self.tolerances = dict(tolerances or {})
        self.rtol, self.atol = _fill_pair(rtol, atol)
        self._eager_tol = Tolerances(self.tolerances, rtol=self.rtol, atol=self.atol)
        self.dump_mode = DumpMode(dump_mode)
        self._handles: list[HookHandle] = []
        self._hooked: dict[int, set[str]] = {}
        #: Callables ``f(side, tag, tensor)`` told of every manual ``register_tensor`` (the op
        #: recorder forwards them into its op stream).
        self.manual_listeners: list[Callable[[int, str, torch.Tensor], None]] = []
        #: Run params a drive recorded (``StepRecorder.note``), merged into the run's settings.
        self.run_notes: dict[str, Any] = {}
        self._snap = Snapshotter()
        self._reset()

    # ------------------------------------------------------------------ state
    def _reset(self) -> None:
        self.step = 0
        self._groups: dict[tuple[str, int], _Group] = {}
        self._created = 0
        self._ordered = 0
        self._exec: dict[int, int] = {}
        self._calls: dict[tuple[int, int, str], int] = {}
        self._called: dict[int, set[str]] = {}
        self._ran: set[int] = set()
        self._sides: set[int] = set()
        self._explicit_manual = False
        self._weights_done: set[tuple[int, str]] = set()
        self._frames: dict[tuple[int, int], list[tuple[int, list[_Group]]]] = {}
        self._stack: list[tuple[int, str]] = []  # (side, module) of the calls in progress
        self._cache_hits: set[tuple[str, int, int | None]] = set()
        self._not_observable: dict[tuple[str, int], str] = {}
        self._eager_first: dict[bool, _Group] = {}
        self._pair_cache: dict[tuple, tuple] = {}
        self._snap.clear()
        self._store.clear()

    def clear(self) -> None:
        """Forget every registered tensor and result, ready for the next round (hooks stay)."""
        live = {h.side for h in self._handles}
        self._hooked = {s: names for s, names in self._hooked.items() if s in live}
        self._reset()

    @property
    def max_resident_bytes(self) -> float:
        """The resident budget for snapshot storage, in bytes (``math.inf``: unbounded)."""
        return self._store.max_resident_bytes

    @property
    def step(self) -> int:
        """The current step; every capture carries it (set it before each step of a run)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = int(value)

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
        if side is None and self._stack:
            side = self._stack[-1][0]
        self._cache_hits.add((module, self._step, side))

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
        self._not_observable[(tag, self._step if step is None else int(step))] = reason

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
        step = self._step if step is None else int(step)
        if side is not None:
            self._explicit_manual = True
            side = int(side)
        else:
            active = self._stack[-1][0] if self._stack else None
            group = self._groups.get((tag, step))
            side = active if active is not None else (len(group.captures) if group else 0)
        module = next((m for s, m in reversed(self._stack) if s == side), None)
        with suspended():
            group = self._capture(
                tag,
                value,
                side=side,
                kind="manual",
                module=module,
                slot="manual",
                call_index=0,
                step=step,
            )
            self._commit([group])
            for listener in self.manual_listeners:
                listener(side, tag, value)

    def _capture(
        self,
        tag: str,
        value: Any,
        *,
        side: int,
        kind: str,
        module: str | None,
        slot: str,
        call_index: int,
        step: int | None = None,
    ) -> _Group:
        step = self._step if step is None else step
        group = self._groups.get((tag, step))
        if group is None:
            group = _Group(tag, step, kind, module, slot, call_index, self._created)
            self._created += 1
            self._groups[(tag, step)] = group
        order = self._exec.get(side, 0)
        self._exec[side] = order + 1
        self._sides.add(side)
        if value is not None and not isinstance(value, NonTensor):
            value = as_tensor(value, tag)
        self._add(group, side, value, order, alias=kind == "param")
        return group

    def _commit(self, groups: Iterable[_Group]) -> None:
        for g in groups:
            if g.order is None:
                g.order = self._ordered
                self._ordered += 1

    def _add(self, g: _Group, side: int, value: Any, order: int, alias: bool) -> None:
        is_tensor = isinstance(value, torch.Tensor)
        cap = _Capture(side, None, order, is_tensor, _meta(value) if is_tensor else None)
        g.captures.append(cap)
        if not is_tensor:
            cap.value = value
            return
        ref_i = self._eager_reference(g, side)
        if ref_i is None:
            self._keep(cap, value, alias)
            return
        self._eager_compare(g, ref_i, len(g.captures) - 1, value, alias)

    def _keep(self, cap: _Capture, value: torch.Tensor, alias: bool) -> None:
        """Hold ``value`` in ``cap``: parameters by reference, the rest as a counted snapshot."""
        if alias:
            cap.value = value.detach()
            return
        cap.value = copy = self._snap.take(value)
        self._store.admit(copy, cap)

    # ---------------------------------------------------------------- eager
    def _eager_reference(self, g: _Group, side: int) -> int | None:
        """Index of the capture the new one is compared against now, or None to hold it."""
        if self.eager_mode is None:
            return None
        i = g.ref_index if g.ref_index is not None else 0
        if len(g.captures) < 2:
            return None
        held = g.captures[i]
        if held.side == side or not isinstance(held.value, (torch.Tensor, Spilled)):
            return None
        return i

    def _eager_compare(self, g: _Group, held_i: int, new_i: int, value: Any, alias: bool) -> None:
        held = g.captures[held_i]
        new = g.captures[new_i]
        new_is_ref = new.side < held.side
        ref_i, cand_i = (new_i, held_i) if new_is_ref else (held_i, new_i)
        held_value = _load(held.value)
        ref, cand = (value, held_value) if new_is_ref else (held_value, value)
        comp = self._compare_pair(g, ref, cand, self.eager_mode, self._eager_tol)
        g.ref_index = ref_i
        g.pairs[cand_i] = comp
        if self._eager_keep(g, comp):
            self._keep(new, value, alias)
        else:
            new.value = held.value = _RELEASED

    def _eager_keep(self, g: _Group, comp: Comparison) -> bool:
        """Whether the planned dump needs this group's tensors after an eager comparison."""
        mode = self.dump_mode
        failed = comp.status not in PASSING and comp.status not in NEUTRAL
        if mode is DumpMode.ALL:
            return True
        if mode is DumpMode.NOT_EQUAL:
            return failed
        if mode is DumpMode.FIRST_NOT_EQUAL and failed:
            weight = g.kind in WEIGHT_KINDS
            best = self._eager_first.get(weight)
            key = (g.captures[g.ref_index].exec_order, g.step)
            if best is not None and (best.captures[best.ref_index].exec_order, best.step) <= key:
                return False
            if best is not None:
                for c in best.captures:
                    if c.is_tensor:
                        c.value = _RELEASED
            self._eager_first[weight] = g
            return True
        return False

    # ------------------------------------------------------------- compare
    def _compare_pair(
        self, g: _Group, ref: Any, cand: Any, mode: str, tol: Tolerances
    ) -> Comparison:
        if not isinstance(ref, torch.Tensor) or not isinstance(cand, torch.Tensor):
            return Comparison(
                status="shape_mismatch",
                mode=mode,
                message=(
                    f"structure differs at {g.tag}: the reference has {_leaf_desc(ref)}, "
                    f"the candidate has {_leaf_desc(cand)}"
                ),
            )
        key = self._pair_key(g, ref, cand, mode, tol)
        hit = self._pair_cache.get(key) if key is not None else None
        if hit is not None and hit[0]() is ref and hit[1]() is cand and hit[2] == key[-1]:
            return hit[3]
        try:
            if self.align is not None:
                aligned = self.align(g.tag, ref, cand)
                if aligned is not None:
                    ref, cand = aligned
            comp = compare_tensors(ref, cand, mode=mode, tag=g.tag, tolerances=tol)
        except Exception as exc:  # a pair that cannot be compared never aborts the check
            return Comparison(
                status="error", mode=mode, message=f"{g.tag}: {type(exc).__name__}: {exc}"
            )
        if key is not None:
            self._pair_cache[key] = (weakref.ref(ref), weakref.ref(cand), key[-1], comp)
        return comp

    def _pair_key(self, g: _Group, ref: torch.Tensor, cand: torch.Tensor, mode, tol):
        """Cache key of a pair already compared (a module's input is the last one's output).

        Reused only for the same two objects, unchanged since (version counters; inference
        tensors have none and are never reused), the same mode and the same tolerance
        override for the tag, and no ``align`` (which may depend on the tag).
        """
        if self.align is not None:
            return None
        versions = (tensor_version(ref), tensor_version(cand))
        if None in versions:
            return None
        # tolerance VALUES, never id(tol): a freed Tolerances' id is reused by the next check
        limits = (tol.default, tol.match(g.tag)) if mode == "allclose" else None
        return (id(ref), id(cand), mode, limits, versions)

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
            mode: ``"equal"`` or ``"allclose"``.
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
        mode, tol = self._check_args(mode, rtol, atol, dump_mode, dump_path)
        resolved = self._resolve_all(mode, tol)
        ordered = sorted(resolved, key=lambda x: _order_key(x[0]))
        plan = _dump_plan(DumpMode(dump_mode), ordered)
        paths, dump_dir = self._write_dumps(plan, dump_path) if plan else ({}, None)
        results = [self._tag_result(g, comp, n, paths.get(id(g), ())) for g, comp, n in ordered]
        results += self._never_called(mode)
        weights = [r for r in results if r.kind in WEIGHT_KINDS]
        first = _first_divergence(r for r in results if r.kind not in WEIGHT_KINDS)
        out = CheckResult(
            results=results,
            weights=weights,
            first_divergence=first,
            passed=not any(r.failed for r in results),
            mode=mode,
            dump_dir=dump_dir,
        )
        if self.verbose if verbose is None else verbose:
            _print_result(out)
        return out

    def _check_args(self, mode, rtol, atol, dump_mode, dump_path):
        if mode not in MODES:
            raise InputError(f"check mode must be 'equal' or 'allclose', got {mode!r}")
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

    def _resolve_all(self, mode, tol) -> list[tuple[_Group, Comparison, int]]:
        ref_side = self._reference_side()
        out = []
        for g in self._groups.values():
            if not any(c.is_tensor for c in g.captures):
                continue  # None / non-tensor leaves on every side: nothing to compare
            out.append((g, self._resolve(g, mode, tol, ref_side), len(g.captures)))
        return out

    def _resolve(self, g: _Group, mode, tol, ref_side: int) -> Comparison:
        sides = {c.side for c in g.captures}
        if len(sides) == 1:
            return self._missing(g, mode, next(iter(sides)), ref_side)
        ref_i = g.ref_index
        if ref_i is None:
            low = min(sides)
            ref_i = next(i for i, c in enumerate(g.captures) if c.side == low)
        ref = g.captures[ref_i]
        comps = []
        for i, cap in enumerate(g.captures):
            if i == ref_i:
                continue
            comp = g.pairs.get(i)
            if comp is None:
                comp = self._deferred_pair(g, ref, cap, mode, tol)
            comps.append(comp)
        return next((c for c in comps if c.status not in PASSING), comps[0])

    def _deferred_pair(self, g, ref: _Capture, cap: _Capture, mode, tol) -> Comparison:
        if ref.value is _RELEASED or cap.value is _RELEASED:
            return Comparison(
                status="error",
                mode=mode,
                message=(
                    f"{g.tag}: the eager path released the reference after its first "
                    "candidate; groups of more than two tensors need eager_mode=None"
                ),
            )
        return self._compare_pair(g, _load(ref.value), _load(cap.value), mode, tol)

    def _missing(self, g: _Group, mode: str, present: int, ref_side: int) -> Comparison:
        absent = "candidate" if present == ref_side else "reference"
        cap = next(c for c in g.captures if c.is_tensor)
        shape, dtype, device = cap.meta or (None, None, None)
        side_fields = (
            dict(ref_shape=shape, ref_dtype=dtype, ref_device=device)
            if absent == "candidate"
            else dict(cand_shape=shape, cand_dtype=dtype, cand_device=device)
        )
        numel = None if shape is None else math.prod(shape)
        absent_sides = {ref_side} if absent == "reference" else (self._sides - {present}) or {1}
        if absent == "candidate" and (g.tag, g.step) in self._not_observable:
            status, message = "skipped", f"not observable: {self._not_observable[(g.tag, g.step)]}"
        elif self._cache_hit(g, absent_sides):
            status = "skipped"
            message = (
                f"module {g.module!r} was skipped by a cache at step {g.step} (cache hit); "
                f"the {absent} has no tensor for {g.tag}"
            )
        else:
            structure = self._structure_gap(g, present)
            status = "shape_mismatch" if structure else f"missing_{absent}"
            message = structure or self._missing_message(g, absent, present)
        return Comparison(status=status, mode=mode, numel=numel, message=message, **side_fields)

    def _structure_gap(self, g: _Group, present: int) -> str | None:
        """A message when the absent side holds a non-tensor leaf at a parent key path.

        E.g. the reference's ``hidden_states`` is ``None`` while the candidate's is a tuple of
        tensors: ``..._output_hidden_states.0`` exists on the candidate only.
        """
        if g.kind not in ("input", "output"):
            return None
        tag = g.tag
        while "." in tag:
            tag = tag.rsplit(".", 1)[0]
            parent = self._groups.get((tag, g.step))
            if parent is None:
                continue
            other = next((c for c in parent.captures if c.side != present), None)
            if other is not None and not other.is_tensor:
                side = "reference" if other.side < present else "candidate"
                return (
                    f"structure differs at {g.tag}: the {side} has {_leaf_desc(other.value)} "
                    f"at {tag}, the other side a tensor of shape {g.captures[0].meta[0]}"
                )
        return None

    def _missing_message(self, g: _Group, absent: str, present: int) -> str:
        msg = f"no {absent} tensor registered for {g.tag}"
        if g.module is None or g.kind in WEIGHT_KINDS:
            return msg
        other = [s for s in self._hooked if s != present]
        if not other:
            return msg
        calls = max(self._calls.get((s, g.step, g.module), 0) for s in other)
        if calls:
            return (
                f"{msg}: module {g.module!r} ran {calls} time(s) on the {absent} at step "
                f"{g.step}, this is call {g.call_index}"
                if g.call_index >= calls
                else f"{msg}: the {absent}'s module {g.module!r} has no such {g.kind} ({g.slot})"
            )
        if any(g.module in self._hooked[s] for s in other):
            return f"{msg}: module {g.module!r} exists on the {absent} but was not called there"
        return f"{msg}: the {absent} has no module named {g.module!r} (one-sided name)"

    def _cache_hit(self, g: _Group, absent: set[int] | None = None) -> bool | None:
        """Whether a cache skipped ``g``'s module at its step (``None``: no cache in play).

        A mark covers the module and its submodules (the root's name covers all). With
        ``absent`` given, only marks for one of those sides (or for no side) count.
        """
        if not self._cache_hits:
            return None
        if g.module is None:
            return False
        roots = {h.root_name for h in self._handles} or {"model"}
        for module, step, side in self._cache_hits:
            if step != g.step or (absent is not None and side is not None and side not in absent):
                continue
            if module in roots or g.module == module or g.module.startswith(module + "."):
                return True
        return False

    def _tag_result(self, g: _Group, comp: Comparison, n: int, paths) -> TagResult:
        ref_i = g.ref_index
        if ref_i is None:
            low = min(c.side for c in g.captures)
            ref_i = next(i for i, c in enumerate(g.captures) if c.side == low)
        return TagResult(
            tag=g.tag,
            module=g.module,
            kind=g.kind,
            slot=g.slot,
            call_index=g.call_index,
            exec_order=g.captures[ref_i].exec_order,
            step=g.step,
            cache_hit=self._cache_hit(g),
            comparison=comp,
            dump_paths=tuple(paths),
            n_tensors=n,
        )

    def _never_called(self, mode: str) -> list[TagResult]:
        """Hooked modules no side ever called: reported as not captured, never as equal."""
        ran = [s for s in self._hooked if s in self._ran]
        if not ran:
            return []
        called = set().union(*(self._called.get(s, set()) for s in self._hooked))
        names: dict[str, None] = {}
        for s in ran:
            for name in self._hooked[s]:
                if name not in called:
                    names[name] = None
        return [
            TagResult(
                tag=f"checker_{name}",
                module=name,
                kind="output",
                slot="output",
                call_index=0,
                exec_order=-1,
                step=0,
                cache_hit=None if not self._cache_hits else False,
                comparison=Comparison(
                    status="skipped",
                    mode=mode,
                    message=(
                        f"module {name!r} was never called in the forward: nothing captured, "
                        "not compared"
                    ),
                ),
                n_tensors=0,
            )
            for name in names
        ]

    def _write_dumps(self, plan, dump_path) -> tuple[dict[int, tuple[str, ...]], str]:
        from parity_tracker.dump import DumpWriter

        writer = DumpWriter(dump_path)
        paths: dict[int, tuple[str, ...]] = {}
        ref_side = self._reference_side()
        for g in plan:
            written = []
            for cap in g.captures:
                if not isinstance(cap.value, (torch.Tensor, Spilled)):
                    continue
                role = _ROLE[cap.side == ref_side]
                written.append(
                    writer.write(g.tag, _load(cap.value), side=cap.side, role=role, step=g.step)
                )
            paths[id(g)] = tuple(p for p in written if p is not None)
        writer.close()
        released = [g.tag for g in plan if any(c.value is _RELEASED for c in g.captures)]
        if released:
            warnings.warn(
                f"TensorChecker: the eager path already released the tensors of "
                f"{len(released)} tag(s) this dump asked for (first: {released[0]}); pass "
                "dump_mode=... to TensorChecker(...) so it keeps them",
                UserWarning,
                stacklevel=4,
            )
        return paths, writer.subdir

    # ---------------------------------------------------------------- hooks
    def _reference_side(self) -> int:
        """Side 0, unless every side was numbered automatically and side 0 never captured.

        Automatic numbering on the shared instance can hand out sides 2 and 3 while an earlier
        pair's handles are still alive; then the lowest side that captured is the reference.
        Sides given explicitly (``side=``) are absolute: 0 is the reference.
        """
        explicit = self._explicit_manual or any(h.explicit for h in self._handles)
        if explicit or not self._sides:
            return 0
        return min(self._sides)

    def _claim_side(self, side: int | None) -> int:
        if side is not None:
            return int(side)
        used = {h.side for h in self._handles}
        return next(i for i in range(len(used) + 1) if i not in used)

    def _pre_call(self, side, name, mod, args, kwargs, own, root_handle) -> None:
        if root_handle is not None:
            self._stack.append((side, name))
            self._ran.add(side)
            self._called.setdefault(side, set())
            root_handle._warn_training(mod)
        else:
            self._stack.append((side, name))
        key = (side, self._step, name)
        k = self._calls.get(key, 0)
        self._calls[key] = k + 1
        self._called.setdefault(side, set()).add(name)
        base = call_base(name, k)
        groups = [
            self._capture(tag, leaf, side=side, kind="input", module=name, slot=slot, call_index=k)
            for tag, slot, leaf in input_leaves(base, args, kwargs)
        ]
        groups += self._capture_own(side, mod, own)
        self._frames.setdefault((side, id(mod)), []).append((k, groups))

    def _capture_own(self, side: int, mod: torch.nn.Module, own) -> list[_Group]:
        groups = []
        for qname, owner, local, kind in own:
            if (side, qname) in self._weights_done:
                continue
            store = mod._parameters if kind == "param" else mod._buffers
            # TorchScript's parameter store has no .get
            value = store[local] if local in store else None  # noqa: SIM401
            if value is None:
                continue
            self._weights_done.add((side, qname))
            groups.append(
                self._capture(
                    param_tag(qname),
                    value,
                    side=side,
                    kind=kind,
                    module=owner,
                    slot=local,
                    call_index=0,
                    step=0,
                )
            )
        return groups

    def _post_call(self, side, name, mod, output, all_own) -> None:
        frames = self._frames.get((side, id(mod)))
        if not frames:
            return  # hooked in the middle of this call
        k, groups = frames.pop()
        if all_own is None and self._stack and self._stack[-1] == (side, name):
            self._stack.pop()
        base = call_base(name, k)
        outs = [
            self._capture(tag, leaf, side=side, kind="output", module=name, slot=slot, call_index=k)
            for tag, slot, leaf in output_leaves(base, output)
        ]
        self._commit(outs + groups)
        if all_own is not None:  # root: weights of modules the forward never called
            for sub, own in all_own:
                self._commit(self._capture_own(side, sub, own))

    def _root_done(self, side: int, name: str) -> None:
        # Always called, even when the forward raised: drop the root's entry and any stale
        # entries of calls that raised above it.
        if (side, name) in self._stack:
            i = len(self._stack) - 1 - self._stack[::-1].index((side, name))
            del self._stack[i:]


def _fill_pair(rtol: float | None, atol: float | None) -> tuple[float | None, float | None]:
    """Complete a half-given pair with ``torch.allclose``'s defaults (rtol 1e-5, atol 1e-8).

    The seed's ``check_allclose(rtol, atol)`` mirrors ``torch.allclose``, where each has a
    default; the comparison core wants both or neither.
    """
    if (rtol is None) == (atol is None):
        return rtol, atol
    return (1e-5 if rtol is None else rtol), (1e-8 if atol is None else atol)


def _order_key(g: _Group) -> tuple[int, int]:
    return (0, g.order) if g.order is not None else (1, g.created)


def _first_divergence(results: Iterable[TagResult]) -> TagResult | None:
    failing = [r for r in results if r.failed]
    return min(failing, key=lambda r: (r.exec_order, r.step)) if failing else None


def _dump_plan(mode: DumpMode, ordered: list[tuple[_Group, Comparison, int]]) -> list[_Group]:
    """The groups whose tensors a check with ``mode`` writes."""
    if mode is DumpMode.NOT:
        return []
    if mode is DumpMode.ALL:
        return [g for g, _, _ in ordered]
    failing = [(g, c) for g, c, _ in ordered if c.status not in PASSING and c.status not in NEUTRAL]
    if mode is DumpMode.NOT_EQUAL:
        return [g for g, _ in failing]
    for weights in (False, True):
        pool = [g for g, _ in failing if (g.kind in WEIGHT_KINDS) == weights]
        if pool:
            return [min(pool, key=_exec_key)]
    return []


def _exec_key(g: _Group) -> tuple[int, int]:
    low = min(c.side for c in g.captures)
    ref = (
        g.captures[g.ref_index]
        if g.ref_index is not None
        else next(c for c in g.captures if c.side == low)
    )
    return ref.exec_order, g.step


def _status_word(r: TagResult, mode: str) -> str:
    status = r.comparison.status
    if status in PASSING:
        return "equal" if mode == "equal" else "close"
    if status == "mismatch":
        return "not equal" if mode == "equal" else "not close"
    return status


def format_line(r: TagResult, mode: str) -> str:
    """The seed's line for one result, e.g. ``TensorChecker: 2 tensors equal in checker_x``.

    Non-plain statuses (missing, shape mismatch, skipped, error) append ``: {message}``; a
    step other than 0 appends `` at step {k}`` after the tag.
    """
    n = r.n_tensors
    noun = "tensor" if n == 1 else "tensors"
    where = r.tag if r.step == 0 else f"{r.tag} at step {r.step}"
    line = f"TensorChecker: {n} {noun} {_status_word(r, mode)} in {where}"
    if r.comparison.status not in PASSING and r.comparison.status != "mismatch":
        line += f": {r.comparison.message}"
    return line


def _print_result(result: CheckResult) -> None:
    for r in result.results:
        print(format_line(r, result.mode))
    bad_weights = [r for r in result.weights if r.failed]
    if bad_weights:
        listed = ", ".join(f"{r.tag} ({_status_word(r, result.mode)})" for r in bad_weights)
        print(f"TensorChecker: weights differ: {listed}")
    if result.first_divergence is not None:
        r = result.first_divergence
        print(f"TensorChecker: first divergence: {r.tag} ({_status_word(r, result.mode)})")


class HookHandle:
    """The hooks one ``module_register_tensor_checker`` call added.

    ``remove()`` (or leaving a ``with`` block) removes every one of them; the captures already
    made stay in the checker until its ``clear()``.

    Attributes:
        side: the side this model's captures carry (0 reference, 1 candidate, ...).
        module_names: the hooked modules' display names.
        root_name: the root module's display name: ``"model"``, or ``"root"`` when the model
            has a child named ``model`` (Hugging Face ``*ForCausalLM``).
    """

    def __init__(self, checker: TensorChecker, side: int, model: torch.nn.Module) -> None:
        self.checker = checker
        self.side = side
        self.module_names: list[str] = []
        self.root_name = "model"
        self.explicit = False
        self._handles: list[Any] = []
        self._warned = False
        self._model_name = type(model).__name__

    def _warn_training(self, model: torch.nn.Module) -> None:
        if self._warned or not any(m.training for m in model.modules()):
            return
        self._warned = True
        role = "reference" if self.side == 0 else f"candidate (side {self.side})"
        warnings.warn(
            f"TensorChecker: the {role} model {self._model_name} is in training mode; dropout "
            "and batch-norm statistics make the comparison meaningless. Call model.eval() "
            "before the forward.",
            UserWarning,
            stacklevel=4,
        )

    @property
    def removed(self) -> bool:
        """True once ``remove()`` ran."""
        return self not in self.checker._handles

    def remove(self) -> None:
        """Remove every hook this handle added (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self in self.checker._handles:
            self.checker._handles.remove(self)

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _has_forward(mod: torch.nn.Module) -> bool:
    """False for pure containers (ModuleList, ModuleDict, ...) that are never called."""
    if isinstance(mod, torch.jit.ScriptModule):
        return True
    return type(mod).forward is not torch.nn.Module.forward


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
        InputError: ``model`` is not a ``torch.nn.Module``, or is a TorchScript module.
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
    checker = tensor_checker if checker is None else checker
    handle = HookHandle(checker, checker._claim_side(side), model)
    handle.explicit = side is not None
    try:
        _install(model, checker, handle)
    except BaseException:
        handle.remove()
        raise
    checker._hooked.setdefault(handle.side, set()).update(handle.module_names)
    checker._handles.append(handle)
    return handle


def _install(model: torch.nn.Module, checker: TensorChecker, handle: HookHandle) -> None:
    """Add the pre/post hooks of every module with a forward to ``handle``."""
    from parity_tracker.adapters.compiled import install_compiled, is_compiled

    if is_compiled(model):  # torch.compile: hooks traced into the graph, tags without _orig_mod
        install_compiled(model, checker, handle)
        return
    s = handle.side
    root = root_name(model)
    handle.root_name = root
    own = own_tensors(model, root)
    all_own = [(m, own.get(id(m), [])) for m in {id(m): m for m in model.modules()}.values()]
    names: list[str] = []
    scripted: list[str] = []
    for raw_name, mod in model.named_modules():
        is_root = mod is model
        if not is_root and not _has_forward(mod):
            continue
        name = module_display_name(raw_name, root)
        if isinstance(mod, torch.jit.ScriptModule):
            scripted.append(name)
            continue
        names.append(name)
        entries = own.get(id(mod), [])

        def pre(m, args, kwargs, _n=name, _e=entries, _r=is_root):
            with suspended():
                checker._pre_call(s, _n, m, args, kwargs, _e, handle if _r else None)

        def post(m, args, kwargs, output, _n=name, _r=is_root):
            with suspended():
                checker._post_call(s, _n, m, output, all_own if _r else None)

        handle._handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handle._handles.append(mod.register_forward_hook(post, with_kwargs=True))
        if is_root:

            def done(m, args, kwargs, output, _n=name):
                checker._root_done(s, _n)

            handle._handles.append(
                mod.register_forward_hook(done, with_kwargs=True, always_call=True)
            )
    handle.module_names = names
    top = [n for n in scripted if not any(n.startswith(o + ".") for o in scripted)]
    if top:
        warnings.warn(
            f"TensorChecker: TorchScript submodules take no Python hooks and are not captured: "
            f"{', '.join(top)} (their weights are still compared)",
            UserWarning,
            stacklevel=3,
        )


#: The shared instance of the seed API.
tensor_checker = TensorChecker()
