"""The CLI keeps library chatter off the terminal, and never our own warnings (``cli.quiet``).

The process tests run the real console entry point on a fresh SQLite store (tables created on
first use: where MLflow and alembic print their INFO lines) in a tmp folder that is no git
checkout; a control process shows the same store setup is noisy without the CLI.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity_tracker.cli.quiet import quiet_libraries

TESTS = Path(__file__).resolve().parent
NOISE = ("INFO  [alembic", "INFO mlflow.store.db.utils")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
               MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")  # fmt: skip
    return env


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


@pytest.mark.slow
def test_cli_on_a_fresh_store_prints_no_library_info_but_keeps_our_warnings(tmp_path):
    # control: creating a fresh store outside the CLI prints MLflow's INFO lines
    control = _run(["-c", "from mlflow.tracking import MlflowClient; "
                    "MlflowClient(tracking_uri='sqlite:///control.db').search_experiments()"],
                   tmp_path)  # fmt: skip
    assert control.returncode == 0, control.stderr
    assert "INFO mlflow.store.db.utils" in control.stderr

    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    res = _run(["-m", "parity_tracker.cli", "run", "cli_targets:tiny", "--tracking-uri", uri,
                "--mode", "equal", "--rtol", "0.01", "--atol", "0.001"], tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert not [line for line in res.stderr.splitlines() if line.startswith(NOISE)], res.stderr
    assert "INFO" not in res.stderr
    # our own warning still shows
    assert "warning: --rtol/--atol have no effect with --mode equal" in res.stderr
    # and our errors: an unknown target exits 2 with its message
    bad = _run(["-m", "parity_tracker.cli", "run", "no-such-target", "--tracking-uri", uri],
               tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "no-such-target" in bad.stderr


def _record(name: str, level: int, msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_filters_drop_only_the_listed_records():
    quiet_libraries()
    quiet_libraries()  # idempotent: one filter per logger
    db = logging.getLogger("mlflow.store.db.utils")
    assert len(db.filters) == 1
    assert not db.filter(
        _record(db.name, logging.INFO, "Creating initial MLflow database tables...")
    )
    assert db.filter(_record(db.name, logging.WARNING, "database is locked"))
    mig = logging.getLogger("alembic.runtime.migration")
    assert not mig.filter(_record(mig.name, logging.INFO, "Context impl SQLiteImpl."))
    assert mig.filter(_record(mig.name, logging.ERROR, "Can't locate revision"))

    onnx = logging.getLogger("torch.onnx._internal.exporter._registration")
    skip = "torchvision is not installed. Skipping %s"
    assert not onnx.filter(_record(onnx.name, logging.WARNING, skip, "torchvision::nms"))
    assert onnx.filter(_record(onnx.name, logging.WARNING, "Cannot register %s", "aten::foo"))

    diff = logging.getLogger("diffusers.models.modeling_utils")
    empty = ("There are modules in AutoencoderKL that should be kept in float32: []. Casting "
             "directly with `to()` can lead to inconsistent results")  # fmt: skip
    assert not diff.filter(_record(diff.name, logging.WARNING, empty))
    # a non-empty list is a real warning: kept
    assert diff.filter(_record(diff.name, logging.WARNING, empty.replace("[]", "['norm']")))

    ours = logging.getLogger("parity_tracker")
    assert ours.filter(_record(ours.name, logging.INFO, "anything"))
    assert not ours.filters


#: What ``parity-tracker ui``'s ``mlflow server`` child printed (MLflow 3.17, uvicorn), copied.
SERVER_NOISE = [
    "2026/12/01 03:16:33 INFO mlflow.server.jobs.executor_registry: Available backends after "
    "discovery: local",
    "2026/12/01 03:16:39 INFO:     Started server process [3920]",
    "2026/12/01 03:16:39 INFO:     Waiting for application startup.",
    'INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 200 OK',
    "2026/12/01 03:16:45 INFO:     Shutting down",
    "Registry store URI not provided. Using backend store URI.",
]
SERVER_KEPT = [
    "2026/12/01 03:16:41 INFO:     Uvicorn running on http://127.0.0.1:35375 (Press CTRL+C to "
    "quit)",
    "2026/12/01 03:16:41 WARNING mlflow.server: something a user must see",
    "ERROR:    [Errno 98] error while attempting to bind on address",
    "[MLflow] Security middleware enabled with default settings (localhost-only).",
]


def test_ui_server_output_keeps_where_the_ui_is_warnings_and_errors(capsys):
    from parity_tracker.cli.quiet import server_line_shown
    from parity_tracker.cli.serve import serve

    assert [line for line in SERVER_NOISE + SERVER_KEPT if server_line_shown(line)] == SERVER_KEPT
    # through serve(): a child printing them on stdout and stderr; what reaches our stderr
    script = (
        "import sys\n"
        f"for i, line in enumerate({SERVER_NOISE + SERVER_KEPT!r}):\n"
        "    print(line, file=sys.stderr if i % 2 else sys.stdout, flush=True)\n"
    )
    code = serve([sys.executable, "-c", script], host="127.0.0.1", port=1,
                 keep_line=server_line_shown)  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0 and out == ""  # our stdout stays ours (ui --json)
    assert err.splitlines() == SERVER_KEPT
