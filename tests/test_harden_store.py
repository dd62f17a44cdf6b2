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
    assert resolve_tracking_uri("sqlite:///rel/x.db") == f"sqlite:///{cwd / 'rel' / 'x.db'}"


@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_log_run_puts_db_and_artifacts_together(form, tiny_pair, in_tmp_cwd):
    """From a cwd other than /: the database and artifacts both lie under tmp_path."""
    cwd = in_tmp_cwd.resolve()
    uri = "sqlite:///rel/x.db" if form == "relative" else f"sqlite:///{cwd / 'rel' / 'x.db'}"
    before = set(Path("/").iterdir())
    result = run_parity(*tiny_pair, settings=SETTINGS, environment=ENV)
    run_id = log_run(result, tracking_uri=uri, experiment="parity")
    assert (cwd / "rel" / "x.db").is_file()
    stored = list((cwd / "rel" / "artifacts").rglob("modules.parquet"))
    assert len(stored) == 1 and run_id in stored[0].parts
    assert set(Path("/").iterdir()) == before  # nothing new under /, e.g. /rel or /artifacts
    assert not Path("/rel").exists()


# --------------------------------------------------------------------------- items 1, 2, 5


def _invoke(args: list[str]):
    from click.testing import CliRunner

    from parity_tracker.cli import cli

    return CliRunner().invoke(cli, args, catch_exceptions=False)


def _stored(uri: str, run_id: str, name: str) -> Path:
    from parity_tracker.track.store import get_client

    art = get_client(uri).get_run(run_id).info.artifact_uri
    return Path(art.removeprefix("file://")) / name


def _damage(path: Path, how: str) -> None:
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif how == "deleted":
        path.unlink()
    elif how == "random":
        path.write_bytes(bytes(range(256)) * 8)
    elif how == "garbage":
        path.write_text("{not json", encoding="utf-8")
    elif how == "schema_abc":
        import json

        data = json.loads(path.read_text(encoding="utf-8"))
        data["schema_version"] = "abc"
        path.write_text(json.dumps(data), encoding="utf-8")


DAMAGES = [
    ("tables/modules.parquet", "truncated"),
    ("tables/modules.parquet", "deleted"),
    ("tables/modules.parquet", "random"),
    ("tables/ops.parquet", "truncated"),
    ("summary.json", "garbage"),
    ("summary.json", "schema_abc"),
    ("summary.json", "deleted"),
]


@pytest.mark.parametrize(("name", "how"), DAMAGES)
def test_damaged_artifact_is_exit_3_naming_run_and_file(
    name, how, tiny_pair, sqlite_tracking_uri, in_tmp_cwd
):
    uri = sqlite_tracking_uri
    run_a = log_run(run_parity(*tiny_pair, settings=SETTINGS, environment=ENV), tracking_uri=uri)
    run_b = log_run(run_parity(*tiny_pair, settings=SETTINGS, environment=ENV), tracking_uri=uri)
    _damage(_stored(uri, run_b, name), how)
    # report reads every file; diff reads only the modules tables (RunStore.load_tables), so a
    # damaged ops table or summary leaves diff's answer intact (exit 0), never a false exit 1
    readers = [["report", run_b]]
    if name == "tables/modules.parquet":
        readers.append(["diff", run_a, run_b])
    else:
        assert _invoke(["diff", run_a, run_b, "--tracking-uri", uri]).exit_code == 0
    for args in readers:
        got = _invoke([*args, "--tracking-uri", uri])
        assert got.exit_code == 3, (args, got.output)
        assert run_b in got.output and "Traceback" not in got.output
        if how != "deleted":
            assert name in got.output


def test_malformed_run_id_is_usage_error(sqlite_tracking_uri, in_tmp_cwd):
    for args in (["diff", "x'", "y"], ["report", "../x"]):
        got = _invoke([*args, "--tracking-uri", sqlite_tracking_uri])
        assert got.exit_code == 2, got.output
        assert "malformed" in got.output


def test_incomplete_run_is_skipped_by_history_and_refused_by_report(
    tiny_pair, sqlite_tracking_uri, in_tmp_cwd
):
    """A KILLED run without tables (its writer died mid-upload) never breaks history."""
    from parity_tracker.track.store import get_client

    uri = sqlite_tracking_uri
    good = log_run(run_parity(*tiny_pair, settings=SETTINGS, environment=ENV), tracking_uri=uri)
    client = get_client(uri)
    src = client.get_run(good)
    bad = client.create_run(src.info.experiment_id, start_time=src.info.start_time + 10)
    bad_id = bad.info.run_id
    for key, value in src.data.params.items():
        client.log_param(bad_id, key, value)
    client.set_tag(bad_id, "parity.run_id", "f" * 32)
    client.set_tag(bad_id, "mlflow.source.git.commit", "fffe")
    client.set_terminated(bad_id, "KILLED")
    from parity_tracker.analysis.history import build_history  # "tiny" is no registered target

    got = build_history("tiny", {"quantization": "none"}, tracking_uri=uri, tag="checker_fc2")
    assert got.skipped == [bad_id]
    assert [p.run_id for p in got.points] == [good]
    assert got.points[0].tag_status == "mismatch"
    rep = _invoke(["report", bad_id, "--tracking-uri", uri])
    assert rep.exit_code == 3 and "incomplete" in rep.output and bad_id in rep.output
