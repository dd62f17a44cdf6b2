"""Pairing: the captures of a TensorChecker grouped by tag and step, turned into comparisons.

Pure functions over capture records (``parity_tracker.capture.modules``: groups with their
captures, and the capture log's bookkeeping — ``groups``, ``sides``, ``hooked``, ``calls``,
``called``, ``ran``, ``cache_hits``, ``not_observable``, ``roots``, ``output_tag``), duck-typed
so this layer imports nothing from capture: which capture is the reference, comparing a pair
(:class:`PairComparer`, with its cache of pairs already compared), never-called modules, the
results' order and the dump plan; one-sided tags are diagnosed by :mod:`compare.one_sided`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from parity_tracker.compare.convert import tensor_version
from parity_tracker.compare.core import Comparison, compare_tensors
from parity_tracker.compare.hashing import content_hash, storage_digest
from parity_tracker.compare.one_sided import (
    cache_hit,
    leaf_desc,
    missing,
    reference_index,
)
from parity_tracker.compare.results import DumpMode, TagResult, results_from_columns
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.compare.verdict import first_divergence_index
from parity_tracker.compare.verdict import structure_differences as verdict_structure
from parity_tracker.statuses import WEIGHT_KINDS, is_failing, is_passing


class _Released:
    """Marker for a tensor the eager path compared and let go."""

    def __repr__(self) -> str:
        return "<released>"


#: The value of a capture whose tensor the eager path compared and released.
RELEASED = _Released()

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def load(value: Any) -> Any:
    """A captured value ready to compare: a spilled snapshot read back onto its device."""
    if isinstance(value, torch.Tensor) or not hasattr(value, "load"):
        return value
    return value.load(to_device=True)


class PairComparer:
    """Compares pairs of captured values, reusing the verdict of a pair already compared.

    A verdict is reused for the same two objects with unchanged version counters only when
    each side is also proven unchanged: an immutable snapshot (``owned``), or a tensor whose
    content hash still equals the one the comparison recorded (writes through ``.data``, numpy
    or DLPack views bump no version counter; issue 13, item 1).

    Args:
        align: ``align(tag, reference, candidate) -> (reference, candidate) | None`` applied
            before each comparison (``None``: no alignment).
        owned: ``owned(value) -> bool``, True for a snapshot nobody writes (no re-check).
        on_compared: ``on_compared(tag, step, reference, candidate, comparison)``, called after
            every comparison of two tensors (reused verdicts included) with the pair as
            compared (after ``align``); the run stage keeps the worst pair's histogram this way.
            A callback with a ``statuses`` attribute (a set of statuses) declares that it acts
            only on pairs of those statuses: the checker's bulk path (``capture.holder``) then
            skips building the tensors of the others and does not call it for them.
    """

    def __init__(
        self,
        align: Callable[[str, Any, Any], tuple[Any, Any] | None] | None = None,
        *,
        owned: Callable[[Any], bool] | None = None,
        on_compared: Callable[[str, int, Any, Any, Comparison], None] | None = None,
    ):
        self.align = align
        self.owned = owned
        self.on_compared = on_compared
        self._cache: dict[tuple, tuple] = {}

    def clear(self) -> None:
        """Forget the pairs compared so far."""
        self._cache = {}

    def compare(
        self, tag: str, ref: Any, cand: Any, mode: str, tol: Tolerances, step: int = 0
    ) -> Comparison:
        """Compare one pair (any leaf values); never raises (a failure is status ``error``).

        Two tensors are compared; a tensor against anything else is a structure difference
        (``shape_mismatch``); two leaves that are not tensors (``None``, a string, a custom
        object: ``capture.leaves.NonTensor``) are ``skipped``, not compared, with both types
        named (issue 13, item 2).
        """
        if not isinstance(ref, torch.Tensor) and not isinstance(cand, torch.Tensor):
            return Comparison(
                status="skipped",
                mode=mode,
                message=(
                    f"not compared: the reference has {leaf_desc(ref)}, the candidate has "
                    f"{leaf_desc(cand)} at {tag} (only tensors, numbers, bools and numpy "
                    "scalars/arrays are compared)"
                ),
            )
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
        if hit is not None and self._reusable(hit, key, ref, cand):
            self.tell(tag, step, ref, cand, hit[3])
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
            digests = (self._digest(ref, comp), self._digest(cand, comp))
            self._cache[key] = (weakref.ref(ref), weakref.ref(cand), key[-1], comp, digests)
        self.tell(tag, step, ref, cand, comp)
        return comp

    def _digest(self, t: torch.Tensor, comp: Comparison) -> int | None:
        """The bytes' digest of a side the comparison's own hash cannot re-check, else None.

        The comparison hashes the converted tensors: when the two dtypes differ, a side may
        have been converted first, so its recorded hash is not the hash of its bytes. A
        non-contiguous side (channels-last activations) gets its storage digest too: re-reading
        it in storage order costs one read, its C-order content hash a copy first.
        """
        if comp.ref_dtype == comp.cand_dtype and (
            not isinstance(t, torch.Tensor) or t.is_contiguous()
        ):
            return None  # the usual case, asked first (issue 19)
        if self.owned is not None and self.owned(t):
            return None
        return storage_digest(t)

    def compare_alone(
        self, tag: str, ref: torch.Tensor, cand: torch.Tensor, mode: str, tol: Tolerances, step=0
    ) -> Comparison:
        """Compare two tensors as :meth:`compare` does, without its cache and without ``align``.

        For pairs held privately by the caller (``capture.holder``'s bulk path: copies nobody
        else has, so no reuse is possible); ``on_compared`` is told as in :meth:`compare`.
        """
        try:
            comp = compare_tensors(ref, cand, mode=mode, tag=tag, tolerances=tol)
        except Exception as exc:  # a pair that cannot be compared never aborts the check
            return Comparison(
                status="error", mode=mode, message=f"{tag}: {type(exc).__name__}: {exc}"
            )
        self.tell(tag, step, ref, cand, comp)
        return comp

    def tell(self, tag: str, step: int, ref: Any, cand: Any, comp: Comparison) -> None:
        """Call ``on_compared(tag, step, ref, cand, comp)`` when one was given."""
        if self.on_compared is not None:
            self.on_compared(tag, step, ref, cand, comp)

    def _reusable(self, hit: tuple, key: tuple, ref: torch.Tensor, cand: torch.Tensor) -> bool:
        """Same objects, same versions, and each side owned or hashing as it did."""
        if hit[0]() is not ref or hit[1]() is not cand or hit[2] != key[-1]:
            return False
        comp, (ref_digest, cand_digest) = hit[3], hit[4]
        return self._unchanged(ref, comp.ref_hash, ref_digest) and self._unchanged(
            cand, comp.cand_hash, cand_digest
        )

    def _unchanged(self, t: torch.Tensor, recorded: str | None, digest: int | None) -> bool:
        """Owned, or its bytes hash as when it was compared (unreadable bytes: False)."""
        if self.owned is not None and self.owned(t):
            return True
        if digest is not None:
            return storage_digest(t) == digest
        if recorded is None or t.device.type != "cpu" or type(t) not in _PLAIN:
            return False
        try:
            return content_hash(t) == recorded
        except (RuntimeError, TypeError, ValueError):  # bytes not readable: compare again
            return False

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
    caps = g.captures
    if len(caps) == 2 and g.ref_index is not None and caps[0].side != caps[1].side:
        comp = g.pairs.get(1 - g.ref_index)  # the usual eager pair: its one comparison
        if comp is not None:
            return comp
    sides = {c.side for c in caps}
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
    try:
        r, c = load(ref.value), load(cap.value)
    except (OSError, RuntimeError) as exc:  # a spill file removed or cut during the run
        return unreadable(g.tag, mode, exc)
    return pairs.compare(g.tag, r, c, mode, tol, g.step)


def unreadable(tag: str, mode: str, exc: BaseException) -> Comparison:
    """The ``error`` pair of a spilled snapshot that cannot be read back (never a raise)."""
    return Comparison(
        status="error",
        mode=mode,
        message=(
            f"{tag}: a spilled snapshot could not be read back ({type(exc).__name__}: {exc}); "
            "not compared. Keep the spill folder intact while the run lasts"
        ),
    )


def tag_columns(log: Any, ordered: list[tuple[Any, Comparison, int]], paths) -> dict[str, list]:
    """The :class:`TagResult` fields of each resolved ``(group, comparison, n)``, by field.

    ``{field: [value of each result, in order]}`` for every ``TagResult`` field, in field
    order: what :func:`tag_results` makes records of, and what a run's ``modules`` table is
    built from directly (``compare.results.table_columns``; issue 19: no record per row).
    ``paths``: ``{id(group): dump paths}``. ``exec_order`` is the reference capture's
    (``one_sided.reference_index``); a log without cache marks gives every result
    ``cache_hit`` ``None`` (what :func:`cache_hit` answers), asked once for all.
    """
    groups = [g for g, _, _ in ordered]
    get, empty = paths.get, ()
    hits = [cache_hit(log, g) for g in groups] if log.cache_hits else [None] * len(groups)
    return {
        "tag": [g.tag for g in groups],
        "module": [g.module for g in groups],
        "kind": [g.kind for g in groups],
        "slot": [g.slot for g in groups],
        "call_index": [g.call_index for g in groups],
        "exec_order": [
            g.captures[reference_index(g) if g.ref_index is None else g.ref_index].exec_order
            for g in groups
        ],
        "step": [g.step for g in groups],
        "cache_hit": hits,
        "comparison": [c for _, c, _ in ordered],
        "dump_paths": [tuple(get(id(g), empty)) for g in groups],
        "n_tensors": [n for _, _, n in ordered],
    }


def tag_result(log: Any, g: Any, comp: Comparison, n: int, paths) -> TagResult:
    """The :class:`TagResult` of one resolved group (:func:`tag_columns`'s fields)."""
    return tag_results(log, [(g, comp, n)], {id(g): paths})[0]


def tag_results(log: Any, ordered: list[tuple[Any, Comparison, int]], paths) -> list[TagResult]:
    """The :class:`TagResult` of each resolved ``(group, comparison, n)``, in order.

    ``paths``: ``{id(group): dump paths}``; the fields are :func:`tag_columns`'s.
    """
    return results_from_columns(tag_columns(log, ordered, paths))


def never_called(log: Any, mode: str) -> list[TagResult]:
    """Hooked modules no side ever called: reported as not captured, never as equal."""
    ran = [s for s in log.hooked if s in log.ran]
    if not ran:
        return []
    by_side = log.called  # derived from the call counts: read once, not once per side
    called = set().union(*(by_side.get(s, set()) for s in log.hooked))
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


def verdict_rows(
    results: list[TagResult], indices: list[int] | None = None
) -> list[dict[str, Any]]:
    """The fields of each result that the rules of :mod:`compare.verdict` read (+ its index).

    ``indices``: only the results at these positions (in this order), e.g. the failing ones:
    both rules read only failing rows (a first divergence is failing, ``is_divergence``; a
    structure difference's status is in ``STRUCTURAL`` ⊂ ``FAILING``) and break ties by row
    order, which a subsequence keeps, so their answers are the same (issue 19: a passing run
    builds no row).
    """
    return [
        {
            "status": (r := results[i]).status,
            "kind": r.kind,
            "cache_hit": r.cache_hit,
            "step": r.step,
            "exec_order": r.exec_order,
            "index": i,
        }
        for i in (range(len(results)) if indices is None else indices)
    ]


def first_divergence(results: list[TagResult], rows: list[dict] | None = None) -> TagResult | None:
    """The first divergence by :func:`parity_tracker.compare.verdict.first_divergence`'s rule.

    ``rows``: ``verdict_rows(results)`` (or of the failing results only) when the caller
    already built them (issue 19: once per check for this and :func:`structure_differences`).
    """
    rows = verdict_rows(results) if rows is None else rows
    i = first_divergence_index(rows)
    return None if i is None else results[rows[i]["index"]]


def structure_differences(
    results: list[TagResult], rows: list[dict] | None = None
) -> list[TagResult]:
    """The one-sided results by :func:`parity_tracker.compare.verdict.structure_differences`."""
    rows = verdict_rows(results) if rows is None else rows
    return [results[r["index"]] for r in verdict_structure(rows)]


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
