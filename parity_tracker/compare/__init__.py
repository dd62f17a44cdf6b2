"""Comparison semantics: one reference tensor against one candidate (design.md).

The package is pure: it imports torch, numpy and xxhash, never capture, tracking or reports.
``parity_tracker.compare`` keeps the names it had as a flat module:
:func:`compare_tensors`, :class:`Comparison`, :func:`missing` and the status vocabulary
(re-exported from :mod:`parity_tracker.statuses`).
"""

from parity_tracker.compare.core import (
    EQUAL_CHUNK,
    SMALL,
    Comparison,
    compare_tensors,
    missing,
)
from parity_tracker.compare.verdict import passes
from parity_tracker.statuses import MODES, PASSING, STATUSES, Status

__all__ = [
    "EQUAL_CHUNK",
    "MODES",
    "PASSING",
    "SMALL",
    "STATUSES",
    "Comparison",
    "Status",
    "compare_tensors",
    "missing",
    "passes",
]
