"""History across commits over hand-built stored runs: counts, first bad commit, speed."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from parity_tracker.analysis.history import build_history, first_bad, latest_per_commit
from parity_tracker.errors import InfrastructureError, InputError
from parity_tracker.files.tables import MODULES_SCHEMA, rows_to_table, write_table


@pytest.mark.parametrize(
    ("failing", "expected"),
    [
        ([], None),
        ([False, False], None),
        ([True], 0),
        ([False, True, True], 1),
        ([True, False, True], 2),  # an older streak that ended does not count
        ([True, True, False], None),  # the newest passes
        ([False, True, None, True], 1),  # unknown (tag absent) neither breaks nor extends
        ([False, None, True], 2),
        ([None, None], None),
    ],
)
def test_first_bad_is_start_of_current_streak(failing, expected):
    assert first_bad(failing) == expected


class _Run:
    def __init__(self, run_id, commit, start_time):
        self.run_id, self.commit, self.start_time = run_id, commit, start_time


def test_latest_per_commit_keeps_newest_and_orders_by_first_test():
    runs = [_Run("a", "c1", 10), _Run("b", "c2", 20), _Run("c", "c1", 30), _Run("d", "c3", 25)]
    got = latest_per_commit(runs)
    # c1 was first tested at 10 (before c2 at 20, c3 at 25): it stays first, shown by its
    # newest run "c" (30); re-running an old commit does not move it to the end (issue 18)
    assert [r.run_id for r in got] == ["c", "b", "d"]


def _log(client, exp_id, *, commit, t, failing, fingerprint="fp1", tag_status=None, tmp=None):
    from mlflow.entities import Metric, Param, RunTag

    run = client.create_run(exp_id, start_time=t)
    rid = run.info.run_id
    client.log_batch(
        rid,
        metrics=[
            Metric("tensors_compared", 10.0, t, 0),
            Metric("tensors_failing", float(failing), t, 0),
            Metric("output_max_abs_diff", 0.5 * failing, t, 0),
        ],
        params=[
            Param("target", "toy"),
            Param("quantization", "none"),
            Param("config_fingerprint", fingerprint),
        ],
        tags=[RunTag("mlflow.source.git.commit", commit), RunTag("parity.run_id", rid),
              RunTag("parity.passed", "false" if failing else "true")],  # as log_run stores it
    )  # fmt: skip
    if tag_status is not None:
        rows = [{"tag": "checker_fc1", "status": tag_status, "step": 0},
                {"tag": "checker_fc0", "status": "equal", "step": 0}]  # fmt: skip
        path = write_table(rows_to_table(rows, MODULES_SCHEMA), Path(tmp) / rid / "modules.parquet")
        client.log_artifact(rid, str(path), "tables")
    client.set_terminated(rid, "FINISHED", end_time=t + 1)
    return rid


@pytest.fixture
def store(sqlite_tracking_uri, tmp_path):
    from parity_tracker.track.store import get_client, get_or_create_experiment

    client = get_client(sqlite_tracking_uri)
    return client, get_or_create_experiment(client, "parity"), sqlite_tracking_uri, tmp_path


def test_history_tag_first_bad_commit(store):
    client, exp, uri, tmp = store
    # c1 pass, c2 fail, c3 pass, c4 fail, c4 re-run fail, c5 fail -> current streak starts at c4
    plan = [("c1", "equal"), ("c2", "mismatch"), ("c3", "close"), ("c4", "equal"),
            ("c4", "mismatch"), ("c5", "shape_mismatch")]  # fmt: skip
    for i, (commit, status) in enumerate(plan):
        failing = 0 if status in ("equal", "close") else 1
        _log(client, exp, commit=commit, t=1000 + i, failing=failing, tag_status=status, tmp=tmp)
    hist = build_history("toy", {"quantization": "none"}, tracking_uri=uri, tag="checker_fc1")
    assert [p.commit for p in hist.points] == ["c1", "c2", "c3", "c4", "c5"]
    assert [p.tag_status for p in hist.points] == [
        "equal", "mismatch", "close", "mismatch", "shape_mismatch"
    ]  # fmt: skip
    assert hist.first_bad_commit == "c4"
    assert [p.tensors_failing for p in hist.points] == [0, 1, 0, 1, 1]
    # --last 2 keeps c4, c5
    last = build_history("toy", tracking_uri=uri, tag="checker_fc1", last=2)
    assert [p.commit for p in last.points] == ["c4", "c5"] and last.first_bad_commit == "c4"


@pytest.mark.parametrize("backend", ["sqlite-sql", "mlflow-search"])
def test_rerunning_an_old_commit_keeps_the_current_failing_streak(store, monkeypatch, backend):
    client, exp, uri, _ = store
    # c1 passes, c2 and c3 fail, then c1 is re-run (a bisection check) and still passes:
    # by first test the commits are c1, c2, c3, so the streak c2..c3 is current
    for t, (commit, failing) in enumerate([("c1", 0), ("c2", 1), ("c3", 1), ("c1", 0)]):
        _log(client, exp, commit=commit, t=1000 + t, failing=failing)
    if backend == "mlflow-search":  # the path every non-SQLite store (the server) takes
        from parity_tracker.track import store as track_store

        monkeypatch.setattr(track_store, "sqlite_path", lambda _uri: None)
    hist = build_history("toy", tracking_uri=uri)
    assert [p.commit for p in hist.points] == ["c1", "c2", "c3"]
    assert [p.start_time for p in hist.points] == [1003, 1001, 1002]  # c1: its newest run
    assert hist.first_bad_commit == "c2" and hist.newest_failing is True


def test_history_without_tag_uses_metrics_and_follows_one_fingerprint(store):
    client, exp, uri, _ = store
    _log(client, exp, commit="c1", t=1, failing=0)
    _log(client, exp, commit="c2", t=2, failing=2)
    _log(client, exp, commit="c9", t=3, failing=0, fingerprint="other-device")
    _log(client, exp, commit="c3", t=4, failing=3)
    hist = build_history("toy", tracking_uri=uri)
    # the newest run's fingerprint is fp1: the other-device run is left out
    assert hist.fingerprint == "fp1"
    assert [p.commit for p in hist.points] == ["c1", "c2", "c3"]
    assert hist.first_bad_commit == "c2"
    assert hist.points[2].output_max_abs_diff == 1.5


def test_history_errors_name_the_problem(store):
    client, exp, uri, tmp = store
    with pytest.raises(InputError, match="no stored run of toy"):
        build_history("toy", tracking_uri=uri)
    _log(client, exp, commit="c1", t=1, failing=0, tag_status="equal", tmp=tmp)
    with pytest.raises(InputError, match=r"checker_nope.*checker_fc1"):
        build_history("toy", tracking_uri=uri, tag="checker_nope")


def test_history_over_many_runs(store):
    from mlflow.entities import Metric, Param, RunTag

    client, exp, uri, _ = store
    n = 40  # 300 runs measured 0.42 s for the search; creating them here costs ~0.2 s each
    for i in range(n):
        run = client.create_run(exp, start_time=1000 + i)
        client.log_batch(
            run.info.run_id,
            metrics=[Metric("tensors_failing", float(i >= 30), 1000 + i, 0)],
            params=[Param("target", "toy"), Param("config_fingerprint", "fp1")],
            tags=[
                RunTag("mlflow.source.git.commit", f"c{i:04d}"),
                RunTag("parity.passed", "false" if i >= 30 else "true"),
            ],
        )
        client.set_terminated(run.info.run_id, "FINISHED", end_time=1001 + i)
    start = time.perf_counter()
    hist = build_history("toy", tracking_uri=uri)
    elapsed = time.perf_counter() - start
    assert len(hist.points) == n and hist.first_bad_commit == "c0030"
    print(f"history over {n} runs: {elapsed:.3f} s")


def _mixed_store(client, exp, tmp):
    """Runs that exercise every branch both paths must agree on (see the comments)."""
    plan = [
        ("c1", 1, "equal", 0, "fp1"),
        ("c2", 2, "mismatch", 1, "fp1"),
        ("c2", 3, "close", 0, "fp1"),  # a re-run of c2: the newest run of a commit counts
        ("c9", 4, "mismatch", 1, "other-device"),  # another fingerprint: left out
        ("c3", 5, "shape_mismatch", 2, "fp1"),
        ("c4", 6, "mismatch", 1, "fp1"),
    ]
    ids = [
        _log(client, exp, commit=c, t=t, failing=f, fingerprint=fp, tag_status=s, tmp=tmp)
        for c, t, s, f, fp in plan
    ]
    client.log_metric(ids[-1], "output_sqnr_db", float("nan"), timestamp=6, step=0)
    client.log_metric(ids[-1], "tensors_compared", 12.0, timestamp=7, step=1)  # latest: step 1
    deleted = _log(client, exp, commit="c5", t=7, failing=0, tag_status="equal", tmp=tmp)
    client.delete_run(deleted)  # deleted runs are not searched
    other = _log(client, exp, commit="c6", t=8, failing=0, tag_status="equal", tmp=tmp)
    client.log_param(other, "quantization_extra", "x")  # fine: only given settings filter
    return ids


def _slow_paths(monkeypatch):
    """Force MLflow's search (as for an http store) and the download of each modules table."""
    import sqlite3

    import parity_tracker.track.search as track
    import parity_tracker.track.tag_status as history

    def refuse(*_args, **_kwargs):
        raise sqlite3.OperationalError("no such table: forced for the test")

    monkeypatch.setattr(track, "_sqlite_heads", refuse)
    monkeypatch.setattr(history, "local_modules_path", lambda _uri: None)


def test_sql_and_scan_paths_equal_mlflow_search_and_download(store, monkeypatch):
    import parity_tracker.track.search as track
    import parity_tracker.track.tag_status as history
    from parity_tracker.track import find_run_heads, find_runs

    client, exp, uri, tmp = store
    _mixed_store(client, exp, tmp)
    calls = []
    monkeypatch.setattr(track, "_sqlite_heads", _spy(track._sqlite_heads, calls, "sql"))
    scan = _spy(history._statuses_by_file, calls, "scan")
    monkeypatch.setattr(history, "_statuses_by_file", scan)
    monkeypatch.setattr(history, "modules_tables", _spy(history.modules_tables, calls, "dl"))

    fast_heads = find_run_heads(tracking_uri=uri, target="toy", quantization="none")
    fast = {
        tag: build_history("toy", {"quantization": "none"}, tracking_uri=uri, tag=tag)
        for tag in (None, "checker_fc1", "checker_fc0")
    }
    assert "dl" not in calls and {"sql", "scan"} <= set(calls)
    # the newest run (c6, fp1) leads; c9 (other fingerprint) and deleted c5 are out
    assert [p.commit for p in fast[None].points] == ["c1", "c2", "c3", "c4", "c6"]
    assert [p.tag_status for p in fast["checker_fc1"].points] == [
        "equal", "close", "shape_mismatch", "mismatch", "equal"
    ]  # fmt: skip
    assert fast["checker_fc1"].first_bad_commit is None
    assert fast[None].points[3].tensors_compared == 12.0  # latest step's value
    assert math.isnan(fast[None].points[3].output_sqnr_db)
    assert [p.tag_status for p in fast["checker_fc0"].points] == ["equal"] * 5

    _slow_paths(monkeypatch)
    import parity_tracker.track.cache as cache

    monkeypatch.setenv("PARITY_TRACKER_CACHE", str(tmp / "cache"))
    monkeypatch.setattr(cache, "fetch_files", _spy(cache.fetch_files, calls, "fetch"))
    calls.clear()
    slow_heads = find_run_heads(tracking_uri=uri, target="toy", quantization="none")
    slow = {
        tag: build_history("toy", {"quantization": "none"}, tracking_uri=uri, tag=tag)
        for tag in (None, "checker_fc1", "checker_fc0")
    }
    # a server's path: MLflow's search, each modules table fetched into the run cache, scanned
    assert "sql" not in calls and "fetch" in calls
    assert len(list((tmp / "cache" / "files").iterdir())) == len(slow[None].points)
    for tag in fast:
        assert repr(fast[tag].to_dict()) == repr(slow[tag].to_dict())  # repr: nan == nan
    assert repr(fast_heads) == repr(slow_heads)
    assert [i.run_id for i in find_runs(tracking_uri=uri, target="toy")] == [
        h.run_id for h in fast_heads
    ]
    with pytest.raises(InputError, match=r"checker_nope.*checker_fc1"):
        build_history("toy", tracking_uri=uri, tag="checker_nope")


def test_scan_path_first_bad_commit_and_errors(store, monkeypatch):
    client, exp, uri, tmp = store
    plan = [("c1", "equal"), ("c2", "mismatch"), ("c3", "close"), ("c4", "mismatch"),
            ("c5", "shape_mismatch")]  # fmt: skip
    failing = [int(s not in ("equal", "close")) for _, s in plan]
    ids = [
        _log(client, exp, commit=c, t=10 + i, failing=f, tag_status=s, tmp=tmp)
        for i, ((c, s), f) in enumerate(zip(plan, failing, strict=True))
    ]
    hist = build_history("toy", tracking_uri=uri, tag="checker_fc1")
    assert hist.first_bad_commit == "c4"
    with pytest.raises(InputError, match=r"checker_nope.*checker_fc1, checker_fc0"):
        build_history("toy", tracking_uri=uri, tag="checker_nope")
    # a run whose modules table vanished from the artifact folder: named, not a traceback
    from parity_tracker.track.tag_status import local_modules_path

    local_modules_path(client.get_run(ids[2]).info.artifact_uri).unlink()
    with pytest.raises(InfrastructureError, match="no such file"):
        build_history("toy", tracking_uri=uri, tag="checker_fc1")


def test_local_modules_path():
    from parity_tracker.track.tag_status import local_modules_path

    assert local_modules_path("file:///a%20b/run/artifacts") == Path(
        "/a b/run/artifacts/tables/modules.parquet"
    )
    assert local_modules_path("/x/y") == Path("/x/y/tables/modules.parquet")
    assert local_modules_path("mlflow-artifacts:/1/abc/artifacts") is None
    assert local_modules_path("s3://bucket/p") is None
    assert local_modules_path(None) is None


def _spy(fn, calls, name):
    def wrapped(*args, **kwargs):
        calls.append(name)
        return fn(*args, **kwargs)

    return wrapped


def test_local_scan_takes_first_failing_step_per_file(tmp_path):
    from parity_tracker.track.tag_status import _local_tag_statuses

    def table(name, statuses):
        rows = [{"tag": "t", "status": s, "step": k} for k, s in enumerate(statuses)]
        rows.append({"tag": "u", "status": "mismatch", "step": 0})
        return write_table(rows_to_table(rows, MODULES_SCHEMA), tmp_path / name / "m.parquet")

    paths = [
        table("a", ["close", "mismatch", "shape_mismatch"]),  # first failing step: mismatch
        table("b", ["close", "equal"]),  # all passing: the first step's
        table("c", []),  # tag absent
        table("d", ["missing_candidate"]),
    ]
    assert _local_tag_statuses(paths, "t") == ["mismatch", "close", None, "missing_candidate"]


def _log_steps(client, exp, tmp, *, commit, t, rows):
    """A run whose modules table holds ``rows`` (tag, step, status), in that row order."""
    rid = _log(client, exp, commit=commit, t=t, failing=0)
    table = rows_to_table([{"tag": g, "step": k, "status": s} for g, k, s in rows], MODULES_SCHEMA)
    client.log_artifact(rid, str(write_table(table, Path(tmp) / rid / "modules.parquet")), "tables")
    return rid, table


def _add_codes(client, rid, table):
    """Give a run the per-tag status tags ``log_run`` writes (``track.tag_codes``)."""
    from parity_tracker.track.tag_codes import encode

    for key, value in encode(table).items():
        client.set_tag(rid, key, value)


def test_tag_codes_and_scan_give_the_same_history(store, monkeypatch, tmp_path):
    import parity_tracker.track.tag_status as history

    monkeypatch.setenv("PARITY_TRACKER_CACHE", str(tmp_path / "cache"))
    client, exp, uri, tmp = store
    plan = [  # per commit: the modules rows; "t"'s status = first failing step, else step 0's
        ("c1", [("t", 0, "equal"), ("t", 1, "close"), ("u", 0, "mismatch")]),  # equal
        ("c2", [("u", 0, "equal")]),  # t absent: unknown
        ("c3", [("t", 0, "close"), ("t", 1, "mismatch"), ("t", 2, "nan_mismatch")]),  # mismatch
        ("c4", [("u", 0, "equal"), ("t", 0, "close"), ("t", 1, "close")]),  # close
        ("c5", [("t", 1, "shape_mismatch"), ("t", 0, "equal")]),  # shape_mismatch (row order)
        ("c6", [("t", 0, "missing_candidate")]),  # missing_candidate
    ]
    logged = [_log_steps(client, exp, tmp, commit=c, t=100 + i, rows=r) for i, (c, r) in
              enumerate(plan)]  # fmt: skip
    expected = ["equal", None, "mismatch", "close", "shape_mismatch", "missing_candidate"]
    calls = []
    monkeypatch.setattr(
        history, "_statuses_by_file", _spy(history._statuses_by_file, calls, "scan")
    )

    scanned = {g: build_history("toy", tracking_uri=uri, tag=g) for g in ("t", "u")}
    assert calls == ["scan", "scan"]  # runs without codes: their tables are scanned
    for rid, table in logged:
        _add_codes(client, rid, table)
    calls.clear()
    coded = {g: build_history("toy", tracking_uri=uri, tag=g) for g in ("t", "u")}
    assert calls == []  # every run answered from its codes
    assert [p.tag_status for p in coded["t"].points] == expected
    assert coded["t"].first_bad_commit == "c5"
    assert [p.tag_status for p in coded["u"].points] == ["mismatch", "equal", None, "equal",
                                                          None, None]  # fmt: skip
    assert coded["u"].first_bad_commit is None
    for g in scanned:
        assert repr(coded[g].to_dict()) == repr(scanned[g].to_dict())
    assert not (tmp_path / "cache").exists()  # local tables: tag lists read in place, not kept
    with pytest.raises(
        InputError, match=r"tag 'nope' is in none of the 6 runs; tags look like: t$"
    ):
        build_history("toy", tracking_uri=uri, tag="nope")


def test_run_without_codes_falls_back_to_scan(store, monkeypatch, tmp_path):
    import parity_tracker.track.tag_status as history

    monkeypatch.setenv("PARITY_TRACKER_CACHE", str(tmp_path / "cache"))
    client, exp, uri, tmp = store
    _log_steps(client, exp, tmp, commit="c1", t=1, rows=[("t", 0, "mismatch")])
    new, table = _log_steps(client, exp, tmp, commit="c2", t=2, rows=[("t", 0, "close")])
    _add_codes(client, new, table)  # c1 was logged before the codes existed
    scanned = []
    monkeypatch.setattr(
        history, "_statuses_by_file", _spy(history._statuses_by_file, scanned, "scan")
    )
    seen = []
    real = history._local_tag_statuses
    monkeypatch.setattr(history, "_local_tag_statuses",
                        lambda paths, tag: seen.append(len(paths)) or real(paths, tag))  # fmt: skip
    hist = build_history("toy", tracking_uri=uri, tag="t")
    assert scanned == ["scan"] and seen == [1]  # only the run without codes is read
    assert [p.tag_status for p in hist.points] == ["mismatch", "close"]
    assert hist.first_bad_commit is None
