"""``python -m benchmarks --quick|--full``: run the measurements, print a table, write JSON.

``--quick`` (CI, about a minute): measurements 1, 2, 4, 5, 6, 7, 9 and 10 at small sizes. A
row that carries its own quick-size target (``extra["quick_target"]``: 1, 2, 5, 7, 9, 10, issue 19)
keeps its verdict; the others are informational (``_common.informational``: their targets
are set for the full sizes).
``--full`` (``make bench``): all seven at the issue's sizes (7: a
tracking server, issue 18). Results go to
``benchmarks/results/latest.json``; the exit status is 0 unless a measurement raised
(an ``error`` row), whatever the figures — these are not timed tests.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import CLOCK, QUICK_REASON, Row, failed, informational

MEASUREMENTS = {
    1: "benchmarks.bench_module",
    2: "benchmarks.bench_ops",
    3: "benchmarks.bench_peers",
    4: "benchmarks.bench_throughput",
    5: "benchmarks.bench_memory",
    6: "benchmarks.bench_storage",
    7: "benchmarks.bench_budget",
    8: "benchmarks.bench_server",
    9: "benchmarks.bench_fixed_cost",
    10: "benchmarks.bench_decode",
}
QUICK = (1, 2, 4, 5, 6, 7, 9, 10)
RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes of 1, 2, 4, 6 (default)")
    size.add_argument("--full", action="store_true", help="every measurement at full size")
    p.add_argument("--only", default="", help="comma-separated measurement numbers, e.g. 1,3")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="clock of the overhead ratios (1-3): process CPU time (default) or wall time",
    )
    p.add_argument("--out", type=Path, default=RESULTS, help=f"JSON output (default {RESULTS})")
    return p.parse_args(argv)


def _selected(args: argparse.Namespace) -> list[int]:
    if args.only:
        return [int(x) for x in args.only.split(",") if x.strip()]
    return list(MEASUREMENTS) if args.full else list(QUICK)


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _machine(threads: int) -> dict[str, Any]:
    import torch

    try:
        from importlib.metadata import version

        torchlens = version("torchlens")
    except Exception:  # not installed: measurement 3 says so in its rows
        torchlens = None
    return {
        "torchlens": torchlens,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "machine": f"{os.cpu_count()}-core CPU",
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": threads,
        "git_commit": _git_commit(),
    }


def measure(number: int, quick: bool) -> tuple[list[Row], float]:
    """Run measurement ``number``; an exception becomes an ``error`` row."""
    t0 = time.perf_counter()
    try:
        rows = importlib.import_module(MEASUREMENTS[number]).run(quick)
    except Exception as exc:
        rows = [failed(f"{number}", MEASUREMENTS[number], exc)]
    return rows, time.perf_counter() - t0


#: Columns of the printed table (the rows' ``detail`` is in the JSON file only).
WIDTH = 100


def print_table(rows: list[Row], title: str, notes: list[str] = ()) -> None:
    """The rows as a rich table on stdout, at most :data:`WIDTH` columns wide.

    Each row's ``detail`` (method, raw medians, coverage) goes to the JSON file, not the table;
    ``notes`` are printed below it, wrapped to the same width.
    """
    from rich.console import Console
    from rich.table import Table

    colour = {"ok": "green", "missed": "red", "error": "red", "info": "cyan"}
    table = Table(title=title, show_lines=False, pad_edge=False)
    for col in ("measurement", "case", "figure", "target", "verdict"):
        table.add_column(
            col, overflow="fold", max_width=34 if col in ("measurement", "case") else None
        )
    for r in rows:
        figure = "—" if r.value is None else f"{r.value:.3g} {r.unit}".strip()
        verdict = f"[{colour.get(r.status, 'yellow')}]{r.status}[/]"
        table.add_row(r.measurement, r.case, figure, r.target, verdict)
    console = Console(width=WIDTH)
    console.print(table)
    for note in notes:
        console.print(note, markup=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _args(argv)
    quick = not args.full
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import torch

    torch.set_num_threads(args.threads)
    CLOCK["name"] = args.clock
    meta = {**_machine(args.threads), "mode": "quick" if quick else "full", "clock": args.clock}
    rows: list[Row] = []
    durations: dict[str, float] = {}
    t0 = time.perf_counter()
    for number in _selected(args):
        print(f"[bench] measurement {number} ({MEASUREMENTS[number]}) ...", file=sys.stderr)
        got, secs = measure(number, quick)
        print(f"[bench] measurement {number}: {len(got)} rows in {secs:.1f} s", file=sys.stderr)
        rows.extend(got)
        durations[str(number)] = round(secs, 2)
    if quick:  # small sizes: figures for information, never held to the full-size targets
        # rows with their own quick-size target (extra["quick_target"]) stay judged
        rows = [r if r.extra.get("quick_target") else informational(r) for r in rows]
    meta["durations_s"] = {**durations, "total": round(time.perf_counter() - t0, 2)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "rows": [r.to_dict() for r in rows]}
    args.out.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    title = (
        f"parity_tracker benchmarks ({meta['mode']}, {meta['machine']}, "
        f"{args.threads} torch thread(s), {meta['date'][:10]})"
    )
    notes = [f"Row details (method, raw medians): {args.out}."]
    if quick:
        notes.insert(0, f"Rows with a 'full:' target are not judged: {QUICK_REASON}.")
    print_table(rows, title, notes)
    print(f"wrote {args.out} in {meta['durations_s']['total']:.1f} s")
    return 1 if any(r.status == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
