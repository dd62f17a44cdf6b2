"""The nightly dashboards: the settings matrix and the history across commits.

Both are logged to the nightly's parent MLflow run. The matrix is plain HTML (no script at all);
the history page draws one chart per config fingerprint and a status heatmap, with plain-HTML
tables underneath that hold the same numbers. The markup is ``templates/matrix.html.j2`` and
``templates/history.html.j2``; this module prepares their data.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from parity_tracker.statuses import STATUSES, is_failing

from ._page import STATUS_MARKERS, finite, fmt_num, render
from .charts import heatmap_figure, history_figure, txt

#: Cell statuses of the nightly, most serious first.
CELL_STATUSES = ("regression", "error", "fail", "expected", "pass")
#: Settings that lay out the matrix's columns; other varying settings join the row label.
MATRIX_AXES = ("quantization", "cache")
_AXIS_DEFAULTS = {"quantization": "none", "cache": "off"}


def render_matrix(cells: Sequence[Mapping[str, Any]], *, title: str = "Nightly parity") -> str:
    """Render the settings matrix: targets (rows) × quantization × cache (columns).

    Args:
        cells: one dict per run of the nightly. Keys: ``target`` (str), ``settings`` (dict; its
            ``quantization`` and ``cache`` pick the column, default ``"none"`` / ``"off"``;
            any other setting that varies between cells of one target joins the row label),
            ``run_id`` (str), ``status`` (``"pass" | "fail" | "regression" | "expected" |
            "error"``), ``tensors_failing`` (int or None), ``output_max_abs_diff`` (float or
            None), ``url`` (link to the run, e.g. its MLflow page or report; may be None).
            Optional: ``first_divergence`` (tag str), ``output_sqnr_db`` (float), ``message``
            (str, e.g. the error or the expected-divergence reason), ``commit`` (str),
            ``recorded`` (dict: the settings the run recorded; its ``quantization``/``cache``
            pick the column over ``settings``, as the case's own values are what ran).
        title: the page heading.

    Returns:
        A self-contained HTML page (no script). Links are plain ``<a href>`` (inside MLflow's
        sandboxed artifact iframe they navigate that frame).

    Raises:
        ValueError: a cell's status is not one of the five above.
    """
    for cell in cells:
        if cell.get("status") not in CELL_STATUSES:
            raise ValueError(
                f"render_matrix: cell {cell.get('run_id')!r} has status {cell.get('status')!r}; "
                f"expected one of {sorted(CELL_STATUSES)}"
            )
    counts = Counter(c["status"] for c in cells)
    return render(
        "matrix.html.j2",
        title=title,
        charts=False,
        tables=False,
        v=_matrix_banner(counts, len(cells)),
        total=len(cells),
        commits=sorted({str(c["commit"]) for c in cells if c.get("commit")}),
        problems=_problems(cells),
        grid=_matrix_grid(cells),
    )


#: The verdict words of the matrix and history pages (one wording for both).
PARITY_HOLDS, PARITY_FAILS = "PARITY HOLDS", "PARITY FAILS"


def _matrix_banner(counts: Mapping[str, int], total: int) -> dict[str, str]:
    if counts.get("regression"):
        cls, word = "v-regression", "REGRESSION"
    elif counts.get("error"):
        cls, word = "v-error", "ERRORS"
    elif counts.get("fail"):
        cls, word = "v-fail", PARITY_FAILS
    elif total == 0:
        cls, word = "v-neutral", "NO RUNS"
    else:
        cls, word = "v-pass", PARITY_HOLDS
    line = " · ".join(f"{counts[s]} {s}" for s in CELL_STATUSES if counts.get(s))
    return {"cls": cls, "word": word, "line": line}


def _cell_view(cell: Mapping[str, Any]) -> dict[str, Any]:
    """What the templates show of one cell (every key present)."""
    fd = cell.get("first_divergence")
    return {
        "status": cell["status"],
        "name": f"{cell.get('target')} {_settings_label(cell.get('settings') or {})}",
        "url": cell.get("url"),
        "run_id": cell.get("run_id"),
        "message": cell.get("message"),
        "failing": cell.get("tensors_failing"),
        "diff": cell.get("output_max_abs_diff"),
        "first_divergence": fd,
        "short_divergence": _short(fd) if fd else "",
        "no_result": _short(str(cell.get("message") or "no result"), 60),
    }


def _problems(cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The regressed, erroring and failing cells, most serious first."""
    bad = [c for c in cells if c["status"] in ("regression", "error", "fail")]
    bad.sort(key=lambda c: (CELL_STATUSES.index(c["status"]), str(c.get("target"))))
    return [_cell_view(c) for c in bad]


def _settings_label(settings: Mapping[str, Any], skip: Sequence[str] = ()) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(settings.items()) if k not in skip)


def _axis_value(cell: Mapping[str, Any], axis: str) -> str:
    """The cell's column value on ``axis``: recorded by its run, else its matrix setting."""
    value = (cell.get("recorded") or {}).get(axis)
    if value in (None, ""):
        value = (cell.get("settings") or {}).get(axis)
    return _AXIS_DEFAULTS[axis] if value in (None, "") else str(value)


def _row_labels(cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """``target`` plus the non-axis settings that vary among that target's cells."""
    by_target: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for c in cells:
        by_target[str(c.get("target"))].append(c)
    labels = []
    for c in cells:
        peers = by_target[str(c.get("target"))]
        varying = sorted(
            k
            for k in {k for p in peers for k in (p.get("settings") or {})}
            if k not in MATRIX_AXES
            and k != "target"
            and len({str((p.get("settings") or {}).get(k)) for p in peers}) > 1
        )
        extra = " ".join(f"{k}={(c.get('settings') or {}).get(k)}" for k in varying)
        labels.append(f"{c.get('target')} {extra}".strip())
    return labels


def _ordered(values: Sequence[str], first: str) -> list[str]:
    return sorted(set(values), key=lambda v: (v != first, v))


def _matrix_grid(cells: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The matrix layout: column axes and one (label, cells per column) row per target label.

    A column entry is None when no cell falls there, else its cells and ``worst``, the most
    serious of their statuses (it colours the table cell).
    """
    if not cells:
        return None
    labels = _row_labels(cells)
    quants = _ordered([_axis_value(c, "quantization") for c in cells], "none")
    caches = _ordered([_axis_value(c, "cache") for c in cells], "off")
    grid: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for label, c in zip(labels, cells, strict=True):
        grid[(label, _axis_value(c, "quantization"), _axis_value(c, "cache"))].append(c)
    rows = []
    for label in sorted(set(labels)):
        tds = []
        for q in quants:
            for k in caches:
                found = grid.get((label, q, k), [])
                worst = min((c["status"] for c in found), key=CELL_STATUSES.index, default=None)
                tds.append(
                    {"worst": worst, "cells": [_cell_view(c) for c in found]} if found else None
                )
        rows.append((label, tds))
    return {"quants": quants, "caches": caches, "rows": rows}


def _short(tag: str, width: int = 40) -> str:
    return tag if len(tag) <= width else "…" + tag[-(width - 1) :]


# ---------------------------------------------------------------------------------------------
# History


def render_history(
    runs: Sequence[Mapping[str, Any]],
    tag_status: Sequence[Mapping[str, Any]] | None = None,
    *,
    title: str = "Parity history",
    max_heatmap_tags: int = 60,
) -> str:
    """Render the history: per config fingerprint, output error and failing count across commits.

    Args:
        runs: one dict per run. Keys: ``fingerprint`` (str), ``target`` (str), ``settings``
            (dict), ``commit`` (str), ``run_id`` (str), ``start_time`` (epoch milliseconds as
            MLflow reports it, epoch seconds, a ``datetime`` or an ISO string; orders the
            commits), ``tensors_failing`` (int or None), ``output_max_abs_diff`` (float or
            None), ``regression`` (bool: this run regressed against its baseline). Optional:
            ``url`` (link to the run), ``first_divergence`` (tag str), ``position`` (int: the
            commit's place in its configuration's history, ``analysis.history.
            latest_per_commit``: when each commit was first tested; orders the commits instead
            of ``start_time``, so a re-run old commit keeps its place), ``passed`` (bool: the
            run's stored verdict, ``track.RunInfo.passed``; it ranks a configuration failing
            even with 0 tensors failing; absent: failing tensors decide).
        tag_status: optional rows for the status heatmap: ``{tag, commit, status}`` with a
            comparison status (design.md, "Statuses"), optionally ``fingerprint`` (then one
            heatmap per fingerprint). Only tags failing at some commit are drawn, at most
            ``max_heatmap_tags`` of them (those failing most often).
        title: the page heading.
        max_heatmap_tags: cap on heatmap rows.

    Returns:
        A self-contained HTML page: plotly charts plus plain-HTML tables of the same numbers.
    """
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for run in sorted(runs, key=_order_key):
        groups[str(run.get("fingerprint"))].append(run)
    regressions = [r for r in runs if r.get("regression")]
    ordered = sorted(groups.items(), key=lambda kv: _interest(kv[1]))
    charted = [(fp, g) for fp, g in ordered if not _exact(g)]
    return render(
        "history.html.j2",
        title=title,
        charts=bool(charted) or bool(tag_status),
        tables=False,
        v=_history_banner(regressions, groups),
        regressions=[_run_view(r) for r in sorted(regressions, key=_time_key)],
        overview=_overview(ordered, {fp: n for n, (fp, _) in enumerate(charted)}),
        heatmaps=_heatmaps(tag_status, runs, max_heatmap_tags) if tag_status else None,
        sections=[_section(n, fp, g) for n, (fp, g) in enumerate(charted)],
    )


def _run_view(run: Mapping[str, Any]) -> dict[str, Any]:
    """What the templates show of one run (every key present)."""
    return {
        "name": _name(run),
        "commit": _short_commit(run.get("commit")),
        "url": run.get("url"),
        "run_id": "" if run.get("run_id") is None else run["run_id"],
        "failing": run.get("tensors_failing"),
        "diff": run.get("output_max_abs_diff"),
        "regression": bool(run.get("regression")),
        "first_divergence": run.get("first_divergence"),
        "time": _time_label(run),
    }


def _name(run: Mapping[str, Any]) -> str:
    return f"{run.get('target')} {_settings_label(run.get('settings') or {})}"


def _fails(run: Mapping[str, Any]) -> bool:
    """The run's stored verdict: ``passed`` False (see ``render_history``) is a failing run.

    The verdict (tag ``parity.passed``, ``track.store.stored_passed``) also fails a run whose
    failing rule compared no tensor, e.g. an output-only rule, with 0 tensors failing. A run
    given without it falls back to any failing tensor.
    """
    passed = run.get("passed")
    return (run.get("tensors_failing") or 0) > 0 if passed is None else not passed


def _exact(group: Sequence[Mapping[str, Any]]) -> bool:
    """Every run of the configuration bitwise equal: zero output error, nothing failing."""
    return all(
        not r.get("regression")
        and not _fails(r)
        and (r.get("tensors_failing") or 0) == 0
        and (finite(r.get("output_max_abs_diff")) or 0.0) == 0.0
        for r in group
    )


def _interest(group: Sequence[Mapping[str, Any]]) -> tuple[int, int, int, str]:
    """Sort key: regressed configurations first, then failing (the verdict), inexact, exact."""
    latest = group[-1]
    return (
        0 if any(r.get("regression") for r in group) else 1,
        0 if _fails(latest) else 1,
        1 if _exact(group) else 0,
        _name(latest),
    )


def _overview(
    ordered: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], charted: Mapping[str, int]
) -> list[dict[str, Any]]:
    """One row per configuration: its latest run and its trend."""
    return [
        {
            "name": _name(group[-1]),
            "anchor": charted.get(fp),
            "runs": len(group),
            "commit": _short_commit(group[-1].get("commit")),
            "failing": group[-1].get("tensors_failing"),
            "fails": _fails(group[-1]),
            "exact": _exact(group),
            "first_diff": group[0].get("output_max_abs_diff"),
            "latest_diff": group[-1].get("output_max_abs_diff"),
            "regressions": sum(bool(r.get("regression")) for r in group),
        }
        for fp, group in ordered
    ]


def _order_key(run: Mapping[str, Any]) -> tuple[float, float, str]:
    """A configuration's commit order: ``position`` when given, else the start time."""
    pos = run.get("position")
    given = isinstance(pos, int | float) and not isinstance(pos, bool)
    return (float(pos) if given else math.inf, *_time_key(run))


def _time_key(run: Mapping[str, Any]) -> tuple[float, str]:
    t = run.get("start_time")
    if isinstance(t, _dt.datetime):
        return (t.timestamp(), "")
    if isinstance(t, int | float) and not isinstance(t, bool):
        return (float(t) / 1000.0 if t > 1e11 else float(t), "")
    if isinstance(t, str):
        try:
            return (_dt.datetime.fromisoformat(t).timestamp(), "")
        except ValueError:
            return (math.inf, t)
    return (math.inf, "")


def _time_label(run: Mapping[str, Any]) -> str:
    seconds, raw = _time_key(run)
    if math.isinf(seconds):
        return raw
    return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _history_banner(regressions: Sequence[Mapping[str, Any]], groups: Mapping) -> dict[str, str]:
    """The history banner: regressions and the verdict stated apart.

    Regressions are against baselines; the verdict is each configuration's latest run
    (``_fails``), so "no regression" never reads as "parity holds".
    """
    failing = sum(_fails(g[-1]) for g in groups.values())
    verdict = (f"{PARITY_FAILS} ({failing} of {len(groups)} configurations at their latest "
               "commit)") if failing else PARITY_HOLDS  # fmt: skip
    if regressions:
        cls, word = "v-regression", "REGRESSION"
        line = f"{len(regressions)} regressed run(s) across {len(groups)} configurations"
    elif not groups:
        cls, word, line = "v-neutral", "NO HISTORY", "no runs recorded"
    elif failing:
        cls, word = "v-fail", f"NO NEW REGRESSION — {PARITY_FAILS}"
        line = f"{len(groups)} configurations tracked; {verdict}"
    else:
        cls, word = "v-pass", f"NO REGRESSION — {PARITY_HOLDS}"
        line = f"{len(groups)} configurations tracked"
    return {"cls": cls, "word": word, "line": line}


def _short_commit(commit: Any) -> str:
    return "—" if not commit else str(commit)[:10]


def _x_labels(group: Sequence[Mapping[str, Any]]) -> list[str]:
    """One category per run: the short commit, suffixed ``#2``... for reruns of one commit."""
    seen: Counter[str] = Counter()
    out = []
    for r in group:
        c = _short_commit(r.get("commit"))
        seen[c] += 1
        out.append(c if seen[c] == 1 else f"{c} #{seen[c]}")
    return out


def _section(n: int, fingerprint: str, group: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One charted configuration: its chart and the runs table under it."""
    runs = [
        {**_run_view(r), "label": label} for label, r in zip(_x_labels(group), group, strict=True)
    ]
    return {
        "n": n,
        "name": _name(group[-1]),
        "fingerprint": fingerprint,
        "figure": _history_figure(group),
        "has_zero": any(finite(r.get("output_max_abs_diff")) == 0.0 for r in group),
        "runs": runs,
    }


def _history_figure(group: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    hover = [
        f"{txt(r.get('commit'))}<br>{_time_label(r)}<br>run {txt(r.get('run_id'))}<br>"
        f"failing {fmt_num(r.get('tensors_failing'))}, output max |Δ| "
        f"{fmt_num(r.get('output_max_abs_diff'))}"
        + ("<br><b>regression</b>" if r.get("regression") else "")
        for r in group
    ]
    return history_figure(
        _x_labels(group),
        [finite(r.get("output_max_abs_diff")) for r in group],
        [finite(r.get("tensors_failing")) for r in group],
        [bool(r.get("regression")) for r in group],
        hover,
    )


#: Heatmap colour order: passing, neutral, then failing statuses (design.md, "Statuses").
_HEAT_STATUSES = ("equal", "close", "skipped", *(s for s in STATUSES if is_failing(s)))


def _heatmaps(
    tag_status: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]], cap: int
) -> list[dict[str, Any]]:
    """One status heatmap per fingerprint of ``tag_status``, commits in run order."""
    order: list[str] = []
    for r in sorted(runs, key=_time_key):
        c = str(r.get("commit"))
        if c not in order:
            order.append(c)
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in tag_status:
        groups[str(row.get("fingerprint") or "")].append(row)
    names = {str(r.get("fingerprint")): _name(r) for r in runs}
    return [
        _heatmap(n, fingerprint, names.get(fingerprint, ""), rows, order, cap)
        for n, (fingerprint, rows) in enumerate(groups.items())
    ]


def _heatmap(
    n: int,
    fingerprint: str,
    name: str,
    rows: Sequence[Mapping[str, Any]],
    order: list[str],
    cap: int,
) -> dict[str, Any]:
    commits = list(order)
    for r in rows:
        if str(r.get("commit")) not in commits:
            commits.append(str(r.get("commit")))
    status: dict[tuple[str, str], str] = {}
    for r in rows:
        status[(str(r.get("tag")), str(r.get("commit")))] = str(r.get("status"))
    fails = Counter(t for (t, _), s in status.items() if is_failing(s))
    view: dict[str, Any] = {"n": n, "name": name, "fingerprint": fingerprint, "figure": None}
    if not fails:
        return view
    tags = [t for t, _ in sorted(fails.items(), key=lambda kv: (-kv[1], kv[0]))][:cap]
    commits = [c for c in commits if any((t, c) in status for t in tags)]
    full = {_short_commit(c): c for c in commits}
    view["figure"] = heatmap_figure(
        tags,
        [_short_commit(c) for c in commits],
        lambda t, c: status.get((t, full[c])),
        _HEAT_STATUSES,
    )
    present = set(status.values())
    view.update(
        legend=[(s, STATUS_MARKERS[s]) for s in _HEAT_STATUSES if s in present],
        height=min(1400, 120 + 22 * len(tags)),
        shown=len(tags),
        failing=len(fails),
    )
    return view
