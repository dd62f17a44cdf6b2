"""Localize a divergence: pure functions over captured records (seed §4 steps 2 and 3).

- :mod:`~parity_tracker.localize.align`: :func:`align_ops`, :func:`layout_differences`;
- :mod:`~parity_tracker.localize.root_cause`: :func:`classify` (cases A, B, C);
- :mod:`~parity_tracker.localize.isolate`: :func:`isolate`, :func:`compare_structured`.

``parity_tracker.localize`` keeps the names it had as a flat module.
"""

from parity_tracker.localize.align import MAX_DP_CELLS, align_ops, layout_differences
from parity_tracker.localize.isolate import compare_structured, isolate
from parity_tracker.localize.root_cause import CASE_A, CASE_B, CASE_C, classify

__all__ = [
    "CASE_A",
    "CASE_B",
    "CASE_C",
    "MAX_DP_CELLS",
    "align_ops",
    "classify",
    "compare_structured",
    "isolate",
    "layout_differences",
]
