"""Presentation of diffs: a rich table, one markdown-table helper, JSON.

Kept apart from the decision (``analysis.diff``), in the pattern of asv's
``commands/compare.py``. ``markdown_table`` is the one GitHub-flavoured markdown table writer
(the nightly digest should use it too).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from parity_tracker.analysis.diff import count_changes, interesting
from parity_tracker.files import jsonio


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


_SHOWN = ("change", "tag", "step", "base_status", "head_status", "base_max_abs_diff",
          "head_max_abs_diff", "base_error_ratio", "head_error_ratio")  # fmt: skip
_STYLE = {"regression": "bold red", "worse": "red", "expected": "yellow", "fix": "green",
          "better": "green", "drift": "magenta", "new": "cyan", "removed": "cyan"}  # fmt: skip


def to_rich(diff: pa.Table, *, title: str = "diff", limit: int = 50) -> Any:
    """A ``rich.table.Table`` of the non-unchanged rows (at most ``limit``), styled by change."""
    from rich.table import Table

    table = Table(title=title)
    for col in _SHOWN:
        table.add_column(col, justify="right" if "diff" in col or col == "step" else "left")
    for row in interesting(diff).slice(0, limit).to_pylist():
        table.add_row(*(_fmt(row.get(c)) for c in _SHOWN), style=_STYLE.get(row["change"], ""))
    return table


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; cells formatted with ``_fmt``, ``|`` escaped.

    Args:
        header: the column names.
        rows: one sequence of cell values per row (None shows as ``-``, floats as ``%.3g``).

    Returns:
        The table's lines joined by newlines (no trailing newline).
    """

    def cell(value: Any) -> str:
        return _fmt(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def to_markdown(diff: pa.Table, *, limit: int = 50, differences: Sequence[str] = ()) -> str:
    """A GitHub-flavoured markdown table of the non-unchanged rows (at most ``limit``).

    Args:
        diff: the whole diff table (``RunDiff.table``, unchanged rows included: when no row
            changed, the text is :func:`no_changes_line` alone, which counts them).
        limit: the most rows shown.
        differences: ``RunDiff.config_differences``; when any, a warning quote comes first.
    """
    rows = interesting(diff)
    shown = rows.slice(0, limit).to_pylist()
    if rows.num_rows == 0:  # the line alone: an empty table says nothing
        text = no_changes_line(diff)
    else:
        text = markdown_table(_SHOWN, ([row.get(c) for c in _SHOWN] for row in shown))
    if differences:
        text = f"> **warning**: {config_warning(differences)}\n\n{text}"
    if rows.num_rows > limit:
        text += f"\n\n… and {rows.num_rows - limit} more"
    return text


def no_changes_line(diff: pa.Table) -> str:
    """The line shown when no row of ``diff`` changed, with its real counts.

    ``unchanged`` keeps the pass/fail class but not always the status (``equal`` -> ``close``
    without a known content hash is ``unchanged``), so "all statuses identical" is said only
    when every (tag, step) has the same status in both runs; otherwise the line counts those
    whose status moved within its class and names the first.
    """
    n = diff.num_rows
    if n == 0:
        return "no changes: 0 tensors compared (both runs are empty)"
    base, head = diff.column("base_status"), diff.column("head_status")
    moved = diff.filter(pc.invert(pc.fill_null(pc.equal(base, head), False)))
    if moved.num_rows == 0:
        return f"no changes: {n} tensors compared, all statuses identical"
    first = moved.slice(0, 1).to_pylist()[0]
    return (
        f"no changes: {n} tensors compared, the same pass/fail class for all; {moved.num_rows} "
        f"changed status within it (e.g. {first['tag']}: {first['base_status']} -> "
        f"{first['head_status']}; --all lists them)"
    )


def config_warning(differences: Sequence[str]) -> str:
    """The warning that the diffed runs have different configurations, naming each difference."""
    return (
        "BASE and HEAD are runs of different configurations, so changes may come from the "
        f"configuration, not the code: {'; '.join(differences)}"
    )


def to_json(diff: pa.Table, **extra: Any) -> str:
    """JSON: ``{"counts": {...}, "rows": [non-unchanged rows], **extra}``.

    ``diff`` is the whole diff table (unchanged rows included), so ``counts.unchanged`` is
    their real number.
    """
    payload = {"counts": count_changes(diff), "rows": interesting(diff).to_pylist(), **extra}
    return jsonio.dumps(payload, default=str)
