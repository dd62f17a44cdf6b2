"""The nightly dashboards: the settings matrix and the history across commits.

Both are logged to the nightly's parent MLflow run. The matrix is plain HTML (no script at all);
the history page draws one chart per config fingerprint and a status heatmap, with plain-HTML
tables underneath that hold the same numbers.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from parity_tracker.dashboards._page import (
    FAILING,
    STATUS_MARKERS,
    esc,
    figure_block,
    finite,
    fmt_num,
    page,
)
from parity_tracker.dashboards.charts import heatmap_figure, history_figure, txt

#: Cell statuses of the nightly, most serious first.
CELL_STATUSES = ("regression", "error", "fail", "expected", "pass")
_CELL_WORD = {
    "pass": "pass",
    "fail": "fail",
    "regression": "regression",
    "expected": "expected",
    "error": "error",
}
#: Settings that lay out the matrix's columns; other varying settings join the row label.
MATRIX_AXES = ("quantization", "cache")


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
            (str, e.g. the error or the expected-divergence reason), ``commit`` (str).
        title: the page heading.

    Returns:
        A self-contained HTML page (no script). Links are plain ``<a href>`` (inside MLflow's
        sandboxed artifact iframe they navigate that frame).

    Raises:
        ValueError: a cell's status is not one of the five above.
    """
    for cell in cells:
        if cell.get("status") not in _CELL_WORD:
            raise ValueError(
                f"render_matrix: cell {cell.get('run_id')!r} has status {cell.get('status')!r}; "
                f"expected one of {sorted(_CELL_WORD)}"
            )
    counts = Counter(c["status"] for c in cells)
    banner = _matrix_banner(counts, len(cells))
    body = f"<h1>{esc(title)}</h1>"
    commits = sorted({str(c["commit"]) for c in cells if c.get("commit")})
    if commits:
        body += f"<p>commit {', '.join(f'<code>{esc(c)}</code>' for c in commits)}</p>"
    body += _problems(cells) + "<h2>Settings matrix</h2>" + _matrix_table(cells)
    body += (
        "<p class='note'>Colours: <span class='cs c-pass'>&nbsp;pass&nbsp;</span> "
        "<span class='cs c-fail'>&nbsp;fail&nbsp;</span> "
        "<span class='cs c-regression'>&nbsp;regression&nbsp;</span> "
        "<span class='cs c-expected'>&nbsp;expected&nbsp;</span> "
        "<span class='cs c-error'>&nbsp;error&nbsp;</span>. A cell links to its run on a "
        "tracking server (on the embedded store, hover for the run id).</p>"
    )
    return page(title, banner, body, charts=False, tables=False)


def _matrix_banner(counts: Mapping[str, int], total: int) -> str:
    if counts.get("regression"):
        cls, word = "v-regression", "REGRESSION"
    elif counts.get("error"):
        cls, word = "v-error", "ERRORS"
    elif counts.get("fail"):
        cls, word = "v-fail", "PARITY FAILS"
    elif total == 0:
        cls, word = "v-neutral", "NO RUNS"
    else:
        cls, word = "v-pass", "PARITY HOLDS"
    line = " · ".join(f"{counts[s]} {s}" for s in CELL_STATUSES if counts.get(s))
    return (
        f'<header class="verdict {cls}" id="verdict"><div class="word">{word}</div>'
        f'<div class="line">{total} runs: {line or "none"}</div></header>'
    )


def _problems(cells: Sequence[Mapping[str, Any]]) -> str:
    bad = [c for c in cells if c["status"] in ("regression", "error", "fail")]
    if not bad:
        return "<div class='box good'>Every run passes or diverges as expected.</div>"
    bad.sort(key=lambda c: (CELL_STATUSES.index(c["status"]), str(c.get("target"))))
    items = []
    for c in bad:
        where = (
            f" — first divergence <code>{esc(c['first_divergence'])}</code>"
            if c.get("first_divergence")
            else ""
        )
        msg = f" — {esc(c['message'])}" if c.get("message") else ""
        msg = msg.removeprefix(" — ") if c["status"] == "error" else msg
        name = f"{esc(c.get('target'))} {esc(_settings_label(c.get('settings') or {}))}"
        name = f"<a href='{esc(c['url'])}'>{name}</a>" if c.get("url") else name
        numbers = _numbers(c, ", ") if c["status"] != "error" else ""
        items.append(
            f"<li><span class='cs c-{c['status']}'>&nbsp;{c['status']}&nbsp;</span> {name}: "
            f"{numbers}{where}{msg}</li>"
        )
    return "<h2>Where parity broke</h2><div class='box bad'><ul>" + "".join(items) + "</ul></div>"


def _settings_label(settings: Mapping[str, Any], skip: Sequence[str] = ()) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(settings.items()) if k not in skip)


def _axis_value(cell: Mapping[str, Any], axis: str) -> str:
    default = {"quantization": "none", "cache": "off"}[axis]
    value = (cell.get("settings") or {}).get(axis)
    return default if value in (None, "") else str(value)


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


def _matrix_table(cells: Sequence[Mapping[str, Any]]) -> str:
    if not cells:
        return "<p class='note'>No runs.</p>"
    labels = _row_labels(cells)
    quants = _ordered([_axis_value(c, "quantization") for c in cells], "none")
    caches = _ordered([_axis_value(c, "cache") for c in cells], "off")
    grid: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for label, c in zip(labels, cells, strict=True):
        grid[(label, _axis_value(c, "quantization"), _axis_value(c, "cache"))].append(c)
    head1 = "<tr><th rowspan='2'>target</th>" + "".join(
        f"<th colspan='{len(caches)}'>quantization={esc(q)}</th>" for q in quants
    )
    head2 = "<tr>" + "".join(f"<th>cache={esc(k)}</th>" for _ in quants for k in caches)
    rows = []
    for label in sorted(set(labels)):
        tds = []
        for q in quants:
            for k in caches:
                found = grid.get((label, q, k), [])
                tds.append(_cell_td(found) if found else "<td class='empty'>—</td>")
        rows.append(f"<tr><th>{esc(label)}</th>{''.join(tds)}</tr>")
    return (
        "<div class='scroll'><table class='matrix' id='matrix'><thead>"
        + head1
        + "</tr>"
        + head2
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )


def _cell_td(found: Sequence[Mapping[str, Any]]) -> str:
    worst = min(found, key=lambda c: CELL_STATUSES.index(c["status"]))
    parts = []
    for c in found:
        inner = f"<span class='cs'>{esc(c['status'])}</span><br>" + _numbers(c, "<br>")
        if c.get("first_divergence") and c["status"] != "pass":
            inner += f"<br><span class='mono'>{esc(_short(c['first_divergence']))}</span>"
        title = esc(c.get("message") or c.get("run_id") or "")
        if c.get("url"):
            parts.append(f"<a href='{esc(c['url'])}' title='{title}'>{inner}</a>")
        else:
            parts.append(f"<div class='inner' title='{title}'>{inner}</div>")
    return (
        f"<td class='cell c-{worst['status']}' data-status='{esc(worst['status'])}'>"
        + "".join(parts)
        + "</td>"
    )


def _numbers(cell: Mapping[str, Any], sep: str) -> str:
    """``N failing`` and ``max |Δ| x``; for an error cell without numbers, its message."""
    failing, diff = cell.get("tensors_failing"), cell.get("output_max_abs_diff")
    if failing is None and diff is None:
        return esc(_short(str(cell.get("message") or "no result"), 60))
    return f"{fmt_num(failing)} failing{sep}max |Δ| {fmt_num(diff)}"


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
            ``url`` (link to the run), ``first_divergence`` (tag str).
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
    for run in sorted(runs, key=_time_key):
        groups[str(run.get("fingerprint"))].append(run)
    regressions = [r for r in runs if r.get("regression")]
    banner = _history_banner(regressions, groups)
    ordered = sorted(groups.items(), key=lambda kv: _interest(kv[1]))
    charted = [(fp, g) for fp, g in ordered if not _exact(g)]
    body = f"<h1>{esc(title)}</h1>" + _regression_list(regressions)
    body += _overview(ordered, {fp: n for n, (fp, _) in enumerate(charted)})
    if tag_status:
        body += _heatmaps(tag_status, runs, max_heatmap_tags)
    for n, (fingerprint, group) in enumerate(charted):
        body += _fingerprint_section(n, fingerprint, group)
    charts = bool(charted) or bool(tag_status)
    return page(title, banner, body, charts=charts, tables=False)


def _exact(group: Sequence[Mapping[str, Any]]) -> bool:
    """Every run of the configuration bitwise equal: zero output error, nothing failing."""
    return all(
        not r.get("regression")
        and (r.get("tensors_failing") or 0) == 0
        and (finite(r.get("output_max_abs_diff")) or 0.0) == 0.0
        for r in group
    )


def _interest(group: Sequence[Mapping[str, Any]]) -> tuple[int, int, int, str]:
    """Sort key: regressed configurations first, then failing, then inexact, then exact."""
    latest = group[-1]
    return (
        0 if any(r.get("regression") for r in group) else 1,
        0 if (latest.get("tensors_failing") or 0) > 0 else 1,
        1 if _exact(group) else 0,
        f"{latest.get('target')} {_settings_label(latest.get('settings') or {})}",
    )


def _overview(
    ordered: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], charted: Mapping[str, int]
) -> str:
    """One plain-HTML row per configuration: its latest run and its trend."""
    rows = []
    for fp, group in ordered:
        first, latest = group[0], group[-1]
        name = f"{latest.get('target')} {_settings_label(latest.get('settings') or {})}"
        name = esc(name)
        if fp in charted:
            name = f"<a href='#fp-{charted[fp]}'>{name}</a>"
        regs = sum(bool(r.get("regression")) for r in group)
        trend = (
            "bitwise equal at every commit"
            if _exact(group)
            else f"{fmt_num(first.get('output_max_abs_diff'))} → "
            f"{fmt_num(latest.get('output_max_abs_diff'))}"
        )
        cls = " class='reg'" if regs else ""
        rows.append(
            f"<tr{cls}><td>{name}</td><td class='num'>{len(group)}</td>"
            f"<td class='mono'>{esc(_short_commit(latest.get('commit')))}</td>"
            f"<td class='num'>{fmt_num(latest.get('tensors_failing'))}</td>"
            f"<td>{trend}</td><td class='num'>{regs or ''}</td></tr>"
        )
    return (
        "<h2>Configurations</h2><div class='scroll'><table class='data' id='overview'><thead>"
        "<tr><th>configuration</th><th>runs</th><th>latest commit</th><th>failing now</th>"
        "<th>output max |Δ|, first → latest</th><th>regressions</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )


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


def _history_banner(regressions: Sequence[Mapping[str, Any]], groups: Mapping) -> str:
    if regressions:
        cls, word = "v-regression", "REGRESSION"
        line = f"{len(regressions)} regressed run(s) across {len(groups)} configurations"
    elif not groups:
        cls, word, line = "v-neutral", "NO HISTORY", "no runs recorded"
    else:
        cls, word = "v-pass", "NO REGRESSION"
        line = f"{len(groups)} configurations tracked"
    return (
        f'<header class="verdict {cls}" id="verdict"><div class="word">{word}</div>'
        f'<div class="line">{line}</div></header>'
    )


def _regression_list(regressions: Sequence[Mapping[str, Any]]) -> str:
    if not regressions:
        return "<div class='box good'>No run regressed against its baseline.</div>"
    items = []
    for r in sorted(regressions, key=_time_key):
        name = f"{esc(r.get('target'))} {esc(_settings_label(r.get('settings') or {}))}"
        run = f"<a href='{esc(r['url'])}'>run</a>" if r.get("url") else esc(r.get("run_id"))
        where = (
            f", first divergence <code>{esc(r['first_divergence'])}</code>"
            if r.get("first_divergence")
            else ""
        )
        items.append(
            f"<li>{name} at commit <code>{esc(_short_commit(r.get('commit')))}</code> ({run}): "
            f"{fmt_num(r.get('tensors_failing'))} tensors failing, output max |Δ| "
            f"{fmt_num(r.get('output_max_abs_diff'))}{where}</li>"
        )
    return "<h2>Regressions</h2><div class='box bad'><ul>" + "".join(items) + "</ul></div>"


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


def _fingerprint_section(n: int, fingerprint: str, group: Sequence[Mapping[str, Any]]) -> str:
    first = group[-1]
    name = f"{first.get('target')} {_settings_label(first.get('settings') or {})}"
    html = (
        f"<h2 id='fp-{n}'>{esc(name)}</h2><p class='note'>fingerprint <code>{esc(fingerprint)}"
        f"</code> · {len(group)} runs</p>"
    )
    html += figure_block(
        f"history-chart-{n}",
        _history_figure(group),
        height=380,
        placeholder="Chart not drawn (scripts blocked or still loading); the table below "
        "holds the same numbers.",
    )
    if any(finite(r.get("output_max_abs_diff")) == 0.0 for r in group):
        html += (
            "<p class='note'>Hollow markers: output bitwise equal (0), drawn a decade under the "
            "smallest non-zero error.</p>"
        )
    rows = []
    for label, r in zip(_x_labels(group), group, strict=True):
        run = (
            f"<a href='{esc(r['url'])}'>{esc(r.get('run_id'))}</a>"
            if r.get("url")
            else esc(r.get("run_id"))
        )
        reg = "<b style='color:#b71c1c'>regression</b>" if r.get("regression") else ""
        rows.append(
            f"<tr><td class='mono'>{esc(label)}</td><td>{esc(_time_label(r))}</td>"
            f"<td class='num'>{fmt_num(r.get('tensors_failing'))}</td>"
            f"<td class='num'>{fmt_num(r.get('output_max_abs_diff'))}</td><td>{reg}</td>"
            f"<td class='mono'>{run}</td></tr>"
        )
    return html + (
        "<details><summary>runs table</summary><table class='data'><thead><tr><th>commit</th>"
        "<th>start (UTC)</th><th>failing</th><th>output max |Δ|</th><th></th><th>run</th>"
        "</tr></thead><tbody>" + "".join(rows) + "</tbody></table></details>"
    )


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


_HEAT_STATUSES = (
    "equal",
    "close",
    "skipped",
    "mismatch",
    "shape_mismatch",
    "missing_reference",
    "missing_candidate",
    "error",
)


def _heatmaps(
    tag_status: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]], cap: int
) -> str:
    order: list[str] = []
    for r in sorted(runs, key=_time_key):
        c = str(r.get("commit"))
        if c not in order:
            order.append(c)
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in tag_status:
        groups[str(row.get("fingerprint") or "")].append(row)
    names = {
        str(r.get("fingerprint")): f"{r.get('target')} {_settings_label(r.get('settings') or {})}"
        for r in runs
    }
    html = "<h2 id='heatmap'>Failing tags across commits</h2>"
    for n, (fingerprint, rows) in enumerate(groups.items()):
        html += _heatmap(n, fingerprint, names.get(fingerprint, ""), rows, order, cap)
    return html


def _heatmap(
    n: int,
    fingerprint: str,
    name: str,
    rows: Sequence[Mapping[str, Any]],
    order: list[str],
    cap: int,
) -> str:
    commits = list(order)
    for r in rows:
        if str(r.get("commit")) not in commits:
            commits.append(str(r.get("commit")))
    status: dict[tuple[str, str], str] = {}
    for r in rows:
        status[(str(r.get("tag")), str(r.get("commit")))] = str(r.get("status"))
    fails = Counter(t for (t, _), s in status.items() if s in FAILING)
    head = f"<h3>{esc(name)}</h3>" if name else ""
    if fingerprint:
        head += f"<p class='note'>fingerprint <code>{esc(fingerprint)}</code></p>"
    if not fails:
        return head + "<p class='note'>No tag failed at any commit.</p>"
    tags = [t for t, _ in sorted(fails.items(), key=lambda kv: (-kv[1], kv[0]))][:cap]
    commits = [c for c in commits if any((t, c) in status for t in tags)]
    full = {_short_commit(c): c for c in commits}
    fig = heatmap_figure(
        tags,
        [_short_commit(c) for c in commits],
        lambda t, c: status.get((t, full[c])),
        _HEAT_STATUSES,
    )
    legend = " ".join(
        f"<span class='chip' style='background:{STATUS_MARKERS[s]};color:#fff'>{s}</span>"
        for s in _HEAT_STATUSES
        if any(s == v for v in status.values())
    )
    note = f"<p class='note'>{len(tags)} of {len(fails)} failing tags shown.</p>"
    return (
        head
        + f"<div class='chips'>{legend}</div>"
        + figure_block(
            f"heatmap-{n}",
            fig,
            height=min(1400, 120 + 22 * len(tags)),
            placeholder="Heatmap not drawn (scripts blocked or still loading).",
        )
        + (note if len(fails) > len(tags) else "")
    )
