"""The run report (``report.html``): one parity run, readable at a glance.

Sections, top to bottom: the verdict bar; the run's settings, commit and comparison mode with
its reason; where parity breaks (first divergence and root-cause ops, plain HTML); status
counts; the error-propagation chart (max abs diff on a log scale and SQNR of every module output
in execution order, steps concatenated); the ops of the first divergent module; the histogram of
elementwise differences of the worst tensor; the module table (sortable, filterable, with links
to the dumped tensors).

The histogram needs elementwise data, which the tables do not hold. It is taken from
``summary["worst_tensor_histogram"]`` (what :func:`diff_histogram` returns, for the pair
:func:`pick_worst` names) when the run recorded one, else computed from the run's local dump
(``dump_dir``: ``index.json`` + both sides' ``.npy``), else the section says it is not
available.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from parity_tracker.compare import STATUSES
from parity_tracker.dashboards._page import (
    FAILING,
    PASSING,
    chips,
    esc,
    figure_block,
    finite,
    fmt_num,
    fmt_shape,
    link,
    page,
    status_badge,
)
from parity_tracker.dashboards.charts import histogram_figure, propagation_figure, txt

#: Row kinds drawn on the error-propagation chart (module outputs and hand-registered tensors).
CHART_KINDS = frozenset({"output", "manual"})
STATUS_ORDER = STATUSES
#: Most ops listed for the first divergent module (the rest are counted in a note).
MAX_OP_ROWS = 400
_KINDS = ("param", "buffer", "input", "output", "op", "manual")


def render_run_report(result: Any, *, tensor_base_url: str = "") -> str:
    """Render one parity run as a self-contained HTML page (the run's ``report.html``).

    Args:
        result: a ``parity_tracker.run.RunResult`` or any object with its attributes:
            ``modules`` (``pyarrow.Table``, ``tables.MODULES_SCHEMA``; None or empty for a run
            that failed before comparing), ``ops`` (``tables.OPS_SCHEMA``; may be None or
            empty), ``summary`` (dict, below), optionally ``settings`` (dict; falls back to
            ``summary["settings"]``), ``run_id``, ``tracking_run_id`` and ``dump_dir`` (local
            folder of one check's dump, ``index.json`` + ``.npy``). Summary keys read, all
            optional: ``passed`` (bool; derived from the statuses when absent),
            ``first_divergence`` ({tag, module, step, exec_order}; derived from the table when
            absent), ``root_causes`` (ops-table rows as dicts; derived from ``ops.root_cause``
            when absent), ``output_max_abs_diff``, ``output_sqnr_db``, ``mode``,
            ``mode_reason``, ``settings``, ``environment`` (``git_commit``, ``git_branch``,
            ``git_dirty``, ...), ``error`` ({type, message, side} or a string), ``expected``
            (reason, when the divergence is on the expected list), ``worst_tensor_histogram``
            (from :func:`diff_histogram`).
        tensor_base_url: prefix joined to each row's artifact-relative ``dump_path``
            (``tensors/….npy``) to link the dumped tensor. The default ``""`` gives links
            relative to the page, right where ``report.html`` sits at the artifact root; pass an
            absolute prefix (e.g. ``{server}/get-artifact?run_uuid={id}&path=``) for links that
            work from anywhere.

    Returns:
        The HTML document (about 2.0 MB of compressed plotly.js plus about 0.45 kB per row).

    The worst-tensor histogram comes from ``summary["worst_tensor_histogram"]`` when present,
    else it is computed from ``dump_dir`` when the worst tensor (:func:`pick_worst`) was dumped
    on both sides, else the section says it is not available.
    """
    modules = _in_exec_order(_rows(getattr(result, "modules", None)))
    ops = _rows(getattr(result, "ops", None))
    summary = dict(getattr(result, "summary", None) or {})
    settings = dict(getattr(result, "settings", None) or summary.get("settings") or {})
    summary.setdefault("run_id", getattr(result, "run_id", None))
    summary.setdefault("tracking_run_id", getattr(result, "tracking_run_id", None))
    first = _first_divergence(summary, modules)
    roots = list(summary.get("root_causes") or [r for r in ops if r.get("root_cause")])
    counts = Counter(r.get("status") or "—" for r in modules)
    hist = summary.get("worst_tensor_histogram") or _histogram_from_dump(
        getattr(result, "dump_dir", None), pick_worst(modules)
    )
    title = f"parity: {settings.get('target', '?')} vs {settings.get('candidate', '?')}"
    body = "".join(
        [
            _header(settings, summary),
            _where_it_breaks(first, roots, modules, summary),
            "<h2>Status counts</h2>" + chips(counts, STATUS_ORDER),
            _propagation_section(modules, first, roots),
            _ops_section(ops, first),
            _histogram_section(hist),
            _modules_section(modules, first, tensor_base_url),
        ]
    )
    return page(title, _verdict(summary, modules, counts, first), body, charts=True, tables=True)


# ---------------------------------------------------------------------------------------------
# Data helpers


def _rows(table: Any) -> list[dict[str, Any]]:
    """A pyarrow table (or list of dicts, or None) as a list of row dicts."""
    if table is None:
        return []
    if hasattr(table, "to_pylist"):
        return table.to_pylist()
    return [dict(r) for r in table]


def _order_key(row: Mapping[str, Any]) -> tuple[int, int]:
    step = row.get("step")
    order = row.get("exec_order")
    return (0 if step is None else int(step), 2**31 if order is None else int(order))


def _in_exec_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows sorted by (step, exec_order), stable, with ``_i`` = position in that order."""
    rows = sorted(rows, key=_order_key)
    for i, row in enumerate(rows):
        row["_i"] = i
    return rows


def _is_failing(row: Mapping[str, Any]) -> bool:
    return row.get("status") in FAILING


def _first_divergence(
    summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """``summary["first_divergence"]``, else the first failing row in execution order."""
    fd = summary.get("first_divergence")
    if fd:
        return dict(fd)
    for row in rows:
        if _is_failing(row):
            return {k: row.get(k) for k in ("tag", "module", "step", "exec_order")}
    return None


def _row_of(first: Mapping[str, Any] | None, rows: Sequence[Mapping[str, Any]]) -> dict | None:
    """The table row of the first divergence (same tag, and same step when given)."""
    if not first:
        return None
    for row in rows:
        if row.get("tag") == first.get("tag") and (
            first.get("step") is None or row.get("step") == first.get("step")
        ):
            return dict(row)
    return None


def pick_worst(modules: Any) -> dict[str, Any] | None:
    """The worst failing tensor of a run: the one whose histogram the report shows.

    Among rows with status ``mismatch`` the lowest ``sqnr_db`` (scale-free: signal power over
    error power), ties and null SQNR broken by the largest ``max_abs_diff``.

    Args:
        modules: the ``modules`` table (``pyarrow.Table``) or a list of row dicts.

    Returns:
        That row as a dict (``tag``, ``step``, ...), or None when no row is a ``mismatch``.
    """
    rows = [r for r in _rows(modules) if r.get("status") == "mismatch"]
    if not rows:
        return None

    def badness(r: Mapping[str, Any]) -> tuple[float, float]:
        sqnr = finite(r.get("sqnr_db"))
        diff = finite(r.get("max_abs_diff"))
        return (math.inf if sqnr is None else sqnr, -(diff or 0.0))

    return min(rows, key=badness)


def diff_histogram(
    reference: Any,
    candidate: Any,
    *,
    tag: str | None = None,
    step: int | None = None,
    bins: int = 48,
) -> dict[str, Any]:
    """Histogram of the elementwise absolute differences ``|candidate - reference|``.

    Computed in float64 numpy. Exact zeros are counted apart (a log axis cannot show them);
    non-zero differences go into ``bins`` bins equally wide in log10 between the smallest and the
    largest non-zero difference. Elements where either side is NaN or inf are counted in
    ``nonfinite`` and left out of the bins.

    Args:
        reference: the reference tensor (numpy array, torch tensor, or array-like).
        candidate: the candidate tensor, same shape as ``reference``.
        tag: the tensor's tag, shown as the chart's subject.
        step: its step in a multi-step run.
        bins: number of log-spaced bins (≥ 1).

    Returns:
        ``{"tag", "step", "numel", "zero_count", "nonfinite", "edges", "counts", "scale"}``
        with ``edges`` (``len(counts) + 1`` floats, ascending) and ``counts`` (ints), ``scale``
        ``"log"``. Store it as ``summary["worst_tensor_histogram"]``.

    Raises:
        ValueError: the shapes differ or ``bins`` < 1.
    """
    r, c = _float64(reference), _float64(candidate)
    if r.shape != c.shape:
        raise ValueError(
            f"diff_histogram: reference shape {r.shape} != candidate shape {c.shape}; "
            "a histogram of elementwise differences needs equal shapes"
        )
    if bins < 1:
        raise ValueError(f"diff_histogram: bins must be >= 1, got {bins}")
    ok = np.isfinite(r) & np.isfinite(c)
    d = np.abs(c[ok] - r[ok])
    nonzero = d[d > 0]
    out: dict[str, Any] = {
        "tag": tag,
        "step": step,
        "numel": int(r.size),
        "zero_count": int(d.size - nonzero.size),
        "nonfinite": int(r.size - d.size),
        "scale": "log",
        "edges": [],
        "counts": [],
    }
    if nonzero.size:
        lo, hi = float(nonzero.min()), float(nonzero.max())
        if hi <= lo * (1 + 1e-9):
            lo, hi = lo / 3.0, hi * 3.0
        edges = np.logspace(np.log10(lo), np.log10(hi), bins + 1)
        edges[0], edges[-1] = lo, hi  # exact ends: every value lands in a bin
        counts, _ = np.histogram(nonzero, bins=edges)
        out["edges"] = [float(e) for e in edges]
        out["counts"] = [int(n) for n in counts]
    return out


def worst_tensor_histogram(result: Any) -> dict | None:
    """:func:`diff_histogram` of the worst tensor (:func:`pick_worst`) read from the run's dump.

    Returns None when the run has no local dump or the worst tensor was not dumped.
    """
    return _histogram_from_dump(getattr(result, "dump_dir", None), pick_worst(result.modules))


def _histogram_from_dump(dump_dir: Any, worst: Mapping[str, Any] | None) -> dict | None:
    """:func:`diff_histogram` of ``worst`` read back from a dump folder, or None.

    Reads ``index.json`` (``parity_tracker.dump`` format: entries with ``tag``, ``step``,
    ``side`` 0 = reference / 1 = candidate, ``file``); quantized entries (stored as their
    integer representation) are not used. Any read problem gives None: the report never fails
    on a missing or partial dump.
    """
    if not dump_dir or not worst:
        return None
    folder = Path(dump_dir)
    try:
        entries = json.loads((folder / "index.json").read_text())["files"]
        step = worst.get("step") or 0
        mine = {
            e.get("side"): e
            for e in entries
            if e.get("tag") == worst.get("tag")
            and (e.get("step") or 0) == step
            and "file" in e
            and "qscheme" not in e
        }
        if 0 not in mine or 1 not in mine:
            return None
        ref = np.load(folder / mine[0]["file"], allow_pickle=False)
        cand = np.load(folder / mine[1]["file"], allow_pickle=False)
        return diff_histogram(ref, cand, tag=worst.get("tag"), step=worst.get("step"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _float64(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor, without importing torch
        x = x.detach().cpu()
        if x.is_complex():
            x = x.abs()
        x = x.double().numpy()
    return np.asarray(x, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# Plain-HTML sections


def error_text(error: Any) -> str:
    """A run error (``{type, message, side}`` dict or a string) as one line of text."""
    if not error:
        return ""
    if isinstance(error, Mapping):
        side = f" (on the {error['side']} side)" if error.get("side") else ""
        kind = f"{error['type']}: " if error.get("type") else ""
        return f"{kind}{error.get('message') or ''}{side}"
    return str(error)


def _verdict(
    summary: Mapping[str, Any],
    modules: Sequence[Mapping[str, Any]],
    counts: Mapping[str, int],
    first: Mapping[str, Any] | None,
) -> str:
    failing = sum(n for s, n in counts.items() if s in FAILING)
    total = len(modules)
    passed = summary.get("passed")
    broken = (not passed) if passed is not None else failing > 0
    if summary.get("error"):
        cls, word, line = "v-error", "RUN ERROR", esc(error_text(summary["error"]))
    elif broken and summary.get("expected"):
        cls, word = "v-expected", "EXPECTED DIVERGENCE"
        line = f"{failing} of {total} tensors failing; expected: {esc(summary['expected'])}"
    elif broken:
        cls, word, line = "v-fail", "PARITY FAILS", f"{failing} of {total} tensors failing"
    elif total == 0:
        cls, word, line = "v-neutral", "NOTHING COMPARED", "the run compared no tensor"
    else:
        passing = sum(n for s, n in counts.items() if s in PASSING)
        cls, word, line = "v-pass", "PARITY HOLDS", f"{passing} of {total} tensors pass"
    if first:
        line += (
            f' · first divergence: <a href="#first-divergence"><code>{esc(first.get("tag"))}'
            f"</code></a>{_where(first)}"
        )
    extra = []
    if summary.get("output_max_abs_diff") is not None:
        extra.append(f"output max |Δ| {fmt_num(summary['output_max_abs_diff'])}")
    if summary.get("output_sqnr_db") is not None:
        extra.append(f"output SQNR {fmt_num(summary['output_sqnr_db'])} dB")
    if extra:
        line += " · " + " · ".join(extra)
    return (
        f'<header class="verdict {cls}" id="verdict"><div class="word">{word}</div>'
        f'<div class="line">{line}</div></header>'
    )


def _where(first: Mapping[str, Any]) -> str:
    parts = []
    if first.get("step") is not None:
        parts.append(f"step {first['step']}")
    if first.get("exec_order") is not None:
        parts.append(f"exec #{first['exec_order']}")
    return f" ({', '.join(parts)})" if parts else ""


def _header(settings: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """Title, then a compact grid: commit, mode and why, run ids, every other setting."""
    env = dict(summary.get("environment") or {})
    commit = env.get("git_commit") or settings.get("git_commit")
    if commit and env.get("git_dirty") in (True, "true", "True", 1):
        commit = f"{commit} (dirty)"
    mode = summary.get("mode") or settings.get("mode")
    reason = summary.get("mode_reason")
    items = [
        ("target", settings.get("target")),
        ("candidate", settings.get("candidate")),
        ("commit", commit),
        ("branch", env.get("git_branch")),
        ("parity run", summary.get("run_id")),
        ("MLflow run", summary.get("tracking_run_id")),
    ]
    shown = {"target", "candidate", "mode", *env}
    items += [(k, v) for k, v in settings.items() if k not in shown and v not in ("", None)]
    html = (
        f"<h1>{esc(settings.get('target') or '?')} <span class='note'>vs</span> "
        f"{esc(settings.get('candidate') or '?')}</h1><div class='meta'>"
        + "".join(f"<div><b>{esc(k)}</b><code>{esc(v)}</code></div>" for k, v in items if v)
    )
    if mode:
        html += (
            f"<div class='wide'><b>mode</b><code>{esc(mode)}</code>"
            f"{' — ' + esc(reason) if reason else ''}</div>"
        )
    html += "</div>"
    if env:
        html += (
            "<details><summary>environment</summary><div class='meta'>"
            + "".join(
                f"<div><b>{esc(k)}</b><code>{esc(v)}</code></div>" for k, v in sorted(env.items())
            )
            + "</div></details>"
        )
    return html


def _where_it_breaks(
    first: Mapping[str, Any] | None,
    roots: Sequence[Mapping[str, Any]],
    modules: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
) -> str:
    return '<h2 id="first-divergence">Where parity breaks</h2><section id="where">' + (
        _where_body(first, roots, modules, summary) + "</section>"
    )


def _where_body(
    first: Mapping[str, Any] | None,
    roots: Sequence[Mapping[str, Any]],
    modules: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
) -> str:
    html = ""
    if summary.get("error"):
        html += (
            f'<div class="box bad"><b>The run failed:</b> {esc(error_text(summary["error"]))}</div>'
        )
    if not first:
        if summary.get("error"):
            return html + "<p class='note'>No compared tensor diverged before the run stopped.</p>"
        return html + '<div class="box good">No tensor diverges: every comparison passed.</div>'
    row = _row_of(first, modules) or {}
    anchor = f'<a href="#row-{row["_i"]}">in the table</a>' if "_i" in row else ""
    html += (
        '<div class="box bad"><b>First divergence:</b> '
        f"<code>{esc(first.get('tag'))}</code>{_where(first)} "
        f"in module <code>{esc(first.get('module') or row.get('module') or '—')}</code> "
        f"{status_badge(row.get('status'))} {anchor}<br>"
    )
    if row:
        html += (
            f"max |Δ| {fmt_num(row.get('max_abs_diff'))} · "
            f"max rel {fmt_num(row.get('max_rel_diff'))} · "
            f"SQNR {fmt_num(row.get('sqnr_db'))} dB · "
            f"mismatched {fmt_num(row.get('mismatch_count'))} of {fmt_num(row.get('numel'))} · "
            f"shapes {fmt_shape(row.get('ref_shape'))} → {fmt_shape(row.get('cand_shape'))} · "
            f"dtypes {esc(row.get('ref_dtype'))} → {esc(row.get('cand_dtype'))}"
        )
        if row.get("message"):
            html += f"<br><span class='note'>{esc(row['message'])}</span>"
    html += "</div>"
    if roots:
        html += "<h3>Root-cause ops</h3><ul>"
        for op in roots:
            cause = f" — cause {esc(op['cause'])}" if op.get("cause") else ""
            html += (
                f"<li><code>{esc(op.get('op'))}</code> in <code>{esc(op.get('module'))}</code>"
                f"{_where(op)}: {status_badge(op.get('status'))} "
                f"max |Δ| {fmt_num(op.get('max_abs_diff'))}, inputs "
                f"{esc(op.get('inputs_status') or 'unknown')}{cause}"
                f"{' — ' + esc(op['message']) if op.get('message') else ''}</li>"
            )
        html += "</ul>"
    return html


def _ops_section(ops: Sequence[Mapping[str, Any]], first: Mapping[str, Any] | None) -> str:
    html = "<h2 id='ops'>Ops of the first divergent module</h2>"
    if not first:
        return html + "<p class='note'>No divergence, so no module to open.</p>"
    module = first.get("module")
    mine = [
        r
        for r in ops
        if r.get("module") == module
        and (first.get("step") is None or r.get("step") in (None, first.get("step")))
    ]
    if not mine:
        return html + (
            f"<p class='note'>No per-op capture for <code>{esc(module)}</code> in this run "
            "(run with op capture to list its ops).</p>"
        )
    mine.sort(key=lambda r: (r.get("op_index") is None, r.get("op_index") or 0))
    html += f"<p>Module <code>{esc(module)}</code>: {len(mine)} ops.</p>"
    head = (
        "<tr><th data-sort='num'>#</th><th data-sort='str'>op</th><th data-sort='str'>status"
        "</th><th data-sort='str'>inputs</th><th data-sort='str'>root cause</th>"
        "<th data-sort='num'>max |Δ|</th><th data-sort='num'>SQNR dB</th><th>shape</th>"
        "<th>dtype</th><th>message</th></tr>"
    )
    body = []
    for r in mine[:MAX_OP_ROWS]:
        root = (
            "yes" + (f" ({esc(r['cause'])})" if r.get("cause") else "")
            if r.get("root_cause")
            else ""
        )
        shapes = _pair(fmt_shape(r.get("ref_shape")), fmt_shape(r.get("cand_shape")))
        body.append(
            f"<tr class='{'root' if r.get('root_cause') else ''}'>"
            f"<td class='num'>{esc(r.get('op_index'))}</td>"
            f"<td class='mono'>{esc(r.get('op'))}</td><td>{status_badge(r.get('status'))}</td>"
            f"<td>{esc(r.get('inputs_status'))}</td><td>{root}</td>"
            f"{_num_td(r.get('max_abs_diff'))}{_num_td(r.get('sqnr_db'))}"
            f"<td class='mono'>{shapes}</td>"
            f"<td class='mono'>{_pair(r.get('ref_dtype'), r.get('cand_dtype'))}</td>"
            f"<td class='msg'>{esc(r.get('message'))}</td></tr>"
        )
    note = ""
    if len(mine) > MAX_OP_ROWS:
        note = f"<p class='note'>First {MAX_OP_ROWS} of {len(mine)} ops shown.</p>"
    return (
        html
        + "<div class='scroll'><table class='data sortable' id='ops-table'><thead>"
        + head
        + "</thead><tbody>"
        + "".join(body)
        + "</tbody></table></div>"
        + note
    )


def _num_td(value: Any) -> str:
    return f"<td>{fmt_num(value)}"


def _pair(ref: Any, cand: Any) -> str:
    ref, cand = esc(ref if ref is not None else "—"), esc(cand if cand is not None else "—")
    return ref if ref == cand else f"{ref} → <b>{cand}</b>"


def _modules_section(
    rows: Sequence[Mapping[str, Any]], first: Mapping[str, Any] | None, base_url: str
) -> str:
    html = f"<h2 id='modules'>Modules ({len(rows)} rows, execution order)</h2>"
    if not rows:
        return html + "<p class='note'>No module rows.</p>"
    first_row = _row_of(first, rows)
    statuses = sorted({r.get("status") or "" for r in rows}, key=_status_rank)
    kinds = sorted({r.get("kind") or "" for r in rows} - {""})
    html += (
        f"<div class='controls' data-for='modules-table' data-failing='{','.join(sorted(FAILING))}'"
        " hidden><input type='search' placeholder='filter by tag' aria-label='filter'>"
        "<select name='status' aria-label='status'><option value=''>all statuses</option>"
        "<option value='failing'>failing only</option>"
        + "".join(f"<option>{esc(s)}</option>" for s in statuses)
        + "</select><select name='kind' aria-label='kind'><option value=''>all kinds</option>"
        + "".join(f"<option>{esc(k)}</option>" for k in kinds)
        + "</select><span class='count note'></span>"
        "<span class='note'>click a column header to sort</span></div>"
    )
    head = (
        "<tr><th data-sort='num'>#</th><th data-sort='num'>step</th><th data-sort='num'>exec"
        "</th><th data-sort='str' data-col='tag'>tag</th><th data-sort='str' data-col='kind'>kind"
        "</th><th data-sort='str' data-col='status'>status</th><th data-sort='num'>max |Δ|</th>"
        "<th data-sort='num'>max rel</th><th data-sort='num'>mismatched</th>"
        "<th data-sort='num'>SQNR dB</th><th data-sort='num'>cosine</th><th>shape</th>"
        "<th>dtype</th><th data-sort='str'>cache</th><th data-sort='str'>local</th>"
        "<th>tensor</th><th>message</th></tr>"
    )
    first_i = first_row["_i"] if first_row else -1
    body = [_module_tr(r, first_i, base_url) for r in rows]
    return (
        html
        + "<div class='scroll'><table class='data sortable' id='modules-table'><thead>"
        + head
        + "</thead><tbody>"
        + "".join(body)
        + "</tbody></table></div>"
    )


def _status_rank(status: str) -> int:
    return STATUS_ORDER.index(status) if status in STATUS_ORDER else len(STATUS_ORDER)


def _module_tr(r: Mapping[str, Any], first_i: int, base_url: str) -> str:
    """One module-table row; end tags omitted (valid HTML) to keep 2,000 rows small."""
    status = r.get("status") or ""
    i = r["_i"]
    mism = r.get("mismatch_count")
    numel = r.get("numel")
    frac = f"{mism}/{numel}" if mism is not None and numel else fmt_num(mism)
    cache = {True: "hit", False: "miss"}.get(r.get("cache_hit"), "")
    local = r.get("local_status") or ""
    if local and r.get("local_max_abs_diff") is not None:
        local += f" ({fmt_num(r['local_max_abs_diff'])})"
    head = f"<tr id=row-{i} class=first-div>" if i == first_i else "<tr>"
    shapes = _pair(fmt_shape(r.get("ref_shape")), fmt_shape(r.get("cand_shape")))
    return (
        f"{head}<td>{i}<td>{esc(r.get('step'))}<td>{esc(r.get('exec_order'))}"
        f"<td>{esc(r.get('tag'))}<td>{esc(r.get('kind'))}<td>{status_badge(status)}"
        f"{_num_td(r.get('max_abs_diff'))}{_num_td(r.get('max_rel_diff'))}<td>{frac}"
        f"{_num_td(r.get('sqnr_db'))}{_num_td(r.get('cosine'))}<td>{shapes}"
        f"<td>{_pair(r.get('ref_dtype'), r.get('cand_dtype'))}<td>{cache}<td>{esc(local)}"
        f"<td>{_tensor_links(base_url, r.get('dump_path'))}<td>{esc(r.get('message'))}</tr>"
    )


def _tensor_links(base_url: str, path: str | None) -> str:
    """Link the dumped tensor; for the dump's ``…__ref.npy`` also its ``…__cand.npy`` twin."""
    if not path:
        return ""
    if path.endswith("__ref.npy"):
        twin = path[: -len("__ref.npy")] + "__cand.npy"
        return f"{link(base_url, path, 'ref')} {link(base_url, twin, 'cand')}"
    if path.endswith("__cand.npy"):
        twin = path[: -len("__cand.npy")] + "__ref.npy"
        return f"{link(base_url, twin, 'ref')} {link(base_url, path, 'cand')}"
    return link(base_url, path, "npy")


# ---------------------------------------------------------------------------------------------
# Charts


def _propagation_section(
    rows: Sequence[Mapping[str, Any]],
    first: Mapping[str, Any] | None,
    roots: Sequence[Mapping[str, Any]],
) -> str:
    html = "<h2 id='propagation'>Error propagation</h2>"
    points = [r for r in rows if (r.get("kind") or "output") in CHART_KINDS]
    if not points:
        return html + "<p class='note'>No module outputs to chart.</p>"
    first_x = _first_x(points, first)
    fig, note = propagation_figure(
        points,
        first_x,
        first.get("tag") if first else None,
        _root_xs(points, roots, first, first_x),
    )
    if first_x is not None:
        note += " The red dashed line marks the first divergence"
        note += ", the stars the root-cause ops." if roots else "."
    return (
        html
        + f"<p class='note'>{esc(note)}</p>"
        + figure_block(
            "propagation-chart",
            fig,
            height=580,
            placeholder="Chart not drawn (scripts blocked or still loading); the module table "
            "below holds the same numbers.",
        )
    )


def _first_x(points: Sequence[Mapping[str, Any]], first: Mapping[str, Any] | None) -> int | None:
    """Chart index of the first divergence (for a parameter or input: the next output)."""
    if not first:
        return None
    for i, r in enumerate(points):
        if r.get("tag") == first.get("tag") and (
            first.get("step") is None or r.get("step") == first.get("step")
        ):
            return i
    key = _order_key(first)
    return next((i for i, r in enumerate(points) if _order_key(r) >= key), None)


def _root_xs(
    points: Sequence[Mapping[str, Any]],
    roots: Sequence[Mapping[str, Any]],
    first: Mapping[str, Any] | None,
    first_x: int | None,
) -> list[tuple[int, str]]:
    """(chart index, label) for each root-cause op.

    An op inside the first divergent module or one of its ancestors (the root module ``model``
    contains everything) is drawn at the first divergence, where its error surfaces; any other
    at its own module's output.
    """
    first_module = str((first or {}).get("module") or "")
    out = []
    for op in roots:
        module = str(op.get("module") or "")
        label = txt(f"root cause: {op.get('op')} in {module}")
        if first_x is not None and (
            module in ("", "model", first_module) or first_module.startswith(module + ".")
        ):
            out.append((first_x, label))
            continue
        for i, r in enumerate(points):
            if r.get("module") == module and (
                op.get("step") is None or r.get("step") == op.get("step")
            ):
                out.append((i, label))
                break
    return out


def _histogram_section(hist: Mapping[str, Any] | None) -> str:
    html = "<h2 id='histogram'>Elementwise differences of the worst tensor</h2>"
    if not hist or (not hist.get("counts") and not hist.get("zero_count")):
        return html + (
            "<p class='note' id='histogram-unavailable'>Histogram not available: this run did "
            "not record elementwise differences (<code>summary.worst_tensor_histogram</code> "
            "is absent, e.g. no tensor failed).</p>"
        )
    numel = hist.get("numel") or 0
    zeros = hist.get("zero_count") or 0
    where = f" (step {hist['step']})" if hist.get("step") is not None else ""
    html += (
        f"<p>Tensor <code>{esc(hist.get('tag') or '?')}</code>{where}: {numel} elements, "
        f"{zeros} exactly equal, {hist.get('nonfinite') or 0} non-finite on either side, "
        f"{sum(hist.get('counts') or [])} in the bins below.</p>"
    )
    if not hist.get("counts"):
        return html
    return html + figure_block(
        "histogram-chart",
        histogram_figure(hist),
        height=320,
        placeholder="Histogram not drawn (scripts blocked or still loading).",
    )
