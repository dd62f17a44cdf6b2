"""The one status vocabulary of a tensor comparison (design.md, "Comparison semantics").

Every module that asks "did this tensor pass?" imports the answer from here; no other module
writes a status set. The order of :data:`STATUSES` is the contract's order (tables, reports).

- passing: ``equal`` (bitwise identical, or within the equal mode's rules) and ``close``
  (within rtol/atol);
- neutral: ``skipped`` — nothing could be compared (e.g. a module that never ran on either
  side); neither a pass nor a divergence;
- failing: everything else — ``mismatch``, ``shape_mismatch``, ``missing_reference``,
  ``missing_candidate``, ``error``. A status outside the vocabulary (or ``None``) also counts as
  failing in the predicates and masks below, so an unknown value is never reported as a pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, get_args

Status = Literal[
    "equal",
    "close",
    "mismatch",
    "shape_mismatch",
    "missing_reference",
    "missing_candidate",
    "skipped",
    "error",
]
#: Every status of the contract, in the contract's order.
STATUSES: tuple[str, ...] = get_args(Status)
#: Statuses that pass.
PASSING: frozenset[str] = frozenset({"equal", "close"})
#: Statuses that neither pass nor fail: nothing could be compared.
NEUTRAL: frozenset[str] = frozenset({"skipped"})
#: Statuses that are a divergence (every status neither passing nor neutral).
FAILING: frozenset[str] = frozenset(STATUSES) - PASSING - NEUTRAL
#: Failing statuses that show the two values differ (the values were compared and are not
#: the same): what may make an op a root cause. ``error`` fails but proves no difference (the
#: pair could not be compared, or a held value changed after capture).
VALUE_DIFFERS: frozenset[str] = frozenset({"mismatch", "shape_mismatch"})
#: Failing statuses that say a tensor exists on one side only (a structure difference).
STRUCTURAL: frozenset[str] = frozenset({"missing_reference", "missing_candidate"})
#: Comparison modes: bitwise ``equal`` or ``allclose`` with rtol/atol.
MODES: tuple[str, ...] = ("equal", "allclose")
#: The error-budget mode (issue 15): three sides per tag (golden, twin, candidate), judged by
#: ``parity_tracker.compare.budget``; a check or run mode, not a two-tensor comparison mode.
BUDGET: str = "budget"
#: Modes of a check or a run: the pair modes plus ``budget``.
RUN_MODES: tuple[str, ...] = (*MODES, BUDGET)
#: Row kinds that are weights, reported apart from module divergences.
WEIGHT_KINDS: frozenset[str] = frozenset({"param", "buffer"})
#: One stored character per status (``track.tag_codes`` packs a run's per-tag statuses into
#: its MLflow tags with it). Stored data: a status keeps its code forever; a new status gets a
#: new, unused character.
STATUS_CODES: dict[str, str] = {
    "equal": "=",
    "close": "~",
    "mismatch": "x",
    "shape_mismatch": "s",
    "missing_reference": "R",
    "missing_candidate": "C",
    "skipped": "-",
    "error": "!",
}
#: The status of each code (the inverse of :data:`STATUS_CODES`).
CODE_STATUSES: dict[str, str] = {code: status for status, code in STATUS_CODES.items()}
if set(STATUS_CODES) != set(STATUSES) or len(CODE_STATUSES) != len(STATUS_CODES):
    raise AssertionError("STATUS_CODES must give every status one distinct code")


def is_passing(status: str | None) -> bool:
    """True for ``equal`` / ``close``."""
    return status in PASSING


def is_neutral(status: str | None) -> bool:
    """True for ``skipped``."""
    return status in NEUTRAL


def is_failing(status: str | None) -> bool:
    """True for a divergence: not passing and not neutral (unknown statuses fail)."""
    return status not in PASSING and status not in NEUTRAL


def differs(status: str | None) -> bool:
    """True when a comparison showed the values differ (:data:`VALUE_DIFFERS`)."""
    return status in VALUE_DIFFERS


def is_weight(kind: str | None) -> bool:
    """True for ``param`` / ``buffer`` rows."""
    return kind in WEIGHT_KINDS


def status_counts(statuses: Iterable[str]) -> dict[str, int]:
    """Occurrences per status, every status of the contract present (0 when absent).

    A value outside the vocabulary is counted under its own key, after the contract's.
    """
    counts = dict.fromkeys(STATUSES, 0)
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    return counts


def _values(column: Any) -> tuple[Any, str]:
    """``(values, kind)`` with kind ``"arrow"`` for pyarrow arrays, ``"numpy"`` otherwise."""
    mod = type(column).__module__
    if mod.startswith("pyarrow"):
        return column, "arrow"
    import numpy as np

    return np.asarray(column, dtype=object), "numpy"


def _is_in(column: Any, values: frozenset[str]) -> Any:
    """Element-wise ``status in values`` (null → False) as a pyarrow or numpy bool mask."""
    col, kind = _values(column)
    if kind == "arrow":
        import pyarrow as pa
        import pyarrow.compute as pc

        return pc.fill_null(pc.is_in(col, value_set=pa.array(sorted(values))), False)
    import numpy as np

    return np.isin(col, np.array(sorted(values), dtype=object))


def passing_mask(column: Any) -> Any:
    """Mask of passing statuses over a pyarrow array/ChunkedArray or an array-like.

    Returns a pyarrow boolean array for pyarrow input (nulls become False), else a numpy bool
    array.
    """
    return _is_in(column, PASSING)


def failing_mask(column: Any) -> Any:
    """Mask of failing statuses: not passing and not neutral (null and unknown values fail)."""
    mask = _is_in(column, PASSING | NEUTRAL)
    if type(mask).__module__.startswith("pyarrow"):
        import pyarrow.compute as pc

        return pc.invert(mask)
    return ~mask


def weight_mask(column: Any) -> Any:
    """Mask of weight kinds (``param`` / ``buffer``) over a ``kind`` column (null → False)."""
    return _is_in(column, WEIGHT_KINDS)
