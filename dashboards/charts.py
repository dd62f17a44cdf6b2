"""Plotly figures for the dashboards, built as plain figure dicts (plotly.js's JSON schema).

Plain dicts rather than ``plotly.graph_objects``: the object layer validates every element of
every array in Python, which for a 2,000-row run costs seconds; the dicts are checked against
``plotly.graph_objects.Figure`` in the tests instead. Numbers are rounded to 4 significant
digits (charts cannot show more) to keep the pages small.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._page import STATUS_MARKERS, finite, fmt_num

_GRID = "#eceff1"
_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}


def txt(value: Any) -> str:
    """Text for plotly labels and hover: ``&``, ``<``, ``>`` escaped (plotly decodes them)."""
    return html.escape("" if value is None else str(value), quote=False)


def r4(value: float | None) -> float | None:
    """``value`` rounded to 4 significant digits (None stays None)."""
    return None if value is None else float(f"{value:.4g}")


def log_floor(values: Sequence[float | None]) -> tuple[float, float]:
    """(floor, ceiling) for a log axis around the positive values, one decade out each way.

    (1e-12, 1) when there is no positive value.
    """
    positive = [v for v in values if v is not None and v > 0]
    if not positive:
        return 1e-12, 1.0
    lo = 10.0 ** (math.floor(math.log10(min(positive))) - 1)
    hi = 10.0 ** (math.ceil(math.log10(max(positive))) + 1)
    return lo, hi


def base_layout(**extra: Any) -> dict[str, Any]:
    """White background, light grid, horizontal legend on top."""
    layout = {
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "font": _FONT,
        "hovermode": "closest",
        "legend": {"orientation": "h", "y": 1.13, "x": 0},
        "margin": {"l": 72, "r": 20, "t": 50, "b": 50},
    }
    layout.update(extra)
    return layout


def axis(**extra: Any) -> dict[str, Any]:
    """An axis with the dashboards' grid style."""
    return {"gridcolor": _GRID, "zeroline": False, "linecolor": "#b0bec5", **extra}


def two_panels(top: dict[str, Any], bottom: dict[str, Any], x_title: str, split: float) -> dict:
    """Layout axes for two stacked panels sharing x: top on (x, y), bottom on (x2, y2)."""
    return {
        "xaxis": axis(anchor="y", matches="x2", showticklabels=False),
        "yaxis": axis(domain=[split + 0.06, 1.0], **top),
        "xaxis2": axis(anchor="y2", title={"text": x_title}),
        "yaxis2": axis(domain=[0.0, split], **bottom),
    }


def vline(x: float, color: str, dash: str = "dot", width: int = 1) -> dict[str, Any]:
    """A vertical line across both panels at data coordinate ``x``."""
    return {
        "type": "line",
        "xref": "x",
        "yref": "paper",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "line": {"color": color, "width": width, "dash": dash},
    }


# ---------------------------------------------------------------------------------------------
# Run report


def propagation_figure(
    points: Sequence[Mapping[str, Any]],
    first_x: int | None,
    first_tag: str | None,
    roots: Sequence[tuple[int, str]],
) -> tuple[dict[str, Any], str]:
    """Max |Δ| (log) and SQNR of each point in order, first divergence and root causes marked.

    Args:
        points: module-table rows in execution order (steps concatenated).
        first_x: index into ``points`` of the first divergence, or None.
        first_tag: its tag, for the label.
        roots: (index into ``points``, label) of each root-cause op's module.

    Returns:
        (figure dict, one-sentence note on how zeros, missing metrics and ∞ are drawn).
    """
    n = len(points)
    diffs = [finite(r.get("max_abs_diff")) for r in points]
    floor, ceil = log_floor(diffs)
    yd = [ceil if d is None else floor if d == 0 else r4(d) for d in diffs]
    ys, cap = _sqnr_ys(points, diffs)
    line = {"color": "#b0bec5", "width": 1}
    data: list[dict[str, Any]] = [
        _trace(list(range(n)), yd, mode="lines", line=line, hoverinfo="skip", showlegend=False),
        _trace(
            list(range(n)),
            ys,
            "x2",
            "y2",
            mode="lines",
            line=line,
            hoverinfo="skip",
            showlegend=False,
            connectgaps=True,
        ),
    ]
    data += _status_traces(points, diffs, yd, ys)
    data += _cache_hits(points, floor) + _roots(roots, yd)
    shapes, notes = _steps(points)
    if first_x is not None:
        shapes.append(vline(first_x, "#c62828", "dash", 2))
        notes.append(_first_label(first_x, first_tag))
    steps = {r.get("step") for r in points}
    x_title = "module output, execution order" + (" (steps concatenated)" if len(steps) > 1 else "")
    layout = base_layout(
        shapes=shapes,
        annotations=notes,
        **two_panels(
            {"type": "log", "title": {"text": "max |Δ| (log)"}, "exponentformat": "e"},
            {"title": {"text": "SQNR (dB)"}},
            x_title,
            0.34,
        ),
    )
    note = (
        f"{n} module outputs. Exact zeros are drawn as hollow markers at the floor "
        f"{fmt_num(floor)}; outputs with no metric (shape mismatch, missing, error) as × at "
        f"{fmt_num(ceil)}; identical tensors (SQNR ∞) at {fmt_num(cap)} dB in the SQNR panel."
    )
    if any(r.get("cache_hit") is True for r in points):
        note += " Blue ticks under the floor mark cache hits."
    return {"data": data, "layout": layout}, note


def _sqnr_ys(
    points: Sequence[Mapping[str, Any]], diffs: Sequence[float | None]
) -> tuple[list[float | None], float]:
    """SQNR panel y values and the cap (20 dB over the largest finite SQNR) drawn for ∞.

    An identical tensor (SQNR ∞, or no SQNR with a zero difference) is drawn at the cap; a
    row without any SQNR is a gap (None).
    """
    sqnrs = [finite(r.get("sqnr_db")) for r in points]
    known = [s for s in sqnrs if s is not None]
    cap = r4((max(known) if known else 100.0) + 20.0)
    ys: list[float | None] = []
    for r, s, d in zip(points, sqnrs, diffs, strict=True):
        raw = r.get("sqnr_db")
        identical = raw == math.inf or (raw is None and d == 0)
        ys.append(r4(s) if s is not None else cap if identical else None)
    return ys, cap


def _status_traces(
    points: Sequence[Mapping[str, Any]],
    diffs: Sequence[float | None],
    yd: Sequence[float | None],
    ys: Sequence[float | None],
) -> list[dict[str, Any]]:
    """One marker trace per status in each panel (the legend toggles both)."""
    n = len(points)
    text = [_hover(r) for r in points]
    out = []
    for status in _statuses(points):
        idx = [i for i in range(n) if (points[i].get("status") or "") == status]
        color = STATUS_MARKERS.get(status, "#455a64")
        out.append(
            _trace(
                idx,
                [yd[i] for i in idx],
                mode="markers",
                name=status or "—",
                legendgroup=status,
                text=[text[i] for i in idx],
                hovertemplate="%{text}<extra></extra>",
                marker={"color": color, "size": 6, "symbol": [_symbol(diffs[i]) for i in idx]},
            )
        )
        sidx = [i for i in idx if ys[i] is not None]
        out.append(
            _trace(
                sidx,
                [ys[i] for i in sidx],
                "x2",
                "y2",
                mode="markers",
                name=status or "—",
                legendgroup=status,
                showlegend=False,
                hovertemplate="#%{x}: SQNR %{y:.4g} dB<extra></extra>",
                marker={"color": color, "size": 5},
            )
        )
    return out


def _first_label(first_x: int, first_tag: str | None) -> dict[str, Any]:
    """The "first divergence: TAG" annotation over the top of the chart."""
    return {
        "x": first_x,
        "y": 1.0,
        "xref": "x",
        "yref": "paper",
        "yanchor": "bottom",
        "text": f"first divergence: {txt(first_tag)}",
        "showarrow": False,
        "font": {"color": "#c62828", "size": 12},
        "bgcolor": "rgba(255,255,255,0.85)",
    }


def _trace(x: list, y: list, xa: str = "x", ya: str = "y", **kw: Any) -> dict[str, Any]:
    return {"type": "scatter", "x": x, "y": y, "xaxis": xa, "yaxis": ya, **kw}


def _symbol(diff: float | None) -> str:
    return "x" if diff is None else "circle-open" if diff == 0 else "circle"


def _statuses(points: Sequence[Mapping[str, Any]]) -> list[str]:
    order = list(STATUS_MARKERS)
    found = {r.get("status") or "" for r in points}
    return sorted(found, key=lambda s: order.index(s) if s in order else len(order))


def _hover(r: Mapping[str, Any]) -> str:
    return (
        f"{txt(r.get('tag'))}<br>step {r.get('step')} · exec {r.get('exec_order')} · "
        f"{r.get('status')} · max |Δ| {fmt_num(r.get('max_abs_diff'))}"
    )


def _cache_hits(points: Sequence[Mapping[str, Any]], floor: float) -> list[dict[str, Any]]:
    """Cache hits as a rug of blue ticks half a decade under the floor (never hiding points)."""
    idx = [i for i, r in enumerate(points) if r.get("cache_hit") is True]
    if not idx:
        return []
    marker = {"symbol": "line-ns-open", "size": 9, "color": "#1e88e5", "line": {"width": 2}}
    return [
        _trace(
            idx,
            [r4(floor / 3.16)] * len(idx),
            mode="markers",
            name="cache hit",
            marker=marker,
            hovertemplate="#%{x}: cache hit<extra></extra>",
        )
    ]


def _roots(roots: Sequence[tuple[int, str]], yd: list) -> list[dict[str, Any]]:
    if not roots:
        return []
    marker = {
        "symbol": "star",
        "size": 17,
        "color": "#ffb300",
        "line": {"color": "#5d4037", "width": 1},
    }
    return [
        _trace(
            [x for x, _ in roots],
            [yd[x] for x, _ in roots],
            mode="markers",
            name="root-cause op",
            text=[t for _, t in roots],
            hovertemplate="%{text}<extra></extra>",
            marker=marker,
        )
    ]


def _steps(points: Sequence[Mapping[str, Any]]) -> tuple[list[dict], list[dict]]:
    """Dotted separators between steps, labelled (at most ~25 labels)."""
    starts = [
        (i, r.get("step"))
        for i, r in enumerate(points)
        if i == 0 or r.get("step") != points[i - 1].get("step")
    ]
    if len(starts) < 2:
        return [], []
    every = max(1, math.ceil(len(starts) / 25))
    shapes = [vline(i - 0.5, "#cfd8dc") for i, _ in starts if i]
    notes = [
        {
            "x": i,
            "y": 0.36,
            "xref": "x",
            "yref": "paper",
            "xanchor": "left",
            "yanchor": "bottom",
            "text": f"step {step}",
            "showarrow": False,
            "font": {"size": 10, "color": "#78909c"},
        }
        for n, (i, step) in enumerate(starts)
        if n % every == 0
    ]
    return shapes, notes


def histogram_figure(hist: Mapping[str, Any]) -> dict[str, Any]:
    """Step-line histogram of elementwise |Δ| (log x when the edges are positive)."""
    edges = [r4(float(e)) for e in hist["edges"]]
    counts = [int(c) for c in hist["counts"]]
    log = hist.get("scale", "log") == "log" and edges[0] > 0
    trace = {
        "type": "scatter",
        "x": edges,
        "y": [*counts, counts[-1]],
        "mode": "lines",
        "line": {"shape": "hv", "color": "#c62828"},
        "fill": "tozeroy",
        "fillcolor": "rgba(198,40,40,0.25)",
        "hovertemplate": "|Δ| from %{x:.3g}: %{y} elements<extra></extra>",
        "name": "elements",
    }
    layout = base_layout(
        showlegend=False,
        margin={"l": 72, "r": 20, "t": 20, "b": 50},
        xaxis=axis(
            type="log" if log else "linear",
            title={"text": "|candidate − reference|"},
            exponentformat="e",
        ),
        yaxis=axis(title={"text": "elements"}, rangemode="tozero"),
    )
    return {"data": [trace], "layout": layout}


# ---------------------------------------------------------------------------------------------
# Nightly history


def history_figure(
    labels: Sequence[str],
    diffs: Sequence[float | None],
    failing: Sequence[int | None],
    regression: Sequence[bool],
    hover: Sequence[str],
) -> dict[str, Any]:
    """Output max |Δ| (log) over failing-tensor bars, one category per run, regressions marked."""
    floor, _ = log_floor(diffs)
    y = [None if d is None else floor if d == 0 else r4(d) for d in diffs]
    data = [
        {
            "type": "scatter",
            "x": list(labels),
            "y": y,
            "mode": "lines+markers",
            "name": "output max |Δ|",
            "text": list(hover),
            "hovertemplate": "%{text}<extra></extra>",
            "line": {"color": "#1e88e5"},
            "marker": {"symbol": [_symbol(d) if d is not None else "circle" for d in diffs]},
        },
        {
            "type": "bar",
            "x": list(labels),
            "y": list(failing),
            "xaxis": "x2",
            "yaxis": "y2",
            "name": "tensors failing",
            "text": list(hover),
            "textposition": "none",
            "hovertemplate": "%{text}<extra></extra>",
            "marker": {"color": ["#c62828" if (f or 0) > 0 else "#90a4ae" for f in failing]},
        },
    ]
    reg = [i for i, r in enumerate(regression) if r]
    shapes = []
    if reg:
        data.append(
            {
                "type": "scatter",
                "x": [labels[i] for i in reg],
                "y": [y[i] if y[i] is not None else floor for i in reg],
                "mode": "markers",
                "name": "regression",
                "hoverinfo": "skip",
                "marker": {
                    "symbol": "x",
                    "size": 14,
                    "color": "#b71c1c",
                    "line": {"width": 2, "color": "#b71c1c"},
                },
            }
        )
        shapes = [vline(i, "#e57373", "dash") for i in reg]
    layout = base_layout(
        shapes=shapes,
        margin={"l": 72, "r": 20, "t": 40, "b": 60},
        **two_panels(
            {"type": "log", "title": {"text": "output max |Δ|"}, "exponentformat": "e"},
            {"title": {"text": "failing"}, "rangemode": "tozero"},
            "commit (oldest → newest)",
            0.36,
        ),
    )
    layout["xaxis"]["type"] = layout["xaxis2"]["type"] = "category"
    return {"data": data, "layout": layout}


def heatmap_figure(
    tags: Sequence[str],
    commits: Sequence[str],
    cell: Callable[[str, str], str | None],
    statuses: Sequence[str],
) -> dict[str, Any]:
    """Status heatmap: one row per tag, one column per commit, one colour per status."""
    codes = {s: i for i, s in enumerate(statuses)}
    z = [[codes.get(cell(t, c) or "") for c in commits] for t in tags]
    text = [[cell(t, c) or "not recorded" for c in commits] for t in tags]
    k = len(statuses)
    scale: list[list[Any]] = []
    for i, s in enumerate(statuses):
        scale += [[i / k, STATUS_MARKERS[s]], [(i + 1) / k, STATUS_MARKERS[s]]]
    trace = {
        "type": "heatmap",
        "z": z,
        "x": [txt(c) for c in commits],
        "y": [txt(t) for t in tags],
        "text": text,
        "zmin": -0.5,
        "zmax": k - 0.5,
        "colorscale": scale,
        "xgap": 1,
        "ygap": 1,
        "showscale": False,
        "hovertemplate": "%{y}<br>commit %{x}: %{text}<extra></extra>",
    }
    layout = base_layout(
        margin={"l": 20, "r": 20, "t": 20, "b": 60},
        xaxis=axis(type="category", title={"text": "commit (oldest → newest)"}),
        yaxis=axis(type="category", autorange="reversed", automargin=True),
    )
    return {"data": [trace], "layout": layout}
