"""Parity runs in MLflow: round trip (SQLite and a real server), faults, spool, concurrency."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

from parity_tracker.dashboards import render_run_report
from parity_tracker.files.tables import read_table
from parity_tracker.run import config_fingerprint, run_parity
from parity_tracker.run.environment import ENV_KEYS
from parity_tracker.track import (
    SpooledError,
    end_run,
    find_runs,
    load_run,
    log_run,
    start_parent_run,
    sync_spool,
)
from parity_tracker.track.store import get_client
from parity_tracker.track.tag_codes import decode, ordered_tags

SETTINGS = {"target": "tiny", "candidate": "scaled", "quantization": "none", "device": "cpu",
            "dtype": "float32"}  # fmt: skip
ENV = {
    "git_commit": "0123abcd", "git_branch": "main", "git_dirty": False, "torch_version": "x",
    "parity_tracker_version": "0.1.0", "num_threads": 2, "deterministic": False, "tf32": False,
}  # fmt: skip


@pytest.fixture(autouse=True)
def _temp_folder_in_tmp_path(tmp_path, monkeypatch):
    """Default dumps and spills (``tempfile.gettempdir()``) land in this test's ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(exist_ok=True)


@pytest.fixture(params=["sqlite", pytest.param("server", marks=pytest.mark.server)])
def store_uri(request) -> str:
    """The same tests through a SQLite store and through the real mlflow server."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_tracking_uri")
    return request.getfixturevalue("mlflow_server")


def _experiment() -> str:
    return f"parity-{uuid.uuid4().hex[:8]}"  # the session's server is shared between tests


def _artifacts(client, run_id: str, path: str | None = None) -> set[str]:
    out = set()
    for f in client.list_artifacts(run_id, path):
        out |= _artifacts(client, run_id, f.path) if f.is_dir else {f.path}
    return out


def _assert_same(loaded, original) -> None:
    assert loaded.run_id == original.run_id
    assert loaded.modules.equals(original.modules)
    assert loaded.ops.equals(original.ops)
    assert loaded.summary == original.summary
    assert loaded.settings == original.settings
    assert loaded.first_divergence == original.first_divergence


def test_round_trip_params_tags_metrics_artifacts(tiny_pair, store_uri, in_tmp_cwd):
    reference, candidate, inputs = tiny_pair
    result = run_parity(reference, candidate, inputs, settings=SETTINGS, environment=ENV)
    exp = _experiment()
    run_id = log_run(result, tracking_uri=store_uri, experiment=exp, run_name="tiny-1",
                     commit="feedbeef", branch="feature/x",
                     render=lambda r: {"report.html": render_run_report(r)})  # fmt: skip
    assert result.tracking_run_id == run_id
    client = get_client(store_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny-1"
    params = run.data.params
    assert set(params) == set(SETTINGS) | set(ENV_KEYS) | {"mode", "mode_reason",
        "config_fingerprint", "reference_model", "candidate_model"}  # fmt: skip
    # the sides' class names (the report's title when no target names them), not fingerprinted
    assert params["reference_model"] == type(reference).__name__
    assert params["candidate_model"] == type(candidate).__name__
    assert {k: params[k] for k in SETTINGS} == SETTINGS
    assert params["git_commit"] == "feedbeef" and params["git_branch"] == "feature/x"
    assert params["git_dirty"] == "False" and params["num_threads"] == "2"
    assert params["mode"] == "equal" and params["mode_reason"] == result.summary["mode_reason"]
    assert params["config_fingerprint"] == config_fingerprint(SETTINGS)
    tags = run.data.tags
    assert tags["mlflow.source.git.commit"] == "feedbeef"
    assert tags["mlflow.source.git.branch"] == "feature/x"
    assert tags["parity.run_id"] == result.run_id and tags["parity.complete"] == "true"
    assert tags["parity.status"] == "completed" and tags["parity.passed"] == "false"
    assert "mlflow.parentRunId" not in tags
    fd = result.first_divergence
    m = run.data.metrics
    assert m["tensors_compared"] == 12 and m["tensors_passing"] == 9
    assert m["tensors_failing"] == 3 and m["first_divergence_order"] == fd["exec_order"]
    assert m["output_max_abs_diff"] == result.summary["output_max_abs_diff"]
    assert m["output_sqnr_db"] == result.summary["output_sqnr_db"]
    arts = _artifacts(client, run_id)
    dumped = {p for p in result.modules.column("dump_path").to_pylist() if p}
    assert len(dumped) == 3  # one row per mismatching tag, naming the reference's file
    assert {p.replace("__ref.npy", "__cand.npy") for p in dumped} <= arts
    assert {"tables/modules.parquet", "tables/ops.parquet", "summary.json",
            "tensors/index.json"} <= arts  # fmt: skip
    assert dumped <= arts
    assert {a for a in arts if not a.startswith("tensors/")} == {
        "tables/modules.parquet", "tables/ops.parquet", "summary.json", "report.html",
        "tables/failing.csv"}  # fmt: skip
    assert not (in_tmp_cwd / "mlruns").exists()
    loaded = load_run(run_id, tracking_uri=store_uri)
    # log_run stores a new record naming the overridden commit/branch; the result is not edited
    stored = result.with_record(
        result.record.replace(environment={**ENV, "git_commit": "feedbeef",
                                           "git_branch": "feature/x"})
    )  # fmt: skip
    assert result.environment == ENV
    _assert_same(loaded, stored)
    assert loaded.environment["git_commit"] == "feedbeef" and loaded.tracking_run_id == run_id
    cache = in_tmp_cwd / ".parity" / "cache" / "runs" / run_id
    assert (cache / "tables" / "modules.parquet").is_file()
    _assert_same(load_run(run_id, tracking_uri=store_uri), stored)  # from the cache
    found = find_runs(tracking_uri=store_uri, experiment=exp, target="tiny", quantization="none")
    assert [f.run_id for f in found] == [run_id]
    assert found[0].commit == "feedbeef" and found[0].settings["mode"] == "equal"
    assert set(found[0].settings) == {*SETTINGS, "mode"}  # the class names are params only
    assert found[0].params["candidate_model"] == type(candidate).__name__
    assert found[0].fingerprint == result.fingerprint and found[0].status == "FINISHED"
    assert find_runs(tracking_uri=store_uri, experiment=exp, quantization="int8") == []


def test_failed_and_killed_runs_end_failed_and_killed(tiny_pair, sqlite_tracking_uri, in_tmp_cwd):
    store_uri = sqlite_tracking_uri
    reference, candidate, inputs = tiny_pair

    class Boom(nn.Module):
        def __init__(self, exc):
            super().__init__()
            self.exc = exc

        def forward(self, x):
            raise self.exc

    exp = _experiment()
    candidate.act = Boom(RuntimeError("CUDA error: an illegal memory access"))
    failed = run_parity(reference, candidate, inputs, settings=SETTINGS, environment=ENV)
    candidate.act = Boom(KeyboardInterrupt())
    killed = run_parity(reference, candidate, inputs, settings=SETTINGS, environment=ENV)
    client = get_client(store_uri)
    for result, status in ((failed, "FAILED"), (killed, "KILLED")):
        run_id = log_run(result, tracking_uri=store_uri, experiment=exp)
        run = client.get_run(run_id)
        assert run.info.status == status
        assert "tables/modules.parquet" in _artifacts(client, run_id)
        loaded = load_run(run_id, tracking_uri=store_uri)
        _assert_same(loaded, result)
        rows = {r["tag"]: r["status"] for r in loaded.modules.to_pylist()}
        assert rows["checker_fc1"] == "equal" and rows["checker_act"] == "missing_candidate"
    assert load_run(client.search_runs(
        [client.get_experiment_by_name(exp).experiment_id], "attributes.status = 'FAILED'"
    )[0].info.run_id, tracking_uri=store_uri).error["message"] == (
        "CUDA error: an illegal memory access")  # fmt: skip
    runs = find_runs(tracking_uri=store_uri, experiment=exp)
    assert [r.status for r in runs] == ["KILLED", "FAILED"]  # newest first


def test_nested_under_parent_run(tiny_equal_pair, sqlite_tracking_uri, in_tmp_cwd):
    reference, candidate, inputs = tiny_equal_pair
    parent = start_parent_run(tracking_uri=sqlite_tracking_uri, run_name="nightly",
                              params={"config": "pipelines/nightly.toml"}, commit="c1")  # fmt: skip
    result = run_parity(reference, candidate, inputs, settings=SETTINGS, environment=ENV)
    child = log_run(result, tracking_uri=sqlite_tracking_uri, parent_run_id=parent)
    end_run(parent, "FINISHED", tracking_uri=sqlite_tracking_uri)
    client = get_client(sqlite_tracking_uri)
    assert client.get_run(child).data.tags["mlflow.parentRunId"] == parent
    prun = client.get_run(parent)
    assert prun.info.status == "FINISHED" and prun.data.tags["mlflow.source.git.commit"] == "c1"
    m = client.get_run(child).data.metrics
    assert "output_sqnr_db" not in m  # identical outputs: infinite SQNR is not logged
    assert "first_divergence_order" not in m and m["output_max_abs_diff"] == 0.0


def test_runs_of_one_process_get_distinct_names(tiny_equal_pair, sqlite_tracking_uri, in_tmp_cwd):
    """run_parity seeds Python's random; MLflow's generated names came out the same each run."""
    reference, candidate, inputs = tiny_equal_pair
    results = [run_parity(reference, candidate, inputs, environment=ENV) for _ in range(2)]
    results.append(run_parity(reference, candidate, inputs, settings=SETTINGS, environment=ENV))
    client = get_client(sqlite_tracking_uri)
    names = [
        client.get_run(log_run(r, tracking_uri=sqlite_tracking_uri)).info.run_name for r in results
    ]
    target = SETTINGS["target"]
    want = [f"parity-{results[0].run_id[:8]}", f"parity-{results[1].run_id[:8]}",
            f"{target}-{results[2].run_id[:8]}"]  # fmt: skip
    assert names == want and len(set(names)) == 3
    named = log_run(results[0], tracking_uri=sqlite_tracking_uri, run_name="mine")
    assert client.get_run(named).info.run_name == "mine"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when we return: nothing listens there


def test_unreachable_store_spools_then_syncs_exactly_once(tiny_pair, sqlite_tracking_uri,
                                                          in_tmp_cwd):  # fmt: skip
    reference, candidate, inputs = tiny_pair
    result = run_parity(reference, candidate, inputs, settings=SETTINGS, environment=ENV)
    dead = f"http://127.0.0.1:{_closed_port()}"
    with pytest.warns(RuntimeWarning, match="spooled"), pytest.raises(SpooledError) as err:
        log_run(result, tracking_uri=dead, experiment="parity")
    assert err.value.exit_code == 3
    entry = err.value.spool_path
    assert entry == in_tmp_cwd / ".parity" / "spool" / result.run_id
    meta = json.loads((entry / "run.json").read_text())
    assert meta["tracking_uri"] == dead and meta["status"] == "FINISHED"
    assert meta["params"]["config_fingerprint"] == result.fingerprint
    assert meta["metrics"]["tensors_failing"] == 3.0
    assert meta["tags"]["mlflow.source.git.commit"] == ENV["git_commit"]
    assert read_table(entry / "artifacts" / "tables" / "modules.parquet").equals(result.modules)
    assert json.loads((entry / "artifacts" / "summary.json").read_text()) == result.summary
    assert (entry / "artifacts" / "tensors" / "index.json").is_file()
    backup = in_tmp_cwd / "backup"
    shutil.copytree(entry, backup)
    # the store is still down: sync keeps the entry and says so
    with pytest.raises(Exception, match="could not upload"):
        sync_spool()
    assert entry.is_dir()
    done = sync_spool(sqlite_tracking_uri)
    assert list(done) == [result.run_id] and not entry.exists()
    assert sync_spool(sqlite_tracking_uri) == {}  # nothing left
    # a crash after the upload but before the entry was removed: the retry uploads nothing
    shutil.copytree(backup, entry)
    again = sync_spool(sqlite_tracking_uri)
    assert again == done and not entry.exists()
    runs = find_runs(tracking_uri=sqlite_tracking_uri)
    assert [r.run_id for r in runs] == [done[result.run_id]]
    codes = decode(get_client(sqlite_tracking_uri).get_run(done[result.run_id]).data.tags)
    assert codes is not None and len(codes.codes) == len(set(result.modules["tag"].to_pylist()))
    loaded = load_run(runs[0].run_id, tracking_uri=sqlite_tracking_uri)
    _assert_same(loaded, result)
    client = get_client(sqlite_tracking_uri)
    assert {"tensors/index.json", "summary.json"} <= _artifacts(client, runs[0].run_id)
    assert client.get_run(runs[0].run_id).data.metrics["tensors_failing"] == 3


_WRITER = textwrap.dedent(
    """
    import sys
    from parity_tracker.run import RunResult, build_summary
    from parity_tracker.files.tables import MODULES_SCHEMA, OPS_SCHEMA, rows_to_table
    from parity_tracker.track import log_run

    for i in range(2):
        rid = f"{sys.argv[1]}{i:02d}".ljust(32, "0")
        m = rows_to_table([{"run_id": rid, "tag": "checker_model", "module": "model",
                            "kind": "output", "status": "equal", "step": 0}], MODULES_SCHEMA)
        o = rows_to_table([], OPS_SCHEMA)
        s = build_summary(m, o, run_id=rid, status="completed", mode="equal", mode_reason="-",
                          requested_mode="auto", settings={"target": "conc", "writer": sys.argv[1]},
                          environment={})
        log_run(RunResult(rid, m, o, s, {"target": "conc", "writer": sys.argv[1]}))
    print("ok")
    """
)


def test_two_processes_log_to_one_fresh_default_store(in_tmp_cwd, monkeypatch):
    """Both race on creating ./.parity/mlflow.db (the embedded default) and on writing."""
    script = in_tmp_cwd / "writer.py"
    script.write_text(_WRITER)
    procs = [
        subprocess.Popen([sys.executable, str(script), name], cwd=in_tmp_cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("aaaa", "bbbb")
    ]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, errout) in zip(procs, outs, strict=True):
        assert p.returncode == 0, errout[-3000:]
        assert out.strip() == "ok"
    uri = f"sqlite:///{in_tmp_cwd / '.parity' / 'mlflow.db'}"
    runs = find_runs(tracking_uri=uri, target="conc")
    assert len(runs) == 4
    assert sorted(r.settings["writer"] for r in runs) == ["aaaa"] * 2 + ["bbbb"] * 2
    assert all(r.status == "FINISHED" for r in runs)
    assert not (in_tmp_cwd / "mlruns").exists()
    assert not (in_tmp_cwd / ".parity" / "spool").exists()
    assert (in_tmp_cwd / ".parity" / "artifacts" / "parity").is_dir()
    loaded = load_run(runs[0].run_id, tracking_uri=uri)
    assert loaded.modules.column("tag").to_pylist() == ["checker_model"]


def test_load_run_unknown_id_is_input_error(sqlite_tracking_uri, in_tmp_cwd):
    from parity_tracker.errors import InputError

    with pytest.raises(InputError, match="no run"):
        load_run("0" * 32, tracking_uri=sqlite_tracking_uri)


def test_find_runs_newest_first(tiny_equal_pair, sqlite_tracking_uri, in_tmp_cwd):
    reference, candidate, inputs = tiny_equal_pair
    ids = []
    for q in ("none", "int8", "none"):
        r = run_parity(reference, candidate, inputs, settings={**SETTINGS, "quantization": q},
                       environment=ENV)  # fmt: skip
        ids.append(log_run(r, tracking_uri=sqlite_tracking_uri))
    runs = find_runs(tracking_uri=sqlite_tracking_uri, quantization="none")
    assert [r.run_id for r in runs] == [ids[2], ids[0]]
    assert runs[0].start_time >= runs[1].start_time
    assert [r.run_id for r in find_runs(tracking_uri=sqlite_tracking_uri)] == ids[::-1]
    fp = config_fingerprint({**SETTINGS, "quantization": "int8"})
    assert [r.run_id for r in find_runs(tracking_uri=sqlite_tracking_uri,
                                        config_fingerprint=fp)] == [ids[1]]  # fmt: skip
    assert runs[0].metrics["tensors_failing"] == 0 and torch.__version__


@pytest.mark.parametrize("fault", [ConnectionError("connection reset by peer"),
                                   KeyboardInterrupt()])  # fmt: skip
def test_upload_failing_midway_is_spooled_and_the_partial_run_replaced(
    fault, tiny_equal_pair, sqlite_tracking_uri, in_tmp_cwd, monkeypatch
):
    from mlflow.tracking import MlflowClient

    reference, candidate, inputs = tiny_equal_pair
    result = run_parity(reference, candidate, inputs, settings=SETTINGS, environment=ENV)

    def lost_connection(self, *a, **k):
        raise fault

    with monkeypatch.context() as m:
        m.setattr(MlflowClient, "log_artifacts", lost_connection)
        if isinstance(fault, KeyboardInterrupt):  # passed on, after spooling
            with pytest.raises(KeyboardInterrupt):
                log_run(result, tracking_uri=sqlite_tracking_uri)
        else:
            with pytest.warns(RuntimeWarning), pytest.raises(SpooledError, match="reset by"):
                log_run(result, tracking_uri=sqlite_tracking_uri)
    assert (in_tmp_cwd / ".parity" / "spool" / result.run_id / "run.json").is_file()
    client = get_client(sqlite_tracking_uri)
    exp_id = client.get_experiment_by_name("parity").experiment_id
    partial = client.search_runs([exp_id])
    assert len(partial) == 1 and "parity.complete" not in partial[0].data.tags
    done = sync_spool(sqlite_tracking_uri)
    runs = find_runs(tracking_uri=sqlite_tracking_uri)
    assert [r.run_id for r in runs] == [done[result.run_id]] != [partial[0].info.run_id]
    assert client.get_run(partial[0].info.run_id).info.lifecycle_stage == "deleted"
    _assert_same(load_run(runs[0].run_id, tracking_uri=sqlite_tracking_uri), result)


def test_log_run_stores_each_tags_status_in_the_run_tags(
    tiny_pair, sqlite_tracking_uri, in_tmp_cwd
):
    reference, candidate, inputs = tiny_pair
    result = run_parity(reference, candidate, inputs, settings=SETTINGS, environment=ENV)
    run_id = log_run(result, tracking_uri=sqlite_tracking_uri)
    rows: dict[str, list[str]] = {}
    for tag, status in zip(result.modules.column("tag").to_pylist(),
                           result.modules.column("status").to_pylist(), strict=True):  # fmt: skip
        rows.setdefault(tag, []).append(status)
    # per tag: the first status that is not equal/close over its steps, else the first
    expected = {t: next((s for s in ss if s not in ("equal", "close")), ss[0])
                for t, ss in rows.items()}  # fmt: skip
    assert len(expected) > 1 and set(expected.values()) - {"equal", "close"}
    codes = decode(get_client(sqlite_tracking_uri).get_run(run_id).data.tags)
    tags = ordered_tags(result.modules)
    assert tags == list(rows)
    assert {t: codes.status(i) for i, t in enumerate(tags)} == expected


def test_log_run_attaches_given_files_and_rendered_ones(tiny_pair, sqlite_tracking_uri, in_tmp_cwd):
    """The layer above hands log_run its files: ``artifacts`` (paths) and ``render`` (texts)."""
    reference, candidate, inputs = tiny_pair
    result = run_parity(reference, candidate, inputs, settings=SETTINGS, environment=ENV)
    extra = in_tmp_cwd / "notes.txt"
    extra.write_text("hello", encoding="utf-8")
    seen = []

    def render(res):
        seen.append(res.run_id)
        return {"pages/report.html": "<p>report</p>"}

    run_id = log_run(result, tracking_uri=sqlite_tracking_uri, experiment=_experiment(),
                     artifacts={"docs/notes.txt": extra}, render=render)  # fmt: skip
    client = get_client(sqlite_tracking_uri)
    arts = {a for a in _artifacts(client, run_id) if not a.startswith("tensors/")}
    assert arts == {"tables/modules.parquet", "tables/ops.parquet", "summary.json",
                    "docs/notes.txt", "pages/report.html", "tables/failing.csv"}  # fmt: skip
    assert seen == [result.run_id]
    local = client.download_artifacts(run_id, "docs/notes.txt", str(in_tmp_cwd / "dl"))
    assert Path(local).read_text(encoding="utf-8") == "hello"


def test_log_run_refuses_an_artifact_path_outside_the_root(tiny_pair, sqlite_tracking_uri,
                                                           in_tmp_cwd):  # fmt: skip
    from parity_tracker.errors import InputError

    reference, candidate, inputs = tiny_pair
    result = run_parity(reference, candidate, inputs, settings=SETTINGS, environment=ENV)
    extra = in_tmp_cwd / "x.txt"
    extra.write_text("x", encoding="utf-8")
    with pytest.raises(InputError, match="leaves the artifact root"):
        log_run(result, tracking_uri=sqlite_tracking_uri, experiment=_experiment(),
                artifacts={"../x.txt": extra}, render=None)  # fmt: skip


def test_run_store_baseline_runs_and_record_diff(tiny_pair, sqlite_tracking_uri, in_tmp_cwd):
    from parity_tracker.errors import InputError
    from parity_tracker.track import RunStore, record_diff

    reference, candidate, inputs = tiny_pair
    result = run_parity(reference, candidate, inputs, settings=SETTINGS, environment=ENV)
    exp = _experiment()
    parent = start_parent_run(tracking_uri=sqlite_tracking_uri, experiment=exp, commit="c1")
    child = log_run(result, tracking_uri=sqlite_tracking_uri, experiment=exp,
                    parent_run_id=parent, render=None)  # fmt: skip
    store = RunStore(sqlite_tracking_uri, exp)
    fp = config_fingerprint(result.settings)
    # keyed by fingerprint and judged mode (no quantization, cache, ...: seed §2 says equal)
    assert store.baseline_runs(child) == {f"{fp}/equal": child}
    assert store.baseline_runs(parent) == {f"{fp}/equal": child}
    with pytest.raises(InputError, match="no such run"):
        store.baseline_runs("0" * 32)
    record_diff(child, regressions=3, baseline_run_id=None, tracking_uri=sqlite_tracking_uri)
    run = get_client(sqlite_tracking_uri).get_run(child)
    assert run.data.metrics["regressions"] == 3.0
    assert run.data.tags["parity.baseline_run_id"] == "none"
    assert store.load(child).record == result.record
