"""Measurement 6: storage and queries, in a temporary embedded store (SQLite + artifact folder).

- bytes per row of ``modules.parquet`` (``tables.write_table``: zstd): on a real module-level
  run's table when ``run_parity`` exists, and on a synthetic table of realistic content;
- ``history`` over 1,000 stored runs of 2,000 rows each ≤ 1 s: the runs are written the way
  ``track.log_run`` writes them (same params, metrics and tags from ``track.run_params`` /
  ``run_metrics`` / ``run_tags``, the ``modules`` table under ``tables/modules.parquet``, status
  FINISHED, ``parity.complete``, the per-tag statuses in the run's tags, ``track.tag_codes``),
  minus report.html, which history never reads; then ``history.build_history`` is timed
  without and with ``tag=`` (the latter decodes the run tags the heads query returns);
- ``diff`` of two 100,000-row runs ≤ 1 s: reading both ``modules.parquet`` files and
  ``diff.diff_tables`` (the in-memory join alone is shown too);
- logging one run with 500 dumped tensors (1 MiB float32 each, ``.npy``) to the embedded store
  with ``track.log_run`` ≤ 3 s (the store already created: its one-time schema setup is not
  billed to a run).

``--quick`` uses 5 runs × 200 rows, 10,000-row diffs and 20 small tensors.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import synthetic
from benchmarks._common import CLOCK, Row, failed, find, judged, missing, other_clock, timed

NAME = "6 storage"
SIZES = {
    False: {"runs": 1000, "rows": 2000, "diff_rows": 100_000, "tensors": 500, "numel": 1 << 18},
    True: {"runs": 5, "rows": 200, "diff_rows": 10_000, "tensors": 20, "numel": 1 << 12},
}
TARGET = "bench-history"


def _guarded(name: str, case: str, target: str, fn: Any, *needs: str) -> list[Row]:
    for qualified in needs:
        _, why = find(qualified)
        if why:
            return [missing(name, case, why, target)]
    try:
        return fn()
    except Exception as exc:
        return [failed(name, case, exc, target)]


def bytes_per_row(quick: bool, tmp: Path) -> list[Row]:
    """Size of ``modules.parquet`` ÷ rows, real (if possible) and synthetic."""
    from parity_tracker.files.tables import write_table

    rows: list[Row] = []
    n = SIZES[quick]["rows"]
    path = write_table(synthetic.modules_table(n, seed=1), tmp / "synthetic.parquet")
    rows.append(
        Row(
            f"{NAME}: bytes/row modules.parquet",
            f"synthetic {n} rows, 2% mismatching",
            path.stat().st_size / n,
            "B/row",
            detail="zstd parquet via tables.write_table; all columns filled as an equal run",
        )
    )
    from benchmarks import cases
    from benchmarks.overhead import parity_runner

    pair = cases.transformer(quick)
    run, why = parity_runner(pair, capture_ops=False)
    if run is None:
        rows.append(missing(f"{NAME}: bytes/row modules.parquet", pair.label, why))
        return rows
    table = run().modules
    path = write_table(table, tmp / "real.parquet")
    rows.append(
        Row(
            f"{NAME}: bytes/row modules.parquet",
            f"{pair.label} ({table.num_rows} rows)",
            path.stat().st_size / max(table.num_rows, 1),
            "B/row",
            detail="the module-level run's own table (equal mode, no dumps)",
        )
    )
    return rows


def store_runs(uri: str, n_runs: int, n_rows: int) -> None:
    """Write ``n_runs`` synthetic runs of ``n_rows`` rows, one commit each, as log_run does."""
    from mlflow.entities import Metric, Param, RunTag

    from parity_tracker.files.tables import write_table
    from parity_tracker.track import TAG_COMPLETE, run_metrics, run_params, run_tags
    from parity_tracker.track.store import get_client, get_or_create_experiment

    client = get_client(uri)
    exp = get_or_create_experiment(client, "parity")
    t0 = 1_700_000_000_000
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n_runs):
            result = synthetic.run_result(n_rows, seed=i, commit=f"{i:040x}", target=TARGET)
            art = Path(tmp) / str(i)
            write_table(result.modules, art / "tables" / "modules.parquet")
            run = client.create_run(exp, start_time=t0 + 60_000 * i)
            rid = run.info.run_id
            params = [Param(k, v) for k, v in run_params(result).items()]
            tags = [RunTag(k, v) for k, v in run_tags(result, None).items()]
            metrics = [Metric(k, v, t0, 0) for k, v in run_metrics(result).items()]
            client.log_batch(rid, metrics=metrics, params=params[:100], tags=tags)
            for k in range(100, len(params), 100):  # MLflow's 100-params-per-batch limit
                client.log_batch(rid, params=params[k : k + 100])
            client.log_artifacts(rid, str(art))
            client.set_terminated(rid, "FINISHED", t0 + 60_000 * i + 1000)
            client.set_tag(rid, TAG_COMPLETE, "true")
            shutil.rmtree(art)


def history_rows(quick: bool, tmp: Path) -> list[Row]:
    """``build_history`` over the stored runs, without and with ``tag=``."""
    from parity_tracker.analysis.history import build_history

    size = SIZES[quick]
    uri = f"sqlite:///{tmp / 'store' / 'mlflow.db'}"
    t0 = time.perf_counter()
    store_runs(uri, size["runs"], size["rows"])
    build_s = time.perf_counter() - t0
    case = f"{size['runs']} runs × {size['rows']} rows"
    out = []
    for tag, how in (
        (None, "metrics only (one SQL query on SQLite stores)"),
        ("checker_layers.3.linear1", "tag= (per-tag statuses from the run tags, track.tag_codes)"),
    ):
        reps = 3
        secs, other, hist = timed(
            lambda t=tag: build_history(TARGET, tracking_uri=uri, tag=t), repeats=reps
        )
        if len(hist.points) != size["runs"]:
            raise AssertionError(f"history saw {len(hist.points)} commits, stored {size['runs']}")
        out.append(
            judged(
                f"{NAME}: history{'' if tag is None else ' --tag'}",
                case,
                secs,
                "s",
                1.0,
                detail=f"{how}; median of {reps} on the {CLOCK['name']} clock ({other_clock()} "
                f"{other:.2f} s); storing the runs took {build_s:.0f} s (untimed)",
            )
        )
    return out


def diff_rows(quick: bool, tmp: Path) -> list[Row]:
    """``diff_tables`` of two runs: read from parquet + join, and the join alone."""
    from parity_tracker.analysis.diff import count_changes, diff_tables
    from parity_tracker.files.tables import read_table, write_table

    n = SIZES[quick]["diff_rows"]
    base = write_table(synthetic.modules_table(n, seed=1), tmp / "base.parquet")
    head = write_table(synthetic.modules_table(n, seed=2), tmp / "head.parquet")

    def from_disk() -> Any:
        return diff_tables(read_table(base), read_table(head))

    secs, other, diff = timed(from_disk)
    counts = count_changes(diff)
    b, h = read_table(base), read_table(head)
    join_s, _, _ = timed(lambda: diff_tables(b, h))
    case = f"two {n:,}-row runs"
    detail = (
        f"read both modules.parquet + diff_tables, median of 3 on the {CLOCK['name']} clock "
        f"({other_clock()} {other:.2f} s; diff_tables alone {join_s:.3f} s); "
        f"{counts.get('regression', 0)} regressions, {counts.get('fix', 0)} fixes found"
    )
    return [judged(f"{NAME}: diff", case, secs, "s", 1.0, detail=detail)]


def log_rows(quick: bool, tmp: Path) -> list[Row]:
    """``track.log_run`` of one run whose dump folder holds N ``.npy`` tensors."""
    import pyarrow as pa

    from parity_tracker.track import log_run
    from parity_tracker.track.store import get_client

    size = SIZES[quick]
    n, numel = size["tensors"], size["numel"]
    uri = f"sqlite:///{tmp / 'store' / 'mlflow.db'}"  # the history measurement's store
    get_client(uri)  # the store's one-time schema setup stays outside the clock
    dumps = tmp / "dumps"
    dumps.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        np.save(dumps / f"t{i:04d}.npy", rng.standard_normal(numel, dtype=np.float32))
    results = []
    for k in range(3):
        result = synthetic.run_result(n, seed=k, commit="b" * 40, target="bench-log")
        paths = pa.array([f"tensors/t{i:04d}.npy" for i in range(n)], pa.string())
        idx = result.modules.schema.get_field_index("dump_path")
        result.modules = result.modules.set_column(idx, "dump_path", paths)
        result.dump_dir = dumps
        results.append(result)
    pending = iter(results)

    def log_one() -> str:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return log_run(next(pending), tracking_uri=uri)

    secs, other, _ = timed(log_one)
    mib = n * numel * 4 / 2**20
    detail = (
        f"track.log_run incl. report.html, {n} × {numel * 4 >> 10} KiB .npy ({mib:.0f} MiB); "
        f"median of 3 on the {CLOCK['name']} clock ({other_clock()} {other:.2f} s)"
    )
    return [
        judged(
            f"{NAME}: log run + dumps",
            f"{n} dumped tensors",
            secs,
            "s",
            3.0,
            detail=detail,
        )
    ]


def run(quick: bool) -> list[Row]:
    """Rows of measurement 6."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="parity-bench-") as tmp_name:
        tmp = Path(tmp_name)
        rows += _guarded(
            f"{NAME}: bytes/row",
            "modules.parquet",
            "",
            lambda: bytes_per_row(quick, tmp),
            "parity_tracker.files.tables:write_table",
        )
        rows += _guarded(
            f"{NAME}: history",
            "stored runs",
            "≤ 1",
            lambda: history_rows(quick, tmp),
            "parity_tracker.analysis.history:build_history",
            "parity_tracker.track:run_params",
        )
        rows += _guarded(
            f"{NAME}: diff",
            "two runs",
            "≤ 1",
            lambda: diff_rows(quick, tmp),
            "parity_tracker.analysis.diff:diff_tables",
        )
        rows += _guarded(
            f"{NAME}: log run + dumps",
            "dumped tensors",
            "≤ 3",
            lambda: log_rows(quick, tmp),
            "parity_tracker.track:log_run",
        )
    return rows
