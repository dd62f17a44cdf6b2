"""Issue 14: SQLite URIs read as SQLAlchemy reads them; killed runs; damaged artifacts."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from parity_tracker.run import run_parity
from parity_tracker.track import log_run
from parity_tracker.track.store import (
    artifact_root,
    resolve_tracking_uri,
    sqlite_path,
    tag_index_path,
)

SETTINGS = {"target": "tiny", "candidate": "scaled", "quantization": "none"}
ENV = {"git_commit": "0123abcd", "git_branch": "main"}


@pytest.fixture(autouse=True)
def _temp_folder_in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(exist_ok=True)


# --------------------------------------------------------------------------- item 6: URIs


def test_sqlite_path_reads_uris_as_sqlalchemy(in_tmp_cwd):
    cwd = in_tmp_cwd.resolve()
    assert sqlite_path("sqlite:///rel/x.db") == cwd / "rel" / "x.db"
    assert sqlite_path("sqlite:///mlflow.db") == cwd / "mlflow.db"
    assert sqlite_path("sqlite:////abs/x.db") == Path("/abs/x.db")
    assert sqlite_path("sqlite:///rel/x.db?timeout=3") == cwd / "rel" / "x.db"
    assert sqlite_path("sqlite://") is None and sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("http://127.0.0.1:5000") is None
    assert artifact_root("sqlite:///mlflow.db") == (cwd / "artifacts").as_uri()
    assert tag_index_path("sqlite:///rel/x.db") == cwd / "rel" / "parity_index.db"
    assert resolve_tracking_uri("sqlite:///rel/x.db") == f"sqlite:///{cwd / 'rel' / 'x.db'}"


@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_log_run_puts_db_artifacts_and_index_together(form, tiny_pair, in_tmp_cwd):
    """From a cwd other than /: the database, artifacts and index all lie under tmp_path."""
    cwd = in_tmp_cwd.resolve()
    uri = "sqlite:///rel/x.db" if form == "relative" else f"sqlite:///{cwd / 'rel' / 'x.db'}"
    before = set(Path("/").iterdir())
    result = run_parity(*tiny_pair, settings=SETTINGS, environment=ENV)
    run_id = log_run(result, tracking_uri=uri, experiment="parity")
    assert (cwd / "rel" / "x.db").is_file()
    assert (cwd / "rel" / "parity_index.db").is_file()
    stored = list((cwd / "rel" / "artifacts").rglob("modules.parquet"))
    assert len(stored) == 1 and run_id in stored[0].parts
    assert set(Path("/").iterdir()) == before  # nothing new under /, e.g. /rel or /artifacts
    assert not Path("/rel").exists()
