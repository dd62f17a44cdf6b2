"""The MLflow UI side against real servers: the README's search filters, a nightly's tags and
files, and ``parity-tracker ui`` stopping cleanly on SIGTERM / SIGINT.

Expected run sets are written out by hand from the runs each test logs.
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SCRIPT = Path(sys.executable).with_name("parity-tracker")
ABC, DEF = "abc123" + "0" * 34, "def456" + "0" * 34


def readme_filters() -> list[str]:
    """The filters of the README's ``<!-- ui-filters -->`` block (comment lines left out)."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- ui-filters -->\s*```text\n(.*?)```", text, re.S)
    assert block, "README.md lost its <!-- ui-filters --> block"
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip() and ln[0] != "#"]


@contextlib.contextmanager
def tracking(uri: str):
    import mlflow

    old = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield mlflow
    finally:
        mlflow.set_tracking_uri(old)


@pytest.mark.server
def test_readme_filters_find_the_runs_they_promise(
    mlflow_server, tiny_pair, tiny_equal_pair, tmp_path, request
):
    from parity_tracker.run import run_parity
    from parity_tracker.track import log_run

    exp = f"filters-{request.node.name}"
    logged = {}
    for name, pair, settings, commit in [
        ("A", tiny_pair, {"target": "vae-tiny", "quantization": "int8"}, ABC),
        ("B", tiny_equal_pair, {"target": "vae-tiny", "quantization": "none"}, ABC),
        ("C", tiny_pair, {"target": "llama-tiny", "quantization": "int8"}, DEF),
    ]:
        result = run_parity(*pair[:2], pair[2], settings=settings)
        logged[name] = log_run(result, tracking_uri=mlflow_server, experiment=exp, commit=commit,
                               render=None, spool_dir=tmp_path / "spool")  # fmt: skip
    # A and C: tiny_pair's injected divergence at fc2's input; B: bitwise equal copies
    expected = {
        "params.target = 'vae-tiny' and tags.verdict = 'fail'": {"A"},
        "tags.verdict != 'pass'": {"A", "C"},
        "tags.`mlflow.source.git.commit` LIKE 'abc123%'": {"A", "B"},
        "metrics.tensors_failing > 0 and params.quantization = 'int8'": {"A", "C"},
        "metrics.output_max_abs_diff > 0": {"A", "C"},
        "tags.first_divergence LIKE 'checker_fc2%'": {"A", "C"},
    }
    filters = readme_filters()
    assert set(filters) == set(expected), "README filters and this test disagree"
    names = {v: k for k, v in logged.items()}
    with tracking(mlflow_server) as mlflow:
        exp_id = mlflow.get_experiment_by_name(exp).experiment_id
        for flt in filters:
            runs = mlflow.search_runs([exp_id], filter_string=flt, output_format="list")
            assert {names[r.info.run_id] for r in runs} == expected[flt], flt
        # the parity view's own filter keeps parity runs only
        view = mlflow.search_runs([exp_id], filter_string="params.target LIKE '%'",
                                  output_format="list")  # fmt: skip
        assert len(view) == 3


def _nightly(server: str, exp: str, tmp_path: Path):
    from parity_tracker.cli import report_files
    from parity_tracker.dashboards.digest import nightly_artifacts
    from parity_tracker.pipeline.nightly import run_nightly

    config = tmp_path / "nightly.toml"
    config.write_text('[[matrix]]\ntarget = "cli_targets:tiny"\nperturb = ["none", "fc2"]\n')
    return run_nightly(config, tracking_uri=server, experiment=exp, commit=ABC, branch="main",
                       render=nightly_artifacts, render_run=report_files)  # fmt: skip


@pytest.mark.server
@pytest.mark.slow
def test_nightly_runs_carry_descriptions_and_csv_files(mlflow_server, tmp_path, request,
                                                       monkeypatch):  # fmt: skip
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PARITY_TEST_PERTURB", raising=False)
    exp = f"nightly-{request.node.name}"
    result = _nightly(mlflow_server, exp, tmp_path)
    client = MlflowClient(mlflow_server)
    exp_id = client.get_experiment_by_name(exp).experiment_id
    parent = client.get_run(result.parent_run_id)
    assert parent.data.tags["mlflow.note.content"] == result.digest
    assert parent.data.tags["mlflow.source.type"] == "JOB"
    with open(client.download_artifacts(result.parent_run_id, "cells.csv", str(tmp_path))) as f:
        cells = list(csv.DictReader(f))
    assert [(c["cell"], c["status"]) for c in cells] == [
        ("cli_targets:tiny[perturb=none,quantization=none]", "pass"),
        ("cli_targets:tiny[perturb=fc2,quantization=none]", "fail"),
    ]  # fmt: skip
    for cell, row in zip(result.cells, cells, strict=True):
        run = client.get_run(cell.run_id)
        tags = run.data.tags
        verdict = "pass" if row["status"] == "pass" else "fail"
        assert tags["verdict"] == verdict
        assert f"(verdict `{verdict}`)" in tags["mlflow.note.content"]
        assert (tags["mlflow.source.name"], tags["mlflow.source.type"]) == (
            "parity-tracker nightly", "JOB",
        )  # fmt: skip
        arts = {a.path for a in client.list_artifacts(cell.run_id, "tables")}
        assert ("tables/failing.csv" in arts) == (verdict == "fail")
        # the digest links each cell to its run page on the server
        url = f"{mlflow_server}/#/experiments/{exp_id}/runs/{cell.run_id}?workflowType="
        assert url in result.digest
    fail = client.get_run(result.cells[1].run_id).data.tags
    assert fail["first_divergence"] == "checker_2"  # layer 2's weight moved (cli_targets.tiny)
    assert "- first divergence: `checker_2` (module `2`, output" in fail["mlflow.note.content"]


# --------------------------------------------------------------------------- clean stop


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port: int) -> bool:
    """Whether a new server could bind the port (``SO_REUSEADDR``, as servers bind)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _healthy(port: int, proc: subprocess.Popen, timeout_s: float = 180) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            time.sleep(0.5)
    return False


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_ui_stops_its_server_and_frees_the_port(sig, sqlite_tracking_uri, tmp_path):
    port = _free_port()
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    log = tmp_path / "ui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(SCRIPT), "ui", "--no-open", "--port", str(port), "--tracking-uri",
             sqlite_tracking_uri],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        assert _healthy(port, proc), f"the server never answered /health:\n{log.read_text()}"
        assert f"open http://127.0.0.1:{port}/#/experiments" in log.read_text()
        assert not _port_free(port)
        started = time.monotonic()
        proc.send_signal(sig)  # to `parity-tracker ui` only, not to its server's group
        code = proc.wait(timeout=10)
        took = time.monotonic() - started
        assert _port_free(port), "the port is still held after ui exited"
        assert code == 128 + sig
        assert took < 10
        # the server's INFO chatter is filtered (cli.quiet): only where the UI is stays
        text = log.read_text()
        assert f"Uvicorn running on http://127.0.0.1:{port}" in text
        assert [
            ln for ln in text.splitlines() if "INFO" in ln and "Uvicorn running" not in ln
        ] == []
    finally:
        if proc.poll() is None:  # let ui stop its server, then make sure
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
