"""The nightly's markdown digest and the files a nightly attaches to its parent run.

``render_digest`` writes the verdict, one line per cell, the regressions, the expected and the
expired entries as markdown (``digest.md``, also printed by ``parity-tracker nightly``).
``nightly_artifacts`` is the renderer the CLI hands to ``pipeline.nightly.run_nightly``: the
digest plus ``matrix.html`` and ``history.html``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parity_tracker.pipeline.pages import NightlyPages
from parity_tracker.pipeline.results import CellResult, NightlyResult, cell_status


def _fmt(x: Any) -> str:
    return "-" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))


def _shards_text(result: NightlyResult) -> str:
    """The header's shard words: ``shard I/N``; for a merged night, how many shards reported.

    A merged night's ``shard`` is ``(0, planned)``, ``planned`` counting the shards that
    reported and those named missing (``missing_shards``); "all N shards" only when the night is
    complete, else "R of N planned shards reported", plus "shard splits disagree" when
    ``shard_problems`` is not empty (e.g. ``1/2`` and ``1/3`` ran: each split's shards count).
    """
    index, count = result.shard
    if index != 0:
        return f"shard {index}/{count}"
    if result.complete:
        return f"all {count} shards"
    text = f"{count - len(result.missing_shards)} of {count} planned shards reported"
    return text + ("; shards disagree (see Shard problems)" if result.shard_problems else "")


def render_digest(
    result: NightlyResult, *, limit: int = 30, urls: dict[str, str] | None = None
) -> str:
    """The markdown digest: verdict, one line per cell, the regressions, expected and expired.

    ``urls`` (``{run id: run page URL}``, from ``NightlyPages.cells``) links each cell's name
    to its run page when the store has addresses (an MLflow server).
    """
    urls = urls or {}
    shard = _shards_text(result)
    lines = [
        f"# Parity nightly — {result.headline}",
        "",
        f"commit `{result.commit or 'unknown'}` · night `{result.night or '-'}` · {shard} · "
        f"{len(result.cells)} cells · {result.regressions} regressions · "
        f"fail-on {result.fail_on} · parent run `{result.parent_run_id}`",
        "",
        "| cell | parity | mode | failing | output max abs diff | first divergence | baseline "
        "| regression | worse | drift | fix | expected |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result.cells:
        parity = cell_status(c)
        ch = c.changes
        lines.append(
            f"| {_link(c.cell.name, urls.get(c.run_id or ''))} | {parity} | {_fmt(c.mode)} | "
            f"{c.tensors_failing} | "
            f"{_fmt(c.output_max_abs_diff)} | {_fmt(c.first_divergence)} | "
            f"{(c.baseline_run_id or 'none')[:12]} | {ch.get('regression', 0)} | "
            f"{ch.get('worse', 0)} | {ch.get('drift', 0)} | {ch.get('fix', 0)} | "
            f"{ch.get('expected', 0)} |"
        )
    if result.missing_shards:
        lines += ["", "## Shards that never reported (the night is INCOMPLETE: their cells are "
                  "unknown)", ""]  # fmt: skip
        lines += [f"- shard {s}" for s in result.missing_shards]
    if result.shard_problems:
        lines += ["", "## Shard problems (the night is INCOMPLETE: its cells cannot be trusted "
                  "whole)", ""]  # fmt: skip
        lines += [f"- {p}" for p in result.shard_problems]
    if result.shard_notes:
        lines += ["", "## Shards", ""] + [f"- {n}" for n in result.shard_notes]
    lines += _section_rows(result.cells, "regression", "Regressions", limit)
    lines += _section_rows(result.cells, "worse", "Worse (max abs diff grew)", limit)
    unbased = [c for c in result.cells if c.run_id and not c.baseline_run_id and not c.error]
    if unbased:
        lines += ["", "## Cells without a baseline (every tag new; nothing to regress from)", ""]
        lines += [f"- {c.cell.name}" for c in unbased]
    errors = [c for c in result.cells if c.error]
    if errors:
        lines += ["", "## Cells that did not complete", ""]
        lines += [f"- {c.cell.name}: {c.error}" for c in errors]
    used = sorted({e for c in result.cells for e in c.expected_used})
    if used:
        lines += ["", "## Expected divergences applied", ""] + [f"- {e}" for e in used]
    if result.expired:
        lines += ["", "## EXPIRED expected divergences (fix them or extend `until`)", ""]
        lines += [f"- {e.describe()}" for e in result.expired]
    return "\n".join(lines) + "\n"


def _link(text: str, url: str | None) -> str:
    return f"[{text}]({url})" if url else text


def _section_rows(cells: Sequence[CellResult], change: str, title: str, limit: int) -> list[str]:
    rows = []
    for c in cells:
        if c.diff is None or not c.changes.get(change):
            continue
        for r in c.diff.to_pylist():
            if r["change"] == change:
                rows.append(
                    f"| {c.cell.name} | {r['tag']} | {r['step']} | {r['base_status']} → "
                    f"{r['head_status']} | {_fmt(r['base_max_abs_diff'])} → "
                    f"{_fmt(r['head_max_abs_diff'])} |"
                )
    if not rows:
        return []
    head = [
        "",
        f"## {title}",
        "",
        "| cell | tag | step | status | max abs diff |",
        "|---|---|---|---|---|",
    ]
    more = [f"\n… and {len(rows) - limit} more"] if len(rows) > limit else []
    return head + rows[:limit] + more


def nightly_artifacts(result: NightlyResult, pages: NightlyPages | None) -> dict[str, str]:
    """``{file name: text}`` for the nightly's parent run.

    ``digest.md`` always; ``matrix.html`` and ``history.html`` when ``pages`` is given (None
    when the store could not give the pages' data).
    """
    from parity_tracker.dashboards.nightly import render_history, render_matrix

    urls = {c["run_id"]: c["url"] for c in (pages.cells if pages else []) if c.get("url")}
    files = {"digest.md": render_digest(result, urls=urls)}
    if pages is not None:
        files["matrix.html"] = render_matrix(pages.cells, title=pages.title)
        files["history.html"] = render_history(pages.runs, pages.tag_status)
    return files
