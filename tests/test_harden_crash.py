"""Issue 14 item 1: a writer killed at any upload step leaves nothing RUNNING after `sync`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from parity_tracker.cli import cli
from parity_tracker.track.owner import (
    TAG_OWNER_HOST,
    TAG_OWNER_PID,
    TAG_OWNER_START,
    reap_stale_runs,
)
from parity_tracker.track.store import get_client, get_or_create_experiment

TESTS = Path(__file__).resolve().parent
SCRIPT = Path(sys.executable).parent / "parity-tracker"
TINY = "cli_targets:tiny"
STEPS = ("staging", "staged", "created", "logged", "artifacts", "terminated")


def _runs(uri: str) -> list:
    client = get_client(uri)
    exp = client.get_experiment_by_name("parity")
    return [] if exp is None else client.search_runs([exp.experiment_id])


def _invoke(args: list[str]):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS)
def test_sigkill_at_each_upload_step_then_sync(step, sqlite_tracking_uri, in_tmp_cwd):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PARITY_TRACKER_FAULT": step,
        "TMPDIR": str(in_tmp_cwd),
    }
    uri = sqlite_tracking_uri
    args = [str(SCRIPT), "run", TINY, "--tracking-uri", uri]
    proc = subprocess.run(args, cwd=in_tmp_cwd, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    staging = in_tmp_cwd / ".parity" / "spool" / ".staging"
    assert len(list(staging.iterdir())) == 1  # the killed writer's staging, inside the spool
    assert not list(in_tmp_cwd.glob("parity-stage-*"))

    got = _invoke(["sync", "--tracking-uri", uri])
    assert got.exit_code == 0, got.output
    runs = _runs(uri)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    spool = in_tmp_cwd / ".parity" / "spool"  # staging finished or removed, no entry left
    assert not spool.exists() or not [p for p in spool.iterdir() if p.suffix != ".lock"]
    if step == "staging":  # killed before the upload began: nothing to finish
        assert runs == []
        return
    assert len(runs) == 1 and runs[0].data.tags["parity.complete"] == "true"
    hist = _invoke(["history", TINY, "--tag", "checker_2", "--tracking-uri", uri, "--json"])
    assert hist.exit_code == 0, hist.output
    assert '"tag_status": "equal"' in hist.output


def _running(client, exp_id: str, tags: dict[str, str], start_ms: int) -> str:
    run = client.create_run(exp_id, start_time=start_ms)
    for key, value in {"parity.run_id": run.info.run_id, **tags}.items():
        client.set_tag(run.info.run_id, key, value)
    return run.info.run_id


def test_reap_marks_dead_owner_and_old_foreign_runs_killed(sqlite_tracking_uri):
    import socket

    import psutil

    uri = sqlite_tracking_uri
    client = get_client(uri)
    exp = get_or_create_experiment(client, "parity")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = psutil.Process(dead.pid).create_time() if psutil.pid_exists(dead.pid) else 1.0
    dead.wait()
    me = psutil.Process(os.getpid())
    host = socket.gethostname()
    now = time.time()
    ids = {
        "dead": _running(client, exp, {TAG_OWNER_HOST: host, TAG_OWNER_PID: str(dead.pid),
                                        TAG_OWNER_START: str(dead_start)}, int(now * 1000)),
        "alive": _running(client, exp, {TAG_OWNER_HOST: host, TAG_OWNER_PID: str(me.pid),
                                         TAG_OWNER_START: str(me.create_time())}, int(now * 1000)),
        "foreign_old": _running(client, exp, {TAG_OWNER_HOST: "elsewhere", TAG_OWNER_PID: "1",
                                               TAG_OWNER_START: "1"}, int((now - 3600) * 1000)),
        "foreign_new": _running(client, exp, {TAG_OWNER_HOST: "elsewhere", TAG_OWNER_PID: "1",
                                               TAG_OWNER_START: "1"}, int((now - 60) * 1000)),
        "no_owner_old": _running(client, exp, {}, int((now - 3600) * 1000)),
    }  # fmt: skip
    killed = reap_stale_runs(uri, now=now, timeout_s=1800)
    assert sorted(killed) == sorted([ids["dead"], ids["foreign_old"], ids["no_owner_old"]])
    status = {k: client.get_run(v).info.status for k, v in ids.items()}
    assert status == {"dead": "KILLED", "alive": "RUNNING", "foreign_old": "KILLED",
                      "foreign_new": "RUNNING", "no_owner_old": "KILLED"}  # fmt: skip
