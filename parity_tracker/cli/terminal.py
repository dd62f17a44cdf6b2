"""Terminal output of the CLI: rich tables and the nightly's progress bar.

Presentation only: every function takes records the library returned and prints them. Kept
apart from ``parity_tracker.dashboards`` (HTML) so that the CLI starts without importing it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any


def console(err: bool = False) -> Any:
    """A rich console on stdout (or stderr), 200 columns wide off a terminal."""
    from rich.console import Console

    # Off a terminal (CI logs, pipes) rich would cut tables to 80 columns: use a wide page
    # unless COLUMNS says otherwise.
    wide = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
    return Console(stderr=err, highlight=False, soft_wrap=True, width=wide)


def fmt_n(x: Any) -> str:
    """A count or metric for a table cell: ``-`` for None, integers whole, else 3 digits."""
    if x is None:
        return "-"
    return f"{x:.0f}" if float(x).is_integer() and abs(x) < 1e12 else f"{x:.3g}"


def print_targets(found: Sequence[Any]) -> None:
    """The ``targets`` table: name, settings (default first), description."""
    from rich.table import Table

    table = Table(title="targets (also: any module.path:function)")
    for col in ("name", "settings (default first)", "description"):
        table.add_column(col, overflow="fold")
    for t in found:
        sets = "\n".join(f"{k}: {', '.join(map(str, v))}" for k, v in t.settings.items())
        table.add_row(t.name, sets or "-", t.description)
    console().print(table)


def print_ui(uri: str, experiment: str, urls: dict[str, Any], hint: str) -> None:
    """What ``parity-tracker ui`` prints: the store, the URL to open, the others, the mode hint."""
    lines = [f"MLflow UI for {uri}", f"  open {urls['open']}   (Ctrl-C to stop)"]
    if urls.get("runs_url") and urls["runs_url"] != urls["open"]:
        lines.append(f"  runs of {experiment!r}: {urls['runs_url']}")
    if urls["open"] != urls["experiments_url"] and len(urls.get("experiments") or ()) > 1:
        lines.append(f"  all experiments: {urls['experiments_url']}")
    lines.append(f"  {hint}")
    print("\n".join(lines), flush=True)


def print_run(
    result: Any, run_id: str | None, uri: str, experiment: str, url: str | None = None
) -> None:
    """Print a run's verdict, counts, first divergence, root causes and worst tensors."""
    from rich.markup import escape
    from rich.table import Table

    from parity_tracker.compare.results import structure_line

    s = result.summary
    con = console()
    verdict = "[green]PARITY HOLDS[/]" if result.passed else "[bold red]PARITY FAILS[/]"
    con.print(f"{verdict}  mode={s.get('mode')} ({s.get('mode_reason')})  status={s.get('status')}")
    counts = {k: v for k, v in (s.get("counts") or {}).items() if v}
    con.print("tensors: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    ratio = worst_ratio_line(s)
    if ratio:
        con.print(escape(ratio))
    fd = s.get("first_divergence")
    if fd:
        con.print(
            f"first divergence: [bold]{escape(str(fd.get('tag')))}[/] (step {fd.get('step')}, "
            f"{fd.get('status')}, max abs diff {fmt_n(fd.get('max_abs_diff'))})"
            + (f" on rank(s) {', '.join(map(str, fd['ranks']))}" if fd.get("ranks") else "")
        )
    one_sided = s.get("structure_differences") or []
    if one_sided:
        con.print(escape(structure_line(list(one_sided)).removeprefix("TensorChecker: ")))
    op = s.get("first_divergent_op")
    if op:
        con.print(f"first divergent op: {escape(str(op.get('tag')))} ({op.get('status')}, "
                  f"max abs diff {fmt_n(op.get('max_abs_diff'))})")  # fmt: skip
    for rc in (s.get("root_causes") or [])[:3]:
        con.print(
            f"root cause: op {escape(str(rc.get('op')))} in module {escape(str(rc.get('module')))}"
            f" (step {rc.get('step')}, seed case {rc.get('cause') or '?'})"
        )
    if s.get("error"):
        err = f"{s['error'].get('type')}: {s['error'].get('message')}"
        con.print(f"[red]error[/]: {escape(err)}")
    from parity_tracker.compare.verdict import WORST_ORDER, worst_tensors

    worst = worst_tensors(result.modules, 5)
    if worst:
        table = Table(title="worst tensors", caption=f"sorted by: {WORST_ORDER}")
        numbers = worst_columns(s)
        for col in ("tag", "step", "status", *numbers):
            table.add_column(col)
        for r in worst:
            cells = (fmt_n(r.get(col)) for col in numbers)
            table.add_row(escape(str(r["tag"])), str(r["step"]), r["status"], *cells)
        con.print(table)
    if run_id:
        con.print(f"logged: run {run_id} in experiment {experiment!r} at {uri}")
        if url:
            con.print(f"open it: {url}   |   {cli_exe()} report {run_id}")
        else:
            con.print(f"open it: {ui_command_line(uri)}   |   {cli_exe()} report {run_id}")


#: The number columns of the worst-tensors table; a budget run adds ``BUDGET_COLUMNS``.
WORST_COLUMNS = ("max_abs_diff", "sqnr_db")


def worst_columns(summary: Mapping[str, Any]) -> tuple[str, ...]:
    """The worst-tensors table's number columns for a run of ``summary["mode"]``.

    A budget run (issue 15) shows its verdict's inputs after the reference-side columns: the
    candidate's and PyTorch's own error against the float64 golden and their ratio
    (``compare.columns.BUDGET_COLUMNS``); other modes only ``WORST_COLUMNS``.
    """
    from parity_tracker.compare.columns import BUDGET_COLUMNS
    from parity_tracker.statuses import BUDGET

    return (*WORST_COLUMNS, *(BUDGET_COLUMNS if summary.get("mode") == BUDGET else ()))


def worst_ratio_line(summary: Mapping[str, Any]) -> str:
    """A budget run's worst ``error_ratio`` (``summary.worst_error_ratio``), else ``""``.

    Strict JSON stores an infinite worst ratio as None with ``error_ratio_infinite``
    (``run.summary.ratio_metrics``); printed ``inf``.
    """
    if summary.get("error_ratio_infinite"):
        value = "inf"
    elif summary.get("worst_error_ratio") is None:
        return ""
    else:
        value = fmt_n(summary["worst_error_ratio"])
    return (
        f"worst error_ratio: {value} at {summary.get('worst_error_ratio_tag')} (the candidate's "
        "error vs the float64 golden ÷ max(PyTorch's own error, floor); within budget <= k)"
    )


class RichReporter:
    """The nightly's progress bar (rich, on stderr)."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console(err=True),
            transient=False,
        )
        self.task: Any = None

    def start(self, total: int) -> None:
        """Show the bar for ``total`` cells."""
        self.progress.start()
        self.task = self.progress.add_task("nightly", total=total)

    def cell_started(self, cell: Any) -> None:
        """Name the running cell."""
        from rich.markup import escape

        self.progress.update(self.task, description=escape(cell.name))

    def cell_done(self, result: Any) -> None:
        """Print the cell's final verdict (``pipeline.results.cell_status``) and advance."""
        from rich.markup import escape

        from parity_tracker.pipeline.results import cell_status

        verdict = cell_status(result)
        self.progress.console.print(f"{escape(result.cell.name)}: {verdict}")
        self.progress.advance(self.task)

    def stop(self) -> None:
        """Close the bar."""
        self.progress.stop()


def print_history(hist: Any, title: str, tag: str | None) -> None:
    """The ``history`` table, one row per commit, and the first bad commit."""
    from rich.table import Table

    table = Table(title=title + (f" tag {tag}" if tag else ""))
    cols = ["commit", "run", "status", "verdict", "compared", "failing", "output max abs diff",
            "sqnr dB"]  # fmt: skip
    for col in [*cols, *(["tag status"] if tag else [])]:
        table.add_column(col)
    for p in hist.points:
        bad = hist.first_bad_commit
        mark = " <- first bad" if bad is not None and p.commit == bad else ""
        cells = [
            (p.commit or NO_COMMIT)[:12] + mark,
            p.run_id[:12],
            p.status,
            "pass" if p.passed else "fail",
            fmt_n(p.tensors_compared),
            fmt_n(p.tensors_failing),
            fmt_n(p.output_max_abs_diff),
            fmt_n(p.output_sqnr_db),
        ]
        table.add_row(*cells, *([str(p.tag_status)] if tag else []))
    con = console()
    con.print(table)
    con.print(f"first bad commit: {_first_bad_text(hist)}")


#: How a run without a recorded commit shows (made outside a git checkout, no --commit).
NO_COMMIT = "unknown"


def _first_bad_text(hist: Any) -> str:
    """The first bad commit; else why there is none (passing, or a streak without commits)."""
    if hist.first_bad_commit:
        return hist.first_bad_commit
    if getattr(hist, "newest_failing", None):
        return "unknown: the newest run fails, but no failing run of the streak has a commit"
    return "none (the newest passes)"


def cli_exe() -> str:
    """The ``parity-tracker`` command, as pasted it works in any shell and folder.

    The console script beside the running interpreter (``.venv/bin/parity-tracker``), by its
    absolute path, since ``parity-tracker`` is on ``PATH`` only inside an activated venv; the
    interpreter itself when no script is installed there.
    """
    import shlex
    from pathlib import Path

    script = Path(sys.executable).parent / "parity-tracker"
    if script.exists():
        return shlex.quote(str(script))
    code = "from parity_tracker.cli import main; main()"
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def ui_command_line(uri: str) -> str:
    """``<cli_exe()> ui --tracking-uri URI``: the MLflow UI on the store at ``uri``."""
    import shlex

    return f"{cli_exe()} ui --tracking-uri {shlex.quote(uri)}"


def browse_hint(uri: str, parent_run_id: str | None) -> str:
    """What the nightly prints last: how to browse the runs and where its pages are on disk.

    ``make ui`` (when run from the checkout, whose Makefile has it, on the default store) and
    the absolute command for any folder;
    then the on-disk paths of the nightly run's ``matrix.html``, ``history.html`` and
    ``digest.md`` when its artifacts are local (``track.store.local_artifact_dir``).
    """
    from pathlib import Path

    from parity_tracker.track.store import default_tracking_uri, local_artifact_dir

    lines = ["Browse the runs (MLflow UI, then open the printed URL):"]
    if uri == default_tracking_uri() and _has_make_ui(Path.cwd()):
        lines.append("  make ui")
    lines.append(f"  {ui_command_line(uri)}")
    folder = local_artifact_dir(parent_run_id, uri) if parent_run_id else None
    pages = [folder / n for n in ("matrix.html", "history.html", "digest.md")] if folder else []
    pages = [p for p in pages if p.exists()]
    if pages:
        lines.append("The nightly's pages on disk (open in a browser):")
        lines += [f"  {p}" for p in pages]
    elif parent_run_id:
        lines.append(f"The nightly's pages are artifacts of the nightly run {parent_run_id}.")
    return "\n".join(lines)


def _has_make_ui(folder: Any) -> bool:
    """Whether ``make ui`` works in ``folder``: its Makefile has a ``ui`` target."""
    try:
        return "\nui:" in "\n" + (folder / "Makefile").read_text(encoding="utf-8")
    except OSError:
        return False
