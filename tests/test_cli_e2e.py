"""End to end: the INSTALLED ``parity-tracker`` console script against a real ``mlflow server``.

Two "commits" of the tiny target (tests/cli_targets.py): c1 as is, c2 with the candidate's
``2.weight`` moved by 1e-3 (``PARITY_TEST_PERTURB=fc2``, same settings, so same configuration).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SCRIPT = Path(sys.executable).parent / "parity-tracker"
TINY = "cli_targets:tiny"
# The perturbed Linear's weight and every tag downstream of it: Linear(0) -> ReLU(1) ->
# Linear(2) -> Tanh(3); the model's own output is Tanh's.
DOWNSTREAM = {"checker_2.weight", "checker_2", "checker_3_input_0", "checker_3", "checker_model"}


def cli(args, *, cwd, uri, perturb=False):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PARITY_TEST_PERTURB": "fc2" if perturb else "none",
    }
    return subprocess.run(
        [str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.server
def test_installed_script_two_commits_diff_history_expected(mlflow_server, tmp_path, request):
    assert SCRIPT.is_file(), f"console script not installed at {SCRIPT}"
    exp = ["--experiment", f"e2e-{request.node.name}"]
    kw = {"cwd": tmp_path, "uri": mlflow_server}

    c1 = cli(["run", TINY, "--commit", "c1", *exp, "--json"], **kw)
    assert c1.returncode == 0, c1.stderr
    c2 = cli(["run", TINY, "--commit", "c2", *exp, "--json"], perturb=True, **kw)
    assert c2.returncode == 1, c2.stderr

    diff = cli(["diff", "--base-commit", "c1", "--head-commit", "c2", "--target", TINY, *exp,
                "--json"], **kw)  # fmt: skip
    assert diff.returncode == 1, diff.stderr
    rows = json.loads(diff.stdout)["rows"]
    regressions = [r for r in rows if r["change"] == "regression"]
    assert {r["tag"] for r in regressions} == DOWNSTREAM
    # in execution order the perturbed module comes first: nothing upstream of it regressed
    assert regressions[0]["tag"].startswith("checker_2")

    hist = cli(["history", TINY, "--tag", "checker_2", *exp, "--json"], **kw)
    assert hist.returncode == 0, hist.stderr
    out = json.loads(hist.stdout)
    assert [p["tag_status"] for p in out["points"]] == ["equal", "mismatch"]
    assert out["first_bad_commit"] == "c2"

    expected = tmp_path / "expected.toml"
    expected.write_text(
        f'[[expected]]\ntarget = "{TINY}"\ntag = "checker_*"\n'
        'reason = "fc2 retrained on purpose"\nuntil = 2999-12-31\n'
    )
    ok = cli(["diff", "--base-commit", "c1", "--head-commit", "c2", "--target", TINY, *exp,
              "--expected", str(expected), "--json"], **kw)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    changes = {r["tag"]: r["change"] for r in json.loads(ok.stdout)["rows"]}
    assert changes == dict.fromkeys(DOWNSTREAM, "expected")


@pytest.mark.server
def test_installed_ui_serves_the_store_on_loopback(sqlite_tracking_uri, tmp_path):
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.Popen(
        [str(SCRIPT), "ui", "--port", str(port), "--tracking-uri", sqlite_tracking_uri],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        first = proc.stdout.readline() + proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in first
        deadline, healthy = time.monotonic() + 180, False
        while time.monotonic() < deadline and proc.poll() is None and not healthy:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    healthy = r.status == 200
            except OSError:
                time.sleep(0.5)
        assert healthy, "mlflow server started by `parity-tracker ui` never became healthy"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # our script and the server it started
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
