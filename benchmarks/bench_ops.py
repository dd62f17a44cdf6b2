"""Measurement 2: op-level parity run ÷ the same plain forwards. Target ≤ 1.5 (issue 19, item 3).

``run_parity(..., capture_ops=True)``: every aten op's output captured on both sides and
compared (equal mode, no dumps), on the same pairs and in the same timing loop as measurement 1.
"""

from __future__ import annotations

from benchmarks._common import Row
from benchmarks.bench_module import limit, pair_sessions, quick_judged
from benchmarks.overhead import ratio_row

NAME = "2 op-level ÷ plain"
TARGET = 1.5  # issue 19, item 3 (was 2)
#: the quick size's own target (issue 19, item 1: op-level on the 2×128 transformer ≤ 3)
QUICK_TARGET = 3.0


def run(quick: bool) -> list[Row]:
    """Rows of measurement 2 (one per pair)."""
    rows: list[Row] = []
    for _, s in pair_sessions(quick):
        if isinstance(s, Row):
            rows.append(Row(NAME, s.case, None, "", f"≤ {TARGET:g}", None, s.status, s.detail))
        else:
            lim = limit(quick, TARGET, QUICK_TARGET)
            rows.append(quick_judged(ratio_row(s, NAME, "ops", "plain", lim), quick))
    return rows
