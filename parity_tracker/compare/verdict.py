"""Verdicts: one pair's pass/fail without metrics; the first divergence and the worst tensor.

:func:`passes` is ``compare_tensors``' verdict without its metrics (the op recorder's input
statuses). Each rule is defined here once; the checker's printout, the run summary, the CLI
and the HTML report call these functions instead of writing their own filter or ordering.

Rows are mappings with the ``modules``/``ops`` table columns (``tables.MODULES_SCHEMA``):
``status``, ``kind``, ``step``, ``exec_order``, ``cache_hit``, ``sqnr_db``, ``max_abs_diff``
(a missing key reads as ``None``). A ``pyarrow.Table`` is accepted too and read row by row.

Importing this module does not import torch (only :func:`passes` does, when called), so the
read-only commands (``report``, ``diff``, ``history``) apply these rules without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from parity_tracker.errors import InputError
from parity_tracker.statuses import MODES, STRUCTURAL, WEIGHT_KINDS, is_failing

if TYPE_CHECKING:
    import torch

    from parity_tracker.compare.tolerances import Tolerances

Row = Mapping[str, Any]


def _rows(rows: Iterable[Row] | Any) -> list[Row]:
    if hasattr(rows, "to_pylist"):  # pyarrow.Table
        return rows.to_pylist()
    return list(rows)


def _finite(x: Any) -> float | None:
    """``x`` as a float when it is a finite number, else None (NaN, ±inf, None, non-numbers)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _order(x: Any) -> float:
    """An ``exec_order``/``step`` for sorting; None and negatives (never captured) sort last."""
    return math.inf if x is None or x < 0 else x


def is_divergence(row: Row) -> bool:
    """True for a row that can be a first divergence: a PAIRED failing row.

    Failing, not a weight, not a cache hit, and not a structure difference. Weights
    (``param``/``buffer``) are reported apart so a weight-loading error is never blamed on a
    module; a ``cache_hit`` row's error belongs to the cache that skipped the module (issue 7),
    not to the module; a tag present on one side only (``statuses.STRUCTURAL``: e.g. a fused
    ``attn.qkv`` against ``attn.q/k/v``) has no pair to differ from and is reported apart by
    :func:`structure_differences` (issue 13).
    """
    return (
        is_failing(row.get("status"))
        and not is_structure_difference(row)
        and row.get("kind") not in WEIGHT_KINDS
        and not row.get("cache_hit")
    )


def is_structure_difference(row: Row) -> bool:
    """True for a row whose tag exists on one side only (status in ``statuses.STRUCTURAL``)."""
    return row.get("status") in STRUCTURAL


def structure_differences(rows: Iterable[Row] | Any) -> list[Row]:
    """The one-sided rows (:func:`is_structure_difference`), weights included.

    In execution order: ``step``, ``exec_order`` (rows without a position last), row order.
    """
    indexed = [(i, r) for i, r in enumerate(_rows(rows)) if is_structure_difference(r)]
    indexed.sort(
        key=lambda x: (_order(x[1].get("step") or 0), _order(x[1].get("exec_order")), x[0])
    )
    return [r for _, r in indexed]


def first_divergence_index(rows: Iterable[Row] | Any) -> int | None:
    """Position in ``rows`` of the first divergence (see :func:`first_divergence`)."""
    best: tuple[float, float, int] | None = None
    for i, row in enumerate(_rows(rows)):
        if not is_divergence(row):
            continue
        key = (_order(row.get("step") or 0), _order(row.get("exec_order")), i)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def first_divergence(rows: Iterable[Row] | Any) -> Row | None:
    """The first PAIRED failing row in execution order (:func:`is_divergence`).

    Weights, cache hits and one-sided tags (structure differences,
    :func:`structure_differences`) are left out.

    Execution order is ``step``, then ``exec_order`` (rows without a position — never
    captured — come after the positioned rows of their step), then the rows' own order.
    ``skipped`` rows are not divergences (:mod:`parity_tracker.statuses`).

    Args:
        rows: row mappings (or a ``pyarrow.Table``) with the modules/ops table columns.

    Returns:
        That row (the mapping given), or None when no row diverges.
    """
    rows = _rows(rows)
    i = first_divergence_index(rows)
    return None if i is None else rows[i]


def worst_key(row: Row) -> tuple[int, float, float]:
    """How bad a failing row is, as a sort key (smaller is worse); ties: row order decides.

    ``(0 for a value mismatch else 1, sqnr_db (missing or non-finite: +inf), -max_abs_diff)``:
    the ordering of :func:`worst_tensors`, usable on one comparison at a time (the run stage
    keeps only the worst pair seen so far).
    """
    sqnr = _finite(row.get("sqnr_db"))
    diff = _finite(row.get("max_abs_diff"))
    values = 0 if row.get("status") == "mismatch" else 1
    return (values, math.inf if sqnr is None else sqnr, -(diff or 0.0))


def _badness(item: tuple[int, Row]) -> tuple[int, float, float, int]:
    i, row = item
    return (*worst_key(row), i)


#: How :func:`worst_tensors` ranks failing rows, in words: the caption of every table or
#: heading that shows the worst tensors (the CLI's table, the report's histogram).
WORST_ORDER = (
    "value mismatches first, by lowest SQNR (dB), ties by largest max |Δ|; then the other "
    "failing rows (shape mismatch, missing, error) in table order"
)


def worst_tensors(rows: Iterable[Row] | Any, n: int | None = None) -> list[Row]:
    """Failing rows from worst to least bad (the ``n`` worst when ``n`` is given).

    The order is :data:`WORST_ORDER` (its caption). Value mismatches (status ``mismatch``:
    both tensors exist and have a shape in common) come first, by lowest ``sqnr_db`` —
    scale-free, signal power over error power — with missing or non-finite SQNR last and ties
    broken by the largest ``max_abs_diff``, then row order. The other failing rows (shape
    mismatch, missing, error: no value difference to measure) follow in row order. Weights
    and cache hits are included: they are tensors that differ.
    """
    ranked = sorted(
        ((i, r) for i, r in enumerate(_rows(rows)) if is_failing(r.get("status"))), key=_badness
    )
    out = [r for _, r in ranked]
    return out if n is None else out[:n]


def worst_tensor(rows: Iterable[Row] | Any) -> Row | None:
    """The worst failing row (first of :func:`worst_tensors`), or None when none fails.

    The report draws this tensor's histogram; it is a ``mismatch`` row whenever one exists.
    """
    worst = worst_tensors(rows, 1)
    return worst[0] if worst else None


def worst_error_ratio(rows: Iterable[Row] | Any) -> Row | None:
    """The row of the largest ``error_ratio`` (issue 15), or None when no row has one.

    ``+inf`` (a candidate that loses values PyTorch keeps) counts as the largest; ties keep
    the first row in order. Rows of every status count, so a passing run's worst ratio (its
    headroom under ``k``) is known too.
    """
    best: Row | None = None
    for row in _rows(rows):
        ratio = row.get("error_ratio")
        if ratio is None or math.isnan(ratio):
            continue
        if best is None or ratio > best["error_ratio"]:
            best = row
    return best


def passes(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    *,
    mode: str,
    tolerances: Tolerances | None = None,
    tag: str | None = None,
    ignore_dtype: bool = False,
) -> bool:
    """The verdict of :func:`compare_tensors` without its metrics: does the pair pass?

    Same rules as :func:`compare_tensors` (this module's docstring): shapes must match (no
    broadcasting); ``equal`` wants equal values (``-0.0 == 0.0``, NaN matching NaN at the same
    position) and the same dtype; ``allclose`` wants ``|c - r| <= atol + rtol * |r|`` with
    ``tolerances.resolve(tag, dtypes)`` (integers and bools exact), NaN/inf matched by
    position (``torch.isclose(..., equal_nan=True)`` in float64/complex128, which also covers
    float8). Both sides are first cast to their promoted dtype (``torch.promote_types``).
    Used where only pass/fail is needed, e.g. the op recorder's input statuses.

    Args:
        reference: reference tensor (any device; moved to the candidate's device).
        candidate: candidate tensor.
        mode: ``"equal"`` or ``"allclose"``.
        tolerances: tolerance table (default: the per-dtype defaults).
        tag: looked up in ``tolerances``' per-tag overrides.
        ignore_dtype: a dtype difference alone does not fail ``equal`` (the op recorder counts
            it as layout evidence, seed case B, not as a value difference).

    Raises:
        InputError: unknown ``mode``.
    """
    import torch  # here, not at import: the table rules above are read without torch

    if mode not in MODES:
        raise InputError(f"unknown comparison mode {mode!r}; use one of {', '.join(MODES)}")
    ref_t, cand_t = reference, candidate
    if ref_t.shape != cand_t.shape:
        return False
    if ref_t.device != cand_t.device:
        ref_t = ref_t.to(cand_t.device)
    if ref_t.dtype != cand_t.dtype:
        if mode == "equal" and not ignore_dtype:
            return False
        common = torch.promote_types(ref_t.dtype, cand_t.dtype)
        ref_t, cand_t = ref_t.to(common), cand_t.to(common)
    if torch.equal(ref_t, cand_t):
        return True
    if not (ref_t.is_floating_point() or ref_t.is_complex()):
        return False
    if mode == "allclose":
        if tolerances is None:
            from parity_tracker.compare.tolerances import Tolerances

            tolerances = Tolerances()
        rtol, atol = tolerances.resolve(tag, reference.dtype, candidate.dtype)
        wide = torch.complex128 if ref_t.is_complex() else torch.float64  # as the metrics do
        ref_t, cand_t = ref_t.to(wide), cand_t.to(wide)
        ok = torch.isclose(cand_t, ref_t, rtol=rtol, atol=atol, equal_nan=True)
    else:
        ok = (ref_t == cand_t) | (ref_t.isnan() & cand_t.isnan())
    return bool(ok.all())
