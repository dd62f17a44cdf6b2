"""Measurement 8: history over a team's tracking server (issue 18), beside measurement 6's SQLite.

A real ``mlflow server`` on 127.0.0.1 (backend: PostgreSQL from the ``pgserver`` package when it
is installed, else SQLite; artifacts proxied with ``--serve-artifacts`` into a temporary folder)
is filled with 1,000 runs × 2,000 rows (``--quick``: 20 × 200), written as ``track.log_run``
writes them (same params, metrics, tags — the per-tag statuses of ``track.tag_codes``
included —, ``tables/modules.parquet``, FINISHED, ``parity.complete``) but in bulk: 16 client
threads, one ``log_batch`` per run. Then, in this process, over HTTP:

- ``history`` (``build_history`` without ``tag=``) ≤ 1 s, once the heads of the stored runs are
  kept locally (``track.heads_cache``; the first call's full search is shown in the detail);
- ``history --tag`` cold (runs never fetched, empty run cache: each run's status decoded from
  its own MLflow tags, the ordered tag list read from ONE modules table fetched for the shared
  fingerprint) and warm (the tag list kept) ≤ 2 s;
- shown beside, not judged: the same cold question for runs logged before the codes (the
  decoding switched off): every modules table fetched (direct GETs, 16 threads) and scanned.

Times are wall-clock (the server's work is in another process, which the CPU clock would not
bill), median of 3 (cold: one call per fresh cache).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks import synthetic
from benchmarks._common import Row, failed, judged

NAME = "8 server store"
SIZES = {False: {"runs": 1000, "rows": 2000}, True: {"runs": 20, "rows": 200}}
TARGET = "bench-server"
TAG = "checker_layers.3.linear1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend(tmp: Path) -> tuple[str, Any]:
    """``(backend URI, pgserver handle or None)``: PostgreSQL when pgserver is installed."""
    try:
        import pgserver
    except ImportError:
        return f"sqlite:///{tmp / 'server.db'}", None
    pg_dir = tempfile.mkdtemp(prefix="parity-bench-pg-")  # short, outside 700 folders
    pg = pgserver.get_server(pg_dir, cleanup_mode="stop")
    pg.bench_dir = pg_dir
    return pg.get_uri().replace("postgresql://", "postgresql+psycopg2://", 1), pg


def _server(tmp: Path, backend: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--workers", "4", "--backend-store-uri", backend, "--serve-artifacts",
           "--artifacts-destination", str(tmp / "artifacts")]  # fmt: skip
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((tmp / "server.log").read_text()[-2000:])
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("mlflow server not healthy after 180 s")


def _store_runs(url: str, n_runs: int, n_rows: int, tmp: Path) -> None:
    from mlflow.entities import Metric, Param, RunTag

    from parity_tracker.files.tables import write_table
    from parity_tracker.track import TAG_COMPLETE, run_metrics, run_params, run_tags
    from parity_tracker.track.store import get_client, get_or_create_experiment

    client = get_client(url)
    exp = get_or_create_experiment(client, "parity")
    t0 = 1_700_000_000_000

    def one(i: int) -> None:
        result = synthetic.run_result(n_rows, seed=i, commit=f"{i:040x}", target=TARGET)
        art = tmp / "stage" / str(i)
        write_table(result.modules, art / "tables" / "modules.parquet")
        rid = client.create_run(exp, start_time=t0 + 60_000 * i).info.run_id
        params = [Param(k, v) for k, v in run_params(result).items()]
        tags = [RunTag(k, v) for k, v in {**run_tags(result, None), TAG_COMPLETE: "true"}.items()]
        metrics = [Metric(k, v, t0, 0) for k, v in run_metrics(result).items()]
        client.log_batch(rid, metrics=metrics, params=params[:100], tags=tags)
        client.log_artifacts(rid, str(art))
        client.set_terminated(rid, "FINISHED", t0 + 60_000 * i + 1000)
        shutil.rmtree(art)

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(one, range(n_runs)))


def _history(url: str, tag: str | None, n: int) -> Any:
    from parity_tracker.analysis.history import build_history

    hist = build_history(TARGET, tracking_uri=url, tag=tag)
    if len(hist.points) != n:
        raise AssertionError(f"history saw {len(hist.points)} commits, stored {n}")
    return hist


def _wall(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _measure(url: str, size: dict, tmp: Path, build_s: float, backend: str) -> list[Row]:
    n = size["runs"]
    case = f"{n} runs × {size['rows']} rows, {backend}"
    note = f"wall clock, median of 3; storing the runs took {build_s:.0f} s (untimed)"
    os.environ["PARITY_TRACKER_CACHE"] = str(tmp / "cache")  # never ./.parity of the cwd
    first = _wall(lambda: _history(url, None, n))  # empty heads cache: one full search
    plain = median(_wall(lambda: _history(url, None, n)) for _ in range(3))
    cold = []
    for k in range(3):  # fresh run caches (the heads kept in tmp/cache are copied along)
        _fresh_cache(tmp, f"cache{k}")
        cold.append(_wall(lambda: _history(url, TAG, n)))
    warm = median(_wall(lambda: _history(url, TAG, n)) for _ in range(3))
    legacy = _legacy_cold(url, tmp, n)
    return [
        judged(f"{NAME}: history", case, plain, "s", 1.0,
               detail=f"stored runs' heads kept locally: a search for new runs (NOT IN the "
               f"kept ids) and one for deleted ones; the first call, with nothing kept, "
               f"searched every run in {first:.2f} s; {note}"),
        judged(f"{NAME}: history --tag (cold cache)", case, median(cold), "s", 2.0,
               detail=f"runs never fetched: each status decoded from the run's own tags "
               f"(track.tag_codes), the tag list from ONE modules table fetched for the shared "
               f"fingerprint; runs logged before the codes (every table fetched with a direct "
               f"GET, 16 threads, then one scan) took {legacy:.2f} s; {note}"),
        judged(f"{NAME}: history --tag (warm cache)", case, warm, "s", 2.0,
               detail=f"the tag list kept by fingerprint: no download at all; {note}"),
    ]  # fmt: skip


def _fresh_cache(tmp: Path, name: str) -> None:
    """Point ``$PARITY_TRACKER_CACHE`` at an empty run cache holding the kept heads."""
    shutil.copytree(tmp / "cache" / "heads", tmp / name / "heads")
    os.environ["PARITY_TRACKER_CACHE"] = str(tmp / name)


def _legacy_cold(url: str, tmp: Path, n: int) -> float:
    """Cold ``history --tag`` as for runs logged before the codes: their decoding switched off."""
    from parity_tracker.track import tag_status

    _fresh_cache(tmp, "cache-legacy")
    real = tag_status.decode
    tag_status.decode = lambda tags: None
    try:
        return _wall(lambda: _history(url, TAG, n))
    finally:
        tag_status.decode = real


def run(quick: bool) -> list[Row]:
    """Rows of measurement 7."""
    size = SIZES[quick]
    saved = {k: os.environ.get(k) for k in ("PARITY_TRACKER_CACHE", "MLFLOW_TRACKING_URI")}
    with tempfile.TemporaryDirectory(prefix="parity-bench-server-") as name:
        tmp = Path(name)
        proc, pg = None, None
        try:
            backend, pg = _backend(tmp)
            proc, url = _server(tmp, backend)
            t0 = time.perf_counter()
            _store_runs(url, size["runs"], size["rows"], tmp)
            kind = "PostgreSQL backend" if pg is not None else "SQLite backend"
            return _measure(url, size, tmp, time.perf_counter() - t0, kind)
        except Exception as exc:
            return [failed(f"{NAME}: history", "server store", exc, "≤ 1")]
        finally:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # the group led by the server we started
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            if pg is not None:
                pg.cleanup()
                shutil.rmtree(pg.bench_dir, ignore_errors=True)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
