"""Pairing: the captures of a TensorChecker grouped by tag and step, turned into comparisons.

Pure functions over capture records (``parity_tracker.capture.modules``: groups with their
captures, and the capture log's bookkeeping — ``groups``, ``sides``, ``hooked``, ``calls``,
``called``, ``ran``, ``cache_hits``, ``not_observable``, ``roots``, ``output_tag``), duck-typed
so this layer imports nothing from capture: which capture is the reference, comparing a pair
(:class:`PairComparer`, with its cache of pairs already compared), the diagnosis of one-sided
tags (missing, structure difference, cache hit, never-called module) and the dump plan.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch

from parity_tracker.compare.convert import tensor_version
from parity_tracker.compare.core import Comparison, compare_tensors
from parity_tracker.compare.results import DumpMode, TagResult
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.compare.verdict import first_divergence_index
from parity_tracker.statuses import WEIGHT_KINDS, is_failing, is_passing


class _Released:
    """Marker for a tensor the eager path compared and let go."""

    def __repr__(self) -> str:
        return "<released>"


#: The value of a capture whose tensor the eager path compared and released.
RELEASED = _Released()


def leaf_desc(value: Any) -> str:
    """``None``, ``a non-tensor {type}`` or ``a tensor of shape {shape}`` (messages)."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    type_name = getattr(value, "type_name", None)  # capture.leaves.NonTensor
    if type_name is not None:
        return f"a non-tensor {type_name}"
    return f"a tensor of shape {value.size}"  # a spilled snapshot (capture.store.Spilled)


def load(value: Any) -> Any:
    """A captured value ready to compare: a spilled snapshot read back onto its device."""
    if isinstance(value, torch.Tensor) or not hasattr(value, "load"):
        return value
    return value.load(to_device=True)


def reference_index(g: Any) -> int:
    """Index of a group's reference capture.

    Set by the eager path, else the first capture of the lowest side.
    """
    if g.ref_index is not None:
        return g.ref_index
    low = min(c.side for c in g.captures)
    return next(i for i, c in enumerate(g.captures) if c.side == low)


class PairComparer:
    """Compares pairs of captured values, reusing the verdict of a pair already compared.

    Args:
        align: ``align(tag, reference, candidate) -> (reference, candidate) | None`` applied
            before each comparison (``None``: no alignment).
    """

    def __init__(self, align: Callable[[str, Any, Any], tuple[Any, Any] | None] | None = None):
        self.align = align
        self._cache: dict[tuple, tuple] = {}

    def clear(self) -> None:
        """Forget the pairs compared so far."""
        self._cache = {}

    def compare(self, tag: str, ref: Any, cand: Any, mode: str, tol: Tolerances) -> Comparison:
        """Compare one pair (any leaf values); never raises (a failure is status ``error``)."""
        if not isinstance(ref, torch.Tensor) or not isinstance(cand, torch.Tensor):
            return Comparison(
                status="shape_mismatch",
                mode=mode,
                message=(
                    f"structure differs at {tag}: the reference has {leaf_desc(ref)}, "
                    f"the candidate has {leaf_desc(cand)}"
                ),
            )
        key = self._key(tag, ref, cand, mode, tol)
        hit = self._cache.get(key) if key is not None else None
        if hit is not None and hit[0]() is ref and hit[1]() is cand and hit[2] == key[-1]:
            return hit[3]
        try:
            if self.align is not None:
                aligned = self.align(tag, ref, cand)
                if aligned is not None:
                    ref, cand = aligned
            comp = compare_tensors(ref, cand, mode=mode, tag=tag, tolerances=tol)
        except Exception as exc:  # a pair that cannot be compared never aborts the check
            return Comparison(
                status="error", mode=mode, message=f"{tag}: {type(exc).__name__}: {exc}"
            )
        if key is not None:
            self._cache[key] = (weakref.ref(ref), weakref.ref(cand), key[-1], comp)
        return comp

    def _key(self, tag: str, ref: torch.Tensor, cand: torch.Tensor, mode: str, tol: Tolerances):
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
        limits = (tol.default, tol.match(tag)) if mode == "allclose" else None
        return (id(ref), id(cand), mode, limits, versions)


def resolve(log: Any, g: Any, mode: str, tol: Tolerances, ref_side: int, pairs: Any) -> Comparison:
    """A group's comparison: one-sided groups diagnosed, the others compared.

    Each candidate is compared with the reference; the result is the first non-passing
    candidate's comparison, else the first one's.

    ``pairs`` is a :class:`PairComparer` for the pairs not compared eagerly.
    """
    sides = {c.side for c in g.captures}
    if len(sides) == 1:
        return missing(log, g, mode, next(iter(sides)), ref_side)
    ref_i = reference_index(g)
    ref = g.captures[ref_i]
    comps = []
    for i, cap in enumerate(g.captures):
        if i == ref_i:
            continue
        comp = g.pairs.get(i)
        if comp is None:
            comp = deferred_pair(pairs, g, ref, cap, mode, tol)
        comps.append(comp)
    return next((c for c in comps if not is_passing(c.status)), comps[0])


def deferred_pair(pairs: Any, g: Any, ref: Any, cap: Any, mode: str, tol: Tolerances) -> Comparison:
    """Compare a held candidate capture with the held reference capture."""
    if ref.value is RELEASED or cap.value is RELEASED:
        return Comparison(
            status="error",
            mode=mode,
            message=(
                f"{g.tag}: the eager path released the reference after its first "
                "candidate; groups of more than two tensors need eager_mode=None"
            ),
        )
    return pairs.compare(g.tag, load(ref.value), load(cap.value), mode, tol)


def missing(log: Any, g: Any, mode: str, present: int, ref_side: int) -> Comparison:
    """The comparison of a tag captured on one side only: missing, structure or cache hit."""
    absent = "candidate" if present == ref_side else "reference"
    cap = next(c for c in g.captures if c.is_tensor)
    shape, dtype, device = cap.meta or (None, None, None)
    side_fields = (
        dict(ref_shape=shape, ref_dtype=dtype, ref_device=device)
        if absent == "candidate"
        else dict(cand_shape=shape, cand_dtype=dtype, cand_device=device)
    )
    numel = None if shape is None else math.prod(shape)
    absent_sides = {ref_side} if absent == "reference" else (log.sides - {present}) or {1}
    hidden = log.not_observable.get((g.tag, g.step))
    if absent == "candidate" and hidden is not None:  # a compiled/foreign engine (adapters)
        status, message = "skipped", f"not observable: {hidden}"
    elif cache_hit(log, g, absent_sides):
        status = "skipped"
        message = (
            f"module {g.module!r} was skipped by a cache at step {g.step} (cache hit); "
            f"the {absent} has no tensor for {g.tag}"
        )
    else:
        structure = structure_gap(log, g, present)
        status = "shape_mismatch" if structure else f"missing_{absent}"
        message = structure or missing_message(log, g, absent, present)
    return Comparison(status=status, mode=mode, numel=numel, message=message, **side_fields)


def structure_gap(log: Any, g: Any, present: int) -> str | None:
    """A message when the absent side holds a non-tensor leaf at a parent key path.

    E.g. the reference's ``hidden_states`` is ``None`` while the candidate's is a tuple of
    tensors: ``..._output_hidden_states.0`` exists on the candidate only.
    """
    if g.kind not in ("input", "output"):
        return None
    tag = g.tag
    while "." in tag:
        tag = tag.rsplit(".", 1)[0]
        parent = log.groups.get((tag, g.step))
        if parent is None:
            continue
        other = next((c for c in parent.captures if c.side != present), None)
        if other is not None and not other.is_tensor:
            side = "reference" if other.side < present else "candidate"
            return (
                f"structure differs at {g.tag}: the {side} has {leaf_desc(other.value)} "
                f"at {tag}, the other side a tensor of shape {g.captures[0].meta[0]}"
            )
    return None


def missing_message(log: Any, g: Any, absent: str, present: int) -> str:
    """Why a tag has no tensor on the ``absent`` side (module not called, no such slot, ...)."""
    msg = f"no {absent} tensor registered for {g.tag}"
    if g.module is None or g.kind in WEIGHT_KINDS:
        return msg
    other = [s for s in log.hooked if s != present]
    if not other:
        return msg
    calls = max(log.calls.get((s, g.step, g.module), 0) for s in other)
    if calls:
        return (
            f"{msg}: module {g.module!r} ran {calls} time(s) on the {absent} at step "
            f"{g.step}, this is call {g.call_index}"
            if g.call_index >= calls
            else f"{msg}: the {absent}'s module {g.module!r} has no such {g.kind} ({g.slot})"
        )
    if any(g.module in log.hooked[s] for s in other):
        return f"{msg}: module {g.module!r} exists on the {absent} but was not called there"
    return f"{msg}: the {absent} has no module named {g.module!r} (one-sided name)"


def cache_hit(log: Any, g: Any, absent: set[int] | None = None) -> bool | None:
    """Whether a cache skipped ``g``'s module at its step (``None``: no cache in play).

    A mark covers the module and its submodules (the root's name covers all). With
    ``absent`` given, only marks for one of those sides (or for no side) count.
    """
    if not log.cache_hits:
        return None
    if g.module is None:
        return False
    roots = log.roots
    for module, step, side in log.cache_hits:
        if step != g.step or (absent is not None and side is not None and side not in absent):
            continue
        if module in roots or g.module == module or g.module.startswith(module + "."):
            return True
    return False


def tag_result(log: Any, g: Any, comp: Comparison, n: int, paths) -> TagResult:
    """The :class:`TagResult` of a resolved group."""
    ref_i = reference_index(g)
    return TagResult(
        tag=g.tag,
        module=g.module,
        kind=g.kind,
        slot=g.slot,
        call_index=g.call_index,
        exec_order=g.captures[ref_i].exec_order,
        step=g.step,
        cache_hit=cache_hit(log, g),
        comparison=comp,
        dump_paths=tuple(paths),
        n_tensors=n,
    )


def never_called(log: Any, mode: str) -> list[TagResult]:
    """Hooked modules no side ever called: reported as not captured, never as equal."""
    ran = [s for s in log.hooked if s in log.ran]
    if not ran:
        return []
    called = set().union(*(log.called.get(s, set()) for s in log.hooked))
    names: dict[str, None] = {}
    for s in ran:
        for name in log.hooked[s]:
            if name not in called:
                names[name] = None
    return [
        TagResult(
            tag=log.output_tag(name),
            module=name,
            kind="output",
            slot="output",
            call_index=0,
            exec_order=-1,
            step=0,
            cache_hit=None if not log.cache_hits else False,
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


def order_key(g: Any) -> tuple[int, int]:
    """Results order: first registration (commit) order, uncommitted groups last."""
    return (0, g.order) if g.order is not None else (1, g.created)


def first_divergence(results: list[TagResult]) -> TagResult | None:
    """The first divergence by :func:`parity_tracker.compare.verdict.first_divergence`'s rule."""
    rows = [
        {
            "status": r.status,
            "kind": r.kind,
            "cache_hit": r.cache_hit,
            "step": r.step,
            "exec_order": r.exec_order,
        }
        for r in results
    ]
    i = first_divergence_index(rows)
    return None if i is None else results[i]


def dump_plan(mode: DumpMode, ordered: list[tuple[Any, Comparison, int]]) -> list[Any]:
    """The groups whose tensors a check with ``mode`` writes."""
    if mode is DumpMode.NOT:
        return []
    if mode is DumpMode.ALL:
        return [g for g, _, _ in ordered]
    failing = [(g, c) for g, c, _ in ordered if is_failing(c.status)]
    if mode is DumpMode.NOT_EQUAL:
        return [g for g, _ in failing]
    for weights in (False, True):
        pool = [g for g, _ in failing if (g.kind in WEIGHT_KINDS) == weights]
        if pool:
            return [min(pool, key=exec_key)]
    return []


def exec_key(g: Any) -> tuple[int, int]:
    """``(exec_order of the reference capture, step)``: execution order of a group."""
    return g.captures[reference_index(g)].exec_order, g.step
