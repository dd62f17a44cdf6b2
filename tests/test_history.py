"""History across commits over hand-built stored runs: counts, first bad commit, speed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from parity_tracker.errors import InputError
from parity_tracker.history import build_history, first_bad, latest_per_commit
from parity_tracker.tables import MODULES_SCHEMA, rows_to_table, write_table


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


def test_latest_per_commit_keeps_newest_and_orders_by_time():
    runs = [_Run("a", "c1", 10), _Run("b", "c2", 20), _Run("c", "c1", 30), _Run("d", "c3", 25)]
    got = latest_per_commit(runs)
    assert [r.run_id for r in got] == ["b", "d", "c"]  # c1's newest run (30) is the newest


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
        tags=[RunTag("mlflow.source.git.commit", commit), RunTag("parity.run_id", rid)],
    )
    if tag_status is not None:
        rows = [{"tag": "checker_fc1", "status": tag_status, "step": 0},
                {"tag": "checker_fc0", "status": "equal", "step": 0}]  # fmt: skip
        path = write_table(rows_to_table(rows, MODULES_SCHEMA), Path(tmp) / rid / "modules.parquet")
        client.log_artifact(rid, str(path), "tables")
    client.set_terminated(rid, "FINISHED", end_time=t + 1)
    return rid


@pytest.fixture
def store(sqlite_tracking_uri, tmp_path):
    from parity_tracker.store import get_client, get_or_create_experiment

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
            tags=[RunTag("mlflow.source.git.commit", f"c{i:04d}")],
        )
        client.set_terminated(run.info.run_id, "FINISHED", end_time=1001 + i)
    start = time.perf_counter()
    hist = build_history("toy", tracking_uri=uri)
    elapsed = time.perf_counter() - start
    assert len(hist.points) == n and hist.first_bad_commit == "c0030"
    print(f"history over {n} runs: {elapsed:.3f} s")
