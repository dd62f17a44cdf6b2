"""``history`` decides pass/fail from the owners: the stored verdict, the status sets, and codes
it can prove belong to the run (issue 18 review).

Every run lives in a real SQLite-backed MLflow store under tmp_path. Expected values are the
statuses and verdicts the test wrote, worked by hand below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from parity_tracker.analysis.history import build_history
from parity_tracker.errors import InputError
from parity_tracker.files.tables import MODULES_SCHEMA, rows_to_table, write_table


@pytest.fixture
def store(sqlite_tracking_uri, tmp_path, monkeypatch):
    from parity_tracker.track.store import get_client, get_or_create_experiment

    monkeypatch.setenv("PARITY_TRACKER_CACHE", str(tmp_path / "cache"))
    client = get_client(sqlite_tracking_uri)
    return client, get_or_create_experiment(client, "parity"), sqlite_tracking_uri, tmp_path


def _log(client, exp, *, commit, t, compared, failing, passed, target="toy", settings=None,
         rows=None, tmp=None, codes=True):  # fmt: skip
    """One run as ``log_run`` stores it: metrics, params, the verdict tag, optionally a modules
    table and its per-tag codes (bound to the run's ``parity.run_id``)."""
    from mlflow.entities import Metric, Param, RunTag

    from parity_tracker.track.tag_codes import encode

    rid = client.create_run(exp, start_time=t).info.run_id
    settings = settings or {"quantization": "none"}
    params = {"target": target, **settings, "config_fingerprint": json.dumps(settings)}
    tags = {"mlflow.source.git.commit": commit, "parity.run_id": rid,
            "parity.passed": "true" if passed else "false", "parity.complete": "true"}  # fmt: skip
    if rows is not None:
        table = rows_to_table([{"tag": g, "step": k, "status": s} for g, k, s in rows],
                              MODULES_SCHEMA)  # fmt: skip
        path = write_table(table, Path(tmp) / rid / "modules.parquet")
        client.log_artifact(rid, str(path), "tables")
        if codes:
            tags.update(encode(table, rid))
    client.log_batch(
        rid,
        metrics=[Metric("tensors_compared", float(compared), t, 0),
                 Metric("tensors_failing", float(failing), t, 0)],
        params=[Param(k, str(v)) for k, v in params.items()],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )  # fmt: skip
    client.set_terminated(rid, "FINISHED", end_time=t + 1)
    return rid


# ----------------------------------------------------------------- 3: the stored verdict


def test_a_run_that_compared_nothing_fails_history(store):
    client, exp, uri, _ = store
    _log(client, exp, commit="c1", t=1, compared=5, failing=0, passed=True)
    # compared 0, failing 0: nothing failed, yet the run's verdict is fail (run.summary: at
    # least one tensor must be compared), so c2 is the first bad commit
    _log(client, exp, commit="c2", t=2, compared=0, failing=0, passed=False)
    hist = build_history("toy", tracking_uri=uri)
    assert [(p.commit, p.passed) for p in hist.points] == [("c1", True), ("c2", False)]
    assert hist.first_bad_commit == "c2"


# ---------------------------------------------------------- 4: status over steps, neutral


def test_status_over_steps_failing_then_neutral_then_passing():
    from parity_tracker.track.tag_status import tag_status_over_steps as over

    assert over(["equal", "skipped", "mismatch"]) == "mismatch"  # a skip never hides a failure
    assert over(["skipped", "error", "mismatch"]) == "error"  # the first failing one
    assert over(["close", "skipped", "equal"]) == "skipped"
    assert over(["close", "equal"]) == "close"
    assert over([]) is None


def test_history_tag_skipped_neither_fails_nor_passes(store):
    client, exp, uri, tmp = store
    plan = [  # commit, rows of tag "t"; over steps: c1 equal, c2 mismatch, c3 skipped,
        ("c1", [("t", 0, "equal")]),  # c4 mismatch (a later step fails after a skip)
        ("c2", [("t", 0, "mismatch")]),
        ("c3", [("t", 0, "skipped")]),
        ("c4", [("t", 0, "skipped"), ("t", 1, "mismatch")]),
    ]
    for i, (commit, rows) in enumerate(plan):
        _log(client, exp, commit=commit, t=10 + i, compared=1, failing=0, passed=True,
             rows=rows, tmp=tmp)  # fmt: skip
    hist = build_history("toy", tracking_uri=uri, tag="t")
    assert [p.tag_status for p in hist.points] == ["equal", "mismatch", "skipped", "mismatch"]
    # streak from the newest: c4 fails, c3 neutral (skipped over), c2 fails, c1 passes -> c2
    assert hist.first_bad_commit == "c2"


# ----------------------------------------------------------- 5: codes proven to be the run's


TRUTH = {"c1": "equal", "c2": "mismatch", "c3": "close", "c4": "mismatch"}


def _coded_store(store):
    client, exp, uri, tmp = store
    ids = {}
    shapes = {"c1": ["a", "t"], "c2": ["a", "t"], "c3": ["a", "b", "t"], "c4": ["a", "t"]}
    for i, (commit, status) in enumerate(TRUTH.items()):
        rows = [(g, 0, status if g == "t" else "equal") for g in shapes[commit]]
        ids[commit] = _log(client, exp, commit=commit, t=100 + i, compared=1, failing=0,
                           passed=True, rows=rows, tmp=tmp)  # fmt: skip
    return client, uri, ids


def _tags(client, rid):
    return {k: v for k, v in client.get_run(rid).data.tags.items()
            if k.startswith("parity.tag_codes")}  # fmt: skip


def _statuses(uri):
    hist = build_history("toy", tracking_uri=uri, tag="t")
    return {p.commit: p.tag_status for p in hist.points}


def test_untampered_codes_answer_without_a_scan(store, monkeypatch):
    import parity_tracker.track.tag_status as ts

    _, uri, _ = _coded_store(store)
    monkeypatch.setattr(ts, "_scanned_statuses", lambda *a: pytest.fail("scanned"))
    assert _statuses(uri) == TRUTH


def test_swapped_chunks_fall_back_to_the_tables(store):
    client, uri, ids = _coded_store(store)
    a, b = _tags(client, ids["c1"]), _tags(client, ids["c2"])  # same tag list, same count
    assert a["parity.tag_codes.0"] != b["parity.tag_codes.0"]  # c1: t equal, c2: t mismatch
    client.set_tag(ids["c1"], "parity.tag_codes.0", b["parity.tag_codes.0"])
    client.set_tag(ids["c2"], "parity.tag_codes.0", a["parity.tag_codes.0"])
    assert _statuses(uri) == TRUTH


def test_codes_copied_whole_from_another_run_fall_back(store):
    client, uri, ids = _coded_store(store)
    for key, value in _tags(client, ids["c2"]).items():  # header and chunks of c2 onto c1
        client.set_tag(ids["c1"], key, value)
    assert _statuses(uri) == TRUTH


def test_a_forged_count_never_crashes_and_falls_back(store):
    from parity_tracker.track.tag_codes import binding

    client, uri, ids = _coded_store(store)
    # c4 (2 tags) claims c3's 3-tag list with a self-consistent header: decodes, but its
    # 2 codes cannot index a 3-tag list (before: IndexError, exit 3)
    h4 = json.loads(_tags(client, ids["c4"])["parity.tag_codes"])
    h3 = json.loads(_tags(client, ids["c3"])["parity.tag_codes"])
    h4["sha256"] = h3["sha256"]
    h4["bind"] = binding(h4["sha256"], ids["c4"], "=x")  # c4's codes: a equal, t mismatch
    client.set_tag(ids["c4"], "parity.tag_codes", json.dumps(h4))
    assert _statuses(uri) == TRUTH
    from parity_tracker.cli import cli

    res = CliRunner().invoke(cli, ["history", "toy", "--tag", "t", "--tracking-uri", uri,
                                   "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert {p["commit"]: p["tag_status"] for p in json.loads(res.stdout)["points"]} == TRUTH


# ---------------------------------------------------------------- 6: configurations named


def test_history_names_the_stored_configurations(store):
    client, exp, uri, _ = store
    for i, q in enumerate(["int8", "bf16"]):
        _log(client, exp, commit=f"c{i}", t=i + 1, compared=1, failing=0, passed=True,
             target="not_installed_pkg:fn", settings={"quantization": q})  # fmt: skip
    from parity_tracker.cli import cli

    res = CliRunner().invoke(cli, ["history", "not_installed_pkg:fn", "--tracking-uri", uri])
    assert res.exit_code == 0, res.output
    # the newest run (t=2) is bf16: that configuration is followed, and said so
    assert "quantization=bf16" in res.output and "quantization=int8" in res.output
    assert "history of not_installed_pkg:fn {'quantization': 'bf16'}" in res.output
    assert "following the newest stored configuration quantization=bf16" in res.output
    assert "--set" in res.output
    with pytest.raises(InputError) as err:
        build_history("not_installed_pkg:fn", {"quantization": "fp8"}, tracking_uri=uri)
    assert "quantization=bf16; quantization=int8" in str(err.value)
    assert "--set" in str(err.value)
