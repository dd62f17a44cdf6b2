"""A team's shared store, for real: MLflow server on PostgreSQL (pgserver) with S3 artifacts (moto).

One module-scoped stack: PostgreSQL from the ``pgserver`` package (unix socket), moto's S3
server on 127.0.0.1, and ``mlflow server --serve-artifacts --artifacts-destination s3://...``
on 127.0.0.1 with the ``postgresql+psycopg2://`` backend URI docs/deploy.md gives. Then, as a CI
pipeline would: night 1 as two shards in two processes at once, merged; night 2 (a regression
injected with $PARITY_TEST_PERTURB) as two shards while the server is restarted, merged; then
``history --tag`` and ``diff`` with 12-character run-id prefixes. Every command's ``--json``
stdout must parse as exactly one JSON document.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

TESTS = Path(__file__).resolve().parent
MATRIX = """
[[matrix]]
target = "cli_targets:tiny"
quantization = ["none", "bf16"]

[[matrix]]
target = "cli_targets:tiny"
perturb = ["fc2"]
"""
CELLS = {
    "cli_targets:tiny[perturb=none,quantization=none]",
    "cli_targets:tiny[perturb=none,quantization=bf16]",
    "cli_targets:tiny[perturb=fc2,quantization=none]",
}


def _mlflow(port: int, backend: str, bucket: str, env: dict, log: Path) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--backend-store-uri", backend,
        "--serve-artifacts", "--artifacts-destination", f"s3://{bucket}/mlartifacts",
    ]  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the group led by the server we started
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Stack:
    """The running stack; ``restart()`` stops the mlflow server and starts it again."""

    def __init__(self, root: Path) -> None:
        import boto3
        import pgserver
        from conftest import _free_port
        from moto.server import ThreadedMotoServer

        self.root = root
        # Not under pytest's tmp folder: as root, pgserver runs postgres as user "pgserver",
        # who cannot enter /tmp/pytest-of-root (mode 700); and a unix socket path must be short.
        self.pg_dir = tempfile.mkdtemp(prefix="parity-pg-")
        self.pg = pgserver.get_server(self.pg_dir, cleanup_mode="stop")
        # SQLAlchemy 2.x: a plain postgresql:// URI picks psycopg (3); name the driver installed
        self.backend = self.pg.get_uri().replace("postgresql://", "postgresql+psycopg2://", 1)
        s3_port = _free_port()
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
        self.moto.start()
        self.s3 = f"http://127.0.0.1:{s3_port}"
        creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
        boto3.client("s3", endpoint_url=self.s3, **{
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
            "region_name": "us-east-1"}).create_bucket(Bucket="parity")  # fmt: skip
        self.env = {**os.environ, **creds, "MLFLOW_S3_ENDPOINT_URL": self.s3}
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "mlflow.log"
        self.proc = None
        self.start()

    def start(self) -> None:
        from conftest import _wait_healthy

        self.proc = _mlflow(self.port, self.backend, "parity", self.env, self.log)
        _wait_healthy(self.url, self.proc, self.log)

    def restart(self, down_s: float = 2.0) -> None:
        _stop(self.proc)
        time.sleep(down_s)
        self.start()

    def close(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
        self.moto.stop()
        self.pg.cleanup()
        shutil.rmtree(self.pg_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("stack"))
    try:
        yield s
    finally:
        s.close()


def _cli_env(stack: Stack, work: Path, **extra: str) -> dict:
    """A CI job's environment: the server, a long retry window, no S3 credentials at all."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_S3"))}
    env.update(
        MLFLOW_TRACKING_URI=stack.url,
        PARITY_TRACKER_STORE_RETRY_S="150",
        PARITY_TRACKER_CACHE=str(work / "cache"),
        PYTHONPATH=str(TESTS),
        **extra,
    )
    return env


def _start(args: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("parity-tracker")), *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, dict, str]:
    out, err = proc.communicate(timeout=timeout)
    try:
        doc = json.loads(out)  # exactly one JSON document, nothing else on stdout
    except json.JSONDecodeError as exc:
        raise AssertionError(f"stdout is not one JSON document ({exc}):\n{out}\n{err}") from exc
    return proc.returncode, doc, err


def _shards(stack: Stack, work: Path, cfg: Path, commit: str, extra: list[str], env: dict):
    return [
        _start(["nightly", "--config", str(cfg), "--shard", f"{i}/2", "--commit", commit,
                "--json", *extra], env, work)
        for i in (1, 2)
    ]  # fmt: skip


def _night_parent_exists(url: str, night: str) -> bool:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(url)
    exp = client.get_experiment_by_name("parity")
    if exp is None:
        return False
    runs = client.search_runs([exp.experiment_id], f"tags.`parity.night` = '{night}'")
    return bool(runs)


def test_sharded_nights_merge_restart_history_diff(stack, tmp_path):
    work = tmp_path / "job"
    work.mkdir()
    cfg = work / "nightly.toml"
    cfg.write_text(MATRIX)
    env = _cli_env(stack, work)

    # night 1: two shards at once, then the merge
    procs = _shards(stack, work, cfg, "c1" * 20, ["--night", "night-1"], env)
    results = [_finish(p) for p in procs]
    assert [r[0] for r in results] == [0, 0], results  # failing, no regression: --fail-on ok
    assert {c["cell"] for r in results for c in r[1]["cells"]} == CELLS
    assert {r[1]["night"] for r in results} == {"night-1"}
    code, night1, _ = _finish(_start(["nightly-merge", "--night", "night-1", "--json"], env, work))
    assert code == 0 and night1["shard"] == "0/2" and night1["regressions"] == 0
    assert {c["cell"] for c in night1["cells"]} == CELLS
    assert "Cells without a baseline" in night1["digest"]
    assert all(c["cell"] in night1["digest"] and c["baseline_run_id"] is None
               for c in night1["cells"])  # fmt: skip

    # night 2 (default night id), a regression injected; the server restarts mid-run
    commit2 = "c2" * 20
    today = dt.datetime.now(dt.timezone.utc).date()
    night2 = f"{today:%Y%m%d}-{commit2[:12]}-{hashlib.sha256(cfg.read_bytes()).hexdigest()[:8]}"
    env2 = {**env, "PARITY_TEST_PERTURB": "fc2"}
    procs = _shards(stack, work, cfg, commit2, [], env2)
    deadline = time.monotonic() + 120
    while not _night_parent_exists(stack.url, night2):
        assert time.monotonic() < deadline, "no shard of night 2 started"
        time.sleep(0.2)
    stack.restart()
    results = [_finish(p) for p in procs]
    # shard 1 (the equal-mode cell) regresses: exit 1; shard 2's bf16 cell may stay in tolerance
    assert results[0][0] == 1 and results[1][0] in (0, 1), [r[2][-2000:] for r in results]
    assert all(not r[1]["spooled"] and not any(c["error"] for c in r[1]["cells"])
               for r in results)  # fmt: skip
    assert not (work / ".parity" / "spool").exists()  # nothing spooled

    code, merged, _ = _finish(_start(["nightly-merge", "--night", night2, "--json"], env, work))
    assert code == 1 and merged["night"] == night2 and merged["regressions"] > 0
    base1 = {c["cell"]: c["run_id"] for c in night1["cells"]}
    by_cell = {c["cell"]: c for c in merged["cells"]}
    assert set(by_cell) == CELLS
    for name, cell in by_cell.items():  # each baseline is that cell's run of night 1
        assert cell["baseline_run_id"] == base1[name]
    reg = by_cell["cli_targets:tiny[perturb=none,quantization=none]"]
    assert reg["changes"]["regression"] > 0 and "## Regressions" in merged["digest"]

    # history --tag over the server, then diff by 12-character prefixes (as history prints);
    # a fresh cache: the runs were never fetched here, and their statuses come from their own
    # MLflow tags (track.tag_codes): ONE modules table is downloaded, for the shared tag list
    fresh = work / "cache-fresh"
    fresh_env = {**env, "PARITY_TRACKER_CACHE": str(fresh)}
    code, hist, _ = _finish(_start(
        ["history", "cli_targets:tiny", "--set", "perturb=none", "--set", "quantization=none",
         "--tag", "checker_2", "--json"], fresh_env, work))  # fmt: skip
    assert code == 0
    assert len(list((fresh / "files").glob("*/tables/modules.parquet"))) == 1
    assert len(list((fresh / "tag_lists").glob("*.json"))) == 1
    assert [p["commit"] for p in hist["points"]] == ["c1" * 20, commit2]
    assert [p["tag_status"] for p in hist["points"]] == ["equal", "mismatch"]
    assert hist["first_bad_commit"] == commit2
    base, head = (p["run_id"][:12] for p in hist["points"])
    diff = subprocess.run(
        [str(Path(sys.executable).with_name("parity-tracker")), "diff", base, head,
         "--format", "markdown"], cwd=work, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert diff.returncode == 1, diff.stderr
    assert "regression" in diff.stdout and "checker_2" in diff.stdout
