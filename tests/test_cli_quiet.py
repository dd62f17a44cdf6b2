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
