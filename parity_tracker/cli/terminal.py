"""Terminal output of the CLI: rich tables and the nightly's progress bar.

Presentation only: every function takes records the library returned and prints them. Kept
apart from ``parity_tracker.dashboards`` (HTML) so that the CLI starts without importing it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
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


def print_run(result: Any, run_id: str | None, uri: str, experiment: str) -> None:
    """Print a run's verdict, counts, first divergence, root causes and worst tensors."""
    from rich.markup import escape
    from rich.table import Table

    s = result.summary
    con = console()
    verdict = "[green]PARITY HOLDS[/]" if result.passed else "[bold red]PARITY FAILS[/]"
    con.print(f"{verdict}  mode={s.get('mode')} ({s.get('mode_reason')})  status={s.get('status')}")
    counts = {k: v for k, v in (s.get("counts") or {}).items() if v}
    con.print("tensors: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    fd = s.get("first_divergence")
    if fd:
        con.print(
            f"first divergence: [bold]{escape(str(fd.get('tag')))}[/] (step {fd.get('step')}, "
            f"{fd.get('status')}, max abs diff {fmt_n(fd.get('max_abs_diff'))})"
            + (f" on rank(s) {', '.join(map(str, fd['ranks']))}" if fd.get("ranks") else "")
        )
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
    from parity_tracker.compare.verdict import worst_tensors

    worst = worst_tensors(result.modules, 5)
    if worst:
        table = Table(title="worst tensors")
        for col in ("tag", "step", "status", "max_abs_diff", "sqnr_db"):
            table.add_column(col)
        for r in worst:
            table.add_row(escape(str(r["tag"])), str(r["step"]), r["status"],
                          fmt_n(r.get("max_abs_diff")), fmt_n(r.get("sqnr_db")))  # fmt: skip
        con.print(table)
    if run_id:
        con.print(f"logged: run {run_id} in experiment {experiment!r} at {uri}")
        con.print(
            f"open it: parity-tracker ui --tracking-uri {uri}   |   parity-tracker report {run_id}"
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
        """Print the cell's verdict and advance."""
        from rich.markup import escape

        verdict = "error" if result.error else ("pass" if result.passed else "fail")
        self.progress.console.print(f"{escape(result.cell.name)}: {verdict}")
        self.progress.advance(self.task)

    def stop(self) -> None:
        """Close the bar."""
        self.progress.stop()


def print_history(hist: Any, title: str, tag: str | None) -> None:
    """The ``history`` table, one row per commit, and the first bad commit."""
    from rich.table import Table

    table = Table(title=title + (f" tag {tag}" if tag else ""))
    cols = ["commit", "run", "status", "compared", "failing", "output max abs diff", "sqnr dB"]
    for col in [*cols, *(["tag status"] if tag else [])]:
        table.add_column(col)
    for p in hist.points:
        bad = hist.first_bad_commit
        mark = " <- first bad" if bad is not None and p.commit == bad else ""
        cells = [
            str(p.commit)[:12] + mark,
            p.run_id[:12],
            p.status,
            fmt_n(p.tensors_compared),
            fmt_n(p.tensors_failing),
            fmt_n(p.output_max_abs_diff),
            fmt_n(p.output_sqnr_db),
        ]
        table.add_row(*cells, *([str(p.tag_status)] if tag else []))
    con = console()
    con.print(table)
    con.print(f"first bad commit: {hist.first_bad_commit or 'none (the newest passes)'}")
