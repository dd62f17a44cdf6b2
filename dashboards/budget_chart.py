"""The error-budget chart of a ``mode="budget"`` run report (issue 15).

Top panel, log scale: two lines per module output in execution order, the twin's error against
the float64 golden (``twin_max_abs_err``: PyTorch's own error at the candidate's precision) and
the candidate's (``golden_max_abs_err``). Bottom panel: their ratio ``error_ratio`` with the
default budget ``k`` drawn. Where the candidate's line leaves the twin's by more than ``k`` is
the divergence: the first tag over budget (``compare.verdict``'s first divergence), marked by a
red dashed line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from parity_tracker.compare.budget_k import DEFAULT_K
from parity_tracker.run.mode import REFERENCE_SIDE

from ._page import fmt_num
from .charts import _first_label, _steps, _trace, base_layout, log_floor, r4, two_panels, txt, vline

TWIN_COLOR, CAND_COLOR = "#78909c", "#d84315"


def is_budget(points: Sequence[Mapping[str, Any]]) -> bool:
    """True when the rows carry error-budget columns (a ``budget`` run)."""
    return any(r.get("error_ratio") is not None for r in points)


def _ys(values: Sequence[float | None], floor: float, ceil: float) -> list[float | None]:
    """Log-axis values: exact zeros at the floor, +inf at the ceiling, unknown as gaps."""
    out: list[float | None] = []
    for v in values:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(None)
        elif math.isinf(v):
            out.append(ceil)
        else:
            out.append(floor if v == 0 else r4(v))
    return out


def _hover(r: Mapping[str, Any]) -> str:
    return (
        f"{txt(r.get('tag'))}<br>{r.get('status')} · candidate error "
        f"{fmt_num(r.get('golden_max_abs_err'))} · PyTorch's own "
        f"{fmt_num(r.get('twin_max_abs_err'))} · ratio {fmt_num(r.get('error_ratio'))}"
    )


def budget_figure(
    points: Sequence[Mapping[str, Any]], first_x: int | None, first_tag: str | None
) -> tuple[dict[str, Any], str]:
    """The candidate's and the twin's error against the golden per module output.

    Args:
        points: module-table rows (outputs) in execution order, with the budget columns.
        first_x: index into ``points`` of the first tag over budget, or None.
        first_tag: its tag, for the label.

    Returns:
        (plotly figure dict, one-sentence note on how to read it).
    """
    n, xs = len(points), list(range(len(points)))
    cand = [r.get("golden_max_abs_err") for r in points]
    twin = [r.get("twin_max_abs_err") for r in points]
    floor, ceil = log_floor([v for v in cand + twin if v is not None and math.isfinite(v)])
    ratios = [r.get("error_ratio") for r in points]
    text = [_hover(r) for r in points]
    hover = "%{text}<extra></extra>"
    data = [
        _trace(xs, _ys(twin, floor, ceil), mode="lines+markers", name="PyTorch at this precision "
               "(twin) vs golden", line={"color": TWIN_COLOR, "width": 2},
               marker={"size": 4}, text=text, hovertemplate=hover),
        _trace(xs, _ys(cand, floor, ceil), mode="lines+markers", name="candidate vs golden",
               line={"color": CAND_COLOR, "width": 1.5}, marker={"size": 4}, text=text,
               hovertemplate=hover),
        _trace(xs, _ys(ratios, 1e-3, 1e6), "x2", "y2", mode="markers", name="error_ratio",
               marker={"color": CAND_COLOR, "size": 5}, text=text, hovertemplate=hover,
               showlegend=False),
    ]  # fmt: skip
    shapes, notes = _steps(points)
    shapes.append(_k_line(DEFAULT_K))
    if first_x is not None:
        shapes.append(vline(first_x, "#c62828", "dash", 2))
        label = _first_label(first_x, first_tag)
        label["text"] = f"candidate leaves PyTorch's error: {txt(first_tag)}"
        notes.append(label)
    layout = base_layout(
        shapes=shapes,
        annotations=notes,
        **two_panels(
            {"type": "log", "title": {"text": "max |· − golden| (log)"}, "exponentformat": "e"},
            {"type": "log", "title": {"text": "error_ratio"}, "exponentformat": "e"},
            "module output, execution order",
            0.3,
        ),
    )
    note = (
        f"{n} module outputs. Grey: PyTorch's own error at the candidate's precision (the twin) "
        f"against the float64 golden; orange: the candidate's. Below, their ratio and the "
        f"default budget k = {fmt_num(DEFAULT_K)} (dotted). Exact zeros sit at "
        f"{fmt_num(floor)}, values the candidate loses (∞) at {fmt_num(ceil)}."
    )
    return {"data": data, "layout": layout}, note


def _k_line(k: float) -> dict[str, Any]:
    """A horizontal dotted line at ratio ``k`` in the bottom panel."""
    return {
        "type": "line", "xref": "x2 domain", "yref": "y2", "x0": 0, "x1": 1, "y0": k, "y1": k,
        "line": {"color": "#c62828", "width": 1, "dash": "dot"},
    }  # fmt: skip


#: What ``error_ratio`` divides by (``compare.budget``: ``max(e_twin, floor)``), in words; the
#: summary does not say which of the two won, so both are named.
BUDGET_BASE = "max(PyTorch's own error, floor eps·max|golden|)"


def budget_verdict(summary: Mapping[str, Any]) -> str | None:
    """The verdict bar's budget words: within k× :data:`BUDGET_BASE`, or the worst ratio.

    ``None`` for a run of another mode. Reads ``worst_error_ratio`` (``error_ratio_infinite``
    for +inf) and ``worst_error_ratio_tag`` of the summary, and names the reference side when
    it is the twin (the ``reference_side`` setting, ``run.budget``): the candidate-vs-reference
    figures beside it (output max |Δ|, SQNR) are then against PyTorch at the candidate's
    precision, not against the fp32 reference.
    """
    if summary.get("mode") != "budget":
        return None
    ratio, tag = summary.get("worst_error_ratio"), summary.get("worst_error_ratio_tag")
    side = (summary.get("settings") or {}).get(REFERENCE_SIDE)
    note = f"; reference side: {side}" if side else ""
    if summary.get("error_ratio_infinite"):
        return f"worst error_ratio ∞ at {tag} (the candidate loses values PyTorch keeps){note}"
    if ratio is None:
        return None
    if ratio <= DEFAULT_K and summary.get("passed"):
        return (
            f"within {fmt_num(DEFAULT_K)}× {BUDGET_BASE} "
            f"(worst error_ratio {fmt_num(ratio)} at {tag}){note}"
        )
    return f"worst error_ratio {fmt_num(ratio)}× {BUDGET_BASE} at {tag}{note}"
