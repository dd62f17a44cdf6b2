"""The server heads cache (``track.heads_cache``) never shows a run the server no longer has.

A real ``mlflow server`` (SQLite backend under tmp_path): runs deleted and garbage-collected
with ``mlflow gc``, and a fresh server behind the same URL. The truth is what the test itself
created and deleted, and MLflow's own full search (``find_runs``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.server


def _start(db, root, port):
    from conftest import _wait_healthy

    log = root / f"server-{db.stem}.log"
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1", "--backend-store-uri", f"sqlite:///{db}", "--serve-artifacts",
           "--artifacts-destination", str(root / f"artifacts-{db.stem}")]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root,
                                start_new_session=True)  # fmt: skip
    _wait_healthy(f"http://127.0.0.1:{port}", proc, log)
    return proc


def _stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the group our server leads
        proc.wait(timeout=20)


def _runs(uri, n, target="toy"):
    from parity_tracker.track.store import get_client, get_or_create_experiment

    client = get_client(uri)
    exp = get_or_create_experiment(client, "parity")
    ids = []
    for _ in range(n):
        rid = client.create_run(exp).info.run_id
        client.log_param(rid, "target", target)
        client.set_tag(rid, "parity.complete", "true")
        client.set_terminated(rid, "FINISHED")
        ids.append(rid)
    return ids


def test_deleted_gc_and_fresh_server_runs_leave_the_kept_heads(
    sqlite_template, tmp_path, monkeypatch
):
    from conftest import _free_port

    from parity_tracker.track import heads_cache
    from parity_tracker.track.search import find_runs
    from parity_tracker.track.store import get_client

    monkeypatch.setenv("PARITY_TRACKER_CACHE", str(tmp_path / "cache"))
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    db1, db2 = tmp_path / "one.db", tmp_path / "two.db"
    shutil.copyfile(sqlite_template, db1)
    shutil.copyfile(sqlite_template, db2)
    searches = []
    real = heads_cache._search
    monkeypatch.setattr(
        heads_cache, "_search", lambda c, e, f, *a: searches.append(f) or real(c, e, f, *a)
    )

    def heads():
        return [r.run_id for r in heads_cache.server_run_infos(uri, "parity", {"target": "toy"})]

    def truth():
        return [r.run_id for r in find_runs(tracking_uri=uri, target="toy")]

    proc = _start(db1, tmp_path, port)
    try:
        ids = _runs(uri, 4)
        assert sorted(heads()) == sorted(ids)  # first call: full search, heads kept
        searches.clear()
        assert sorted(heads()) == sorted(ids)  # kept, checked by the one-run probe
        assert not [f for f in searches if f.startswith("attributes.run_id IN")]  # no full read
        client = get_client(uri)
        client.delete_run(ids[1])
        client.delete_run(ids[3])
        gc = subprocess.run(
            [sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", f"sqlite:///{db1}"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "MLFLOW_TRACKING_URI": uri},
        )  # fmt: skip
        assert gc.returncode == 0, gc.stderr[-2000:]
        assert heads() == truth() and sorted(heads()) == sorted([ids[0], ids[2]])
    finally:
        _stop(proc)
    proc = _start(db2, tmp_path, port)  # a fresh server behind the same URL
    try:
        fresh = _runs(uri, 1)
        assert heads() == truth() == fresh
    finally:
        _stop(proc)
