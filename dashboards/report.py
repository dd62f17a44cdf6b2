"""The run report (``report.html``): one parity run, readable at a glance.

Sections, top to bottom: the verdict bar; the run's settings, commit and comparison mode with
its reason; where parity breaks (first divergence and root-cause ops, plain HTML); status
counts; the error-propagation chart (max abs diff on a log scale and SQNR of every module output
in execution order, steps concatenated); the ops of the first divergent module; the histogram of
elementwise differences of the worst tensor; the module table (sortable, filterable, with links
to the dumped tensors). The markup is ``templates/report.html.j2``; this module prepares its
data.

The first divergence and the worst tensor are the library's (``compare.verdict``), so the
terminal, the JSON summary and this page name the same tensors. The histogram is taken from
``summary["worst_tensor_histogram"]`` when the run recorded one, else computed from the run's
local dump (``dump_dir``), else the section says why it is missing and how to get it
(:mod:`.histogram`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from parity_tracker.compare.columns import BUDGET_COLUMNS
from parity_tracker.compare.verdict import WORST_ORDER, first_divergence, structure_differences
from parity_tracker.statuses import BUDGET, FAILING, PASSING, STATUSES, is_failing

from ._page import STATUS_COLORS, chip_items, fmt_num, fmt_shape, href, render
from .budget_chart import budget_figure, budget_verdict, is_budget
from .charts import histogram_figure, propagation_figure, txt
from .histogram import (
    diff_histogram,
    histogram_from_dump,
    missing_reason,
    pick_worst,
    worst_tensor_histogram,
)

__all__ = [
    "CHART_KINDS",
    "MAX_OP_ROWS",
    "diff_histogram",
    "error_text",
    "pick_worst",
    "render_run_report",
    "worst_tensor_histogram",
]

#: Row kinds drawn on the error-propagation chart (module outputs and hand-registered tensors).
CHART_KINDS = frozenset({"output", "manual"})
STATUS_ORDER = STATUSES
#: Most one-sided tags named in the structure differences list (the rest are counted).
MAX_STRUCTURE_ROWS = 50
#: Most ops listed for the first divergent module (the rest are counted in a note).
MAX_OP_ROWS = 400
_FIRST_KEYS = ("tag", "module", "step", "exec_order")
_OP_KEYS = (
    "tag", "module", "op", "op_index", "step", "exec_order", "status", "cause", "message",
    "max_abs_diff", "sqnr_db", "inputs_status", "root_cause", "ref_shape", "cand_shape",
    "ref_dtype", "cand_dtype",
)  # fmt: skip
_ROW_KEYS = (
    "tag", "module", "kind", "step", "exec_order", "status", "max_abs_diff", "max_rel_diff",
    "mismatch_count", "numel", "sqnr_db", "cosine", "ref_shape", "cand_shape", "ref_dtype",
    "cand_dtype", "cache_hit", "local_status", "local_max_abs_diff", "dump_path", "message",
    *BUDGET_COLUMNS,
)  # fmt: skip
_HIST_KEYS = ("tag", "step", "numel", "zero_count", "nonfinite", "counts", "edges", "scale")


def render_run_report(result: Any, *, tensor_base_url: str = "") -> str:
    """Render one parity run as a self-contained HTML page (the run's ``report.html``).

    Args:
        result: a ``parity_tracker.run.RunResult`` or any object with its attributes:
            ``modules`` (``pyarrow.Table``, ``tables.MODULES_SCHEMA``; None or empty for a run
            that failed before comparing), ``ops`` (``tables.OPS_SCHEMA``; may be None or
            empty), ``summary`` (a mapping, below), optionally ``settings`` (dict; falls back to
            ``summary["settings"]``), ``run_id``, ``tracking_run_id`` and ``dump_dir`` (local
            folder of one check's dump, ``index.json`` + ``.npy``). Summary keys read, all
            optional: ``passed`` (bool; derived from the statuses when absent),
            ``first_divergence`` ({tag, module, step, exec_order}; derived from the table with
            ``compare.verdict.first_divergence`` when absent), ``root_causes`` (ops-table rows
            as dicts; derived from ``ops.root_cause`` when absent), ``output_max_abs_diff``,
            ``output_sqnr_db``, ``mode``, ``mode_reason``, ``settings``, ``environment``
            (``git_commit``, ``git_branch``, ``git_dirty``, ...), ``error`` ({type, message,
            side} or a string), ``expected`` (reason, when the divergence is on the expected
            list), ``worst_tensor_histogram`` (from :func:`diff_histogram`), ``dump_mode``.
        tensor_base_url: prefix joined to each row's artifact-relative ``dump_path``
            (``tensors/….npy``) to link the dumped tensor. The default ``""`` gives links
            relative to the page, right where ``report.html`` sits at the artifact root; pass an
            absolute prefix (e.g. ``{server}/get-artifact?run_uuid={id}&path=``) for links that
            work from anywhere.

    Returns:
        The HTML document (about 2.0 MB of compressed plotly.js plus about 0.45 kB per row).
    """
    modules = _in_exec_order(_rows(getattr(result, "modules", None)), _ROW_KEYS, tensor_base_url)
    ops = [_complete(r, _OP_KEYS) for r in _rows(getattr(result, "ops", None))]
    summary = dict(getattr(result, "summary", None) or {})
    settings = dict(getattr(result, "settings", None) or summary.get("settings") or {})
    summary.setdefault("run_id", getattr(result, "run_id", None))
    summary.setdefault("tracking_run_id", getattr(result, "tracking_run_id", None))
    first = _first_divergence(summary, modules)
    first_row = _row_of(first, modules)
    roots = [_complete(_plain(r), _OP_KEYS) for r in summary.get("root_causes") or []] or [
        r for r in ops if r.get("root_cause")
    ]
    counts = Counter(r.get("status") or "—" for r in modules)
    return render(
        "report.html.j2",
        title="parity: {} vs {}".format(*run_sides(settings)),
        charts=True,
        tables=True,
        where=_where,
        v=_verdict(summary, modules, counts),
        first=first,
        structure=_structure(summary, modules),
        max_structure=MAX_STRUCTURE_ROWS,
        first_row=first_row,
        first_index=first_row["index"] if first_row else -1,
        header=_header(settings, summary),
        error=error_text(summary.get("error")),
        roots=roots,
        repro=_repro(result, summary, tensor_base_url),
        chip_items=chip_items(counts, STATUS_ORDER),
        propagation=_propagation(modules, first, roots),
        ops=_ops(ops, first),
        **_histogram(result, summary, settings, modules),
        worst_order=WORST_ORDER,
        modules=modules,
        budget=summary.get("mode") == BUDGET or is_budget(modules),
        failing_statuses=sorted(FAILING),
        table_statuses=sorted({r.get("status") or "" for r in modules}, key=_status_rank),
        table_kinds=sorted({r.get("kind") or "" for r in modules} - {""}),
    )


def _repro(result: Any, summary: dict[str, Any], base: str) -> dict[str, Any]:
    """How to get the reproducer (issue 20) and links to the kept ones (``run.keep``).

    ``repro/<dir>/test_repro.py`` is where ``parity-tracker repro --upload`` and the nightly
    log a reproducer; ``tensors/repro/<dir>/`` is the material every run keeps.
    """
    run = summary.get("tracking_run_id") or "RUN_ID"
    dump = getattr(result, "dump_dir", None)
    kept = Path(dump) / "repro" / "kept.json" if dump else None
    items = json.loads(kept.read_text()).get("items", []) if kept and kept.is_file() else []
    for item in items:
        item["test"] = f"{base}repro/{item['dir']}/test_repro.py"
        item["material"] = f"{base}tensors/repro/{item['dir']}/repro.json"
    return {"command": f"parity-tracker repro {run} --upload", "items": items}


# ---------------------------------------------------------------------------------------------
# Rows


def _rows(table: Any) -> list[dict[str, Any]]:
    """A pyarrow table (or list of dicts, or None) as a list of row dicts."""
    if table is None:
        return []
    if hasattr(table, "to_pylist"):
        return table.to_pylist()
    return [dict(r) for r in table]


def _complete(row: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``row`` with every key of ``keys`` present (None when absent), for the templates."""
    return {**dict.fromkeys(keys), **row}


def _plain(value: Any) -> Any:
    """A run-record field as plain data: a typed record (``to_dict()``) becomes its dict."""
    return value.to_dict() if hasattr(value, "to_dict") else value


def _order_key(row: Mapping[str, Any]) -> tuple[int, int]:
    step = row.get("step")
    order = row.get("exec_order")
    return (0 if step is None else int(step), 2**31 if order is None else int(order))


def _in_exec_order(
    rows: list[dict[str, Any]], keys: Sequence[str], base_url: str = ""
) -> list[dict[str, Any]]:
    """Rows sorted by (step, exec_order), stable, with what the module table shows.

    Adds ``index`` (position in that order) and display values prepared here rather than in
    template macros, which cost about 40 µs a call (2,000 rows × 5 calls): ``step_text``,
    ``exec_text``, ``badge_class``, ``mismatched`` (``k/n``), ``shapes`` and ``dtypes``
    ((reference, candidate) texts), ``cache`` (hit/miss), ``local`` (isolation status with
    its max |Δ|) and ``links`` ((label, href, path) of the dumped tensors).
    """
    rows = sorted((_complete(r, keys) for r in rows), key=_order_key)
    for i, r in enumerate(rows):
        mism, numel = r["mismatch_count"], r["numel"]
        local = r["local_status"] or ""
        if local and r["local_max_abs_diff"] is not None:
            local += f" ({fmt_num(r['local_max_abs_diff'])})"
        r.update(
            index=i,
            step_text="" if r["step"] is None else r["step"],
            exec_text="" if r["exec_order"] is None else r["exec_order"],
            badge_class=f" s-{r['status']}" if r["status"] in STATUS_COLORS else "",
            mismatched=f"{mism}/{numel}" if mism is not None and numel else fmt_num(mism),
            shapes=(fmt_shape(r["ref_shape"]), fmt_shape(r["cand_shape"])),
            dtypes=(_text(r["ref_dtype"]), _text(r["cand_dtype"])),
            cache={True: "hit", False: "miss"}.get(r["cache_hit"], ""),
            local=local,
            links=_tensor_links(base_url, r["dump_path"]),
        )
    return rows


def _text(value: Any) -> str:
    return "—" if value is None else str(value)


def _tensor_links(base_url: str, path: str | None) -> list[tuple[str, str, str]]:
    """(label, href, path) of a dumped tensor; a ``…__ref.npy`` brings its ``…__cand.npy``."""
    if not path:
        return []
    for mine, twin in (("__ref.npy", "__cand.npy"), ("__cand.npy", "__ref.npy")):
        if path.endswith(mine):
            pair = {mine: path, twin: path[: -len(mine)] + twin}
            ref, cand = pair["__ref.npy"], pair["__cand.npy"]
            return [("ref", href(base_url, ref), ref), ("cand", href(base_url, cand), cand)]
    return [("npy", href(base_url, path), path)]


def _first_divergence(
    summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """``summary["first_divergence"]``, else ``compare.verdict.first_divergence`` of the rows."""
    fd = _plain(summary.get("first_divergence")) or first_divergence(rows)
    return _complete({k: fd.get(k) for k in _FIRST_KEYS if k in fd}, _FIRST_KEYS) if fd else None


def _structure(summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> list:
    """The one-sided tags listed apart in the report.

    ``summary["structure_differences"]`` (empty for a run that did not complete), else
    ``compare.verdict.structure_differences`` of the rows (an old summary without the key).
    """
    if "structure_differences" in summary:
        return [_plain(r) for r in summary["structure_differences"] or ()]
    return structure_differences(rows)


def _row_of(first: Mapping[str, Any] | None, rows: Sequence[Mapping[str, Any]]) -> dict | None:
    """The table row of the first divergence (same tag, and same step when given)."""
    if not first:
        return None
    for row in rows:
        if row["tag"] == first["tag"] and (first["step"] is None or row["step"] == first["step"]):
            return row
    return None


def _status_rank(status: str) -> int:
    return STATUS_ORDER.index(status) if status in STATUS_ORDER else len(STATUS_ORDER)


def _where(item: Mapping[str, Any]) -> str:
    """`` (step 2, exec #14)`` for a row or divergence record; ``""`` when it has neither."""
    parts = []
    if item.get("step") is not None:
        parts.append(f"step {item['step']}")
    if item.get("exec_order") is not None:
        parts.append(f"exec #{item['exec_order']}")
    return f" ({', '.join(parts)})" if parts else ""


# ---------------------------------------------------------------------------------------------
# Verdict and header


def error_text(error: Any) -> str:
    """A run error (``{type, message, side}`` dict or a string) as one line of text."""
    error = _plain(error)
    if not error:
        return ""
    if isinstance(error, Mapping):
        side = f" (on the {error['side']} side)" if error.get("side") else ""
        kind = f"{error['type']}: " if error.get("type") else ""
        return f"{kind}{error.get('message') or ''}{side}"
    return str(error)


def _verdict(
    summary: Mapping[str, Any], modules: Sequence[Mapping[str, Any]], counts: Mapping[str, int]
) -> dict[str, Any]:
    """The verdict bar: ``cls`` (CSS class), ``word``, ``line`` and ``extra`` (output metrics)."""
    failing = sum(n for s, n in counts.items() if is_failing(s))
    total = len(modules)
    passed = summary.get("passed")
    broken = (not passed) if passed is not None else failing > 0
    if summary.get("error"):
        cls, word, line = "v-error", "RUN ERROR", error_text(summary["error"])
    elif broken and summary.get("expected"):
        cls, word = "v-expected", "EXPECTED DIVERGENCE"
        line = f"{failing} of {total} tensors failing; expected: {summary['expected']}"
    elif broken:
        cls, word, line = "v-fail", "PARITY FAILS", f"{failing} of {total} tensors failing"
    elif total == 0:
        cls, word, line = "v-neutral", "NOTHING COMPARED", "the run compared no tensor"
    else:
        passing = sum(n for s, n in counts.items() if s in PASSING)
        cls, word, line = "v-pass", "PARITY HOLDS", f"{passing} of {total} tensors pass"
    extra = [budget_verdict(summary)] if budget_verdict(summary) else []
    if summary.get("output_max_abs_diff") is not None:
        extra.append(f"output max |Δ| {fmt_num(summary['output_max_abs_diff'])}")
    if summary.get("output_sqnr_db") is not None:
        extra.append(f"output SQNR {fmt_num(summary['output_sqnr_db'])} dB")
    return {"cls": cls, "word": word, "line": line, "extra": extra}


def run_sides(settings: Mapping[str, Any]) -> tuple[str, str]:
    """What the title calls the two sides: ``(target, candidate)``.

    The ``target`` setting, else the reference's class (``run.mode.REFERENCE_MODEL``, recorded
    by ``run_parity``); the ``candidate`` setting (a builtin target's engine), else the
    candidate's class (``CANDIDATE_MODEL``); ``"?"`` where a run recorded neither (a run logged
    before the class names were recorded).
    """
    from parity_tracker.run.mode import CANDIDATE_MODEL, REFERENCE_MODEL

    def first(*keys: str) -> str:
        return next((str(settings[k]) for k in keys if settings.get(k) not in ("", None)), "?")

    return first("target", REFERENCE_MODEL), first("candidate", CANDIDATE_MODEL)


def _header(settings: Mapping[str, Any], summary: Mapping[str, Any]) -> dict[str, Any]:
    """Title, then a compact grid: commit, mode and why, run ids, every other setting."""
    env = dict(summary.get("environment") or {})
    commit = env.get("git_commit") or settings.get("git_commit")
    if commit and env.get("git_dirty") in (True, "true", "True", 1):
        commit = f"{commit} (dirty)"
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
    target, candidate = run_sides(settings)
    return {
        "target": target,
        "candidate": candidate,
        "meta": [(k, v) for k, v in items if v],
        "mode": summary.get("mode") or settings.get("mode"),
        "reason": summary.get("mode_reason"),
        "env": sorted(env.items()),
    }


# ---------------------------------------------------------------------------------------------
# Sections with data to prepare


def _ops(ops: Sequence[Mapping[str, Any]], first: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ops of the first divergent module (its step), in op order, at most MAX_OP_ROWS."""
    if not first:
        return {"module": None, "rows": [], "total": 0}
    module, step = first["module"], first["step"]
    mine = [r for r in ops if r["module"] == module and (step is None or r["step"] in (None, step))]
    mine.sort(key=lambda r: (r["op_index"] is None, r["op_index"] or 0))
    return {"module": module, "rows": mine[:MAX_OP_ROWS], "total": len(mine)}


def _histogram(
    result: Any,
    summary: Mapping[str, Any],
    settings: Mapping[str, Any],
    modules: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The histogram section's context: ``hist``, ``hist_figure`` and ``hist_missing``.

    ``hist_missing`` is ``(why, rerun_with_dump)`` from :func:`.histogram.missing_reason`.
    """
    hist = summary.get("worst_tensor_histogram")
    worst = pick_worst(modules)
    problem = None
    if not hist:
        hist, problem = histogram_from_dump(getattr(result, "dump_dir", None), worst)
    if hist and (hist.get("counts") or hist.get("zero_count")):
        hist = _complete(hist, _HIST_KEYS)
        figure = histogram_figure(hist) if hist["counts"] else None
        return {"hist": hist, "hist_figure": figure, "hist_missing": ("", False)}
    reason = missing_reason(
        modules,
        worst,
        dump_dir=getattr(result, "dump_dir", None),
        dump_mode=summary.get("dump_mode") or settings.get("dump_mode"),
        problem=problem,
    )
    return {"hist": None, "hist_figure": None, "hist_missing": reason}


def _propagation(
    rows: Sequence[Mapping[str, Any]],
    first: Mapping[str, Any] | None,
    roots: Sequence[Mapping[str, Any]],
) -> dict[str, Any] | None:
    """The error-propagation chart and its note, or None when there is no output to chart."""
    points = [r for r in rows if (r["kind"] or "output") in CHART_KINDS]
    if not points:
        return None
    first_x = _first_x(points, first)
    if is_budget(points):
        fig, note = budget_figure(points, first_x, first["tag"] if first else None)
        return {"figure": fig, "note": note}
    fig, note = propagation_figure(
        points,
        first_x,
        first["tag"] if first else None,
        _root_xs(points, roots, first, first_x),
    )
    if first_x is not None:
        note += " The red dashed line marks the first divergence"
        note += ", the stars the root-cause ops." if roots else "."
    return {"figure": fig, "note": note}


def _first_x(points: Sequence[Mapping[str, Any]], first: Mapping[str, Any] | None) -> int | None:
    """Chart index of the first divergence (for a parameter or input: the next output)."""
    if not first:
        return None
    for i, r in enumerate(points):
        if r["tag"] == first["tag"] and (first["step"] is None or r["step"] == first["step"]):
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

    An op inside the first divergent module or one of its ancestors (the root module contains
    everything) is drawn at the first divergence, where its error surfaces; any other at its
    own module's output.
    """
    first_module = str((first or {}).get("module") or "")
    root = _root_module(points)
    out = []
    for op in roots:
        module = str(op.get("module") or "")
        label = txt(f"root cause: {op.get('op')} in {module}")
        if first_x is not None and (
            module in ("", root, first_module) or first_module.startswith(module + ".")
        ):
            out.append((first_x, label))
            continue
        for i, r in enumerate(points):
            if r["module"] == module and (op.get("step") is None or r["step"] == op.get("step")):
                out.append((i, label))
                break
    return out


def _root_module(points: Sequence[Mapping[str, Any]]) -> str:
    """The root module's display name (``capture.tags``): ``root`` when a row names it so."""
    from parity_tracker.capture.tags import ROOT_FALLBACK, ROOT_NAME

    return ROOT_FALLBACK if any(r["module"] == ROOT_FALLBACK for r in points) else ROOT_NAME
