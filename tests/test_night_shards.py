"""A merged night checks its shards: every index 1..N reported, a retried shard counted once.

Expected values are known from how the test set the night up (which shards were run, how many
times), never read back from the merge's own output.
"""

from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

from click.testing import CliRunner
from night_helpers import CELLS

from parity_tracker.cli import cli


def invoke(*args):
    res = CliRunner().invoke(cli, list(args), env={"PARITY_TEST_PERTURB": "none"},
                             catch_exceptions=False)  # fmt: skip
    return res


def shard(env, spec, night):
    res = invoke("nightly", "--config", env["cfg"], "--shard", spec, "--commit", "a" * 40,
                 "--night", night, "--json")  # fmt: skip
    return json.loads(res.stdout)


def test_a_night_whose_shard_2_never_reported_fails_and_names_it(night_env):
    shard(night_env, "1/2", "nx")  # shard 2/2 (the bf16 cell) never runs
    res = invoke("nightly-merge", "--night", "nx", "--json")
    out = json.loads(res.stdout)
    assert res.exit_code == 1
    assert out["missing_shards"] == ["2/2"] and out["complete"] is False
    assert out["headline"].startswith("FAIL") and "shard 2/2 never reported" in out["headline"]
    assert "## Shards that never reported" in out["digest"] and "- shard 2/2" in out["digest"]
    assert out["shard"] == "0/2" and [c["cell"] for c in out["cells"]] == CELLS[:1]
    # --fail-on never keeps exit 0, but never says PASS for an incomplete night
    never = invoke("nightly-merge", "--night", "nx", "--fail-on", "never", "--json")
    assert never.exit_code == 0 and json.loads(never.stdout)["headline"].startswith("FAIL")
    plain = invoke("nightly-merge", "--night", "nx")
    assert plain.exit_code == 1 and "shard 2/2 never reported" in plain.output


def test_a_retried_shard_counts_once_its_latest_completed_run(night_env):
    first = shard(night_env, "1/2", "nr")
    second = shard(night_env, "1/2", "nr")  # the CI job of shard 1 was retried
    other = shard(night_env, "2/2", "nr")
    res = invoke("nightly-merge", "--night", "nr", "--json")
    out = json.loads(res.stdout)
    assert res.exit_code == 0 and out["missing_shards"] == [] and out["complete"] is True
    assert out["shard"] == "0/2" and len(out["cells"]) == 2
    want = {c["cell"]: c["run_id"] for c in second["cells"] + other["cells"]}
    assert {c["cell"]: c["run_id"] for c in out["cells"]} == want
    assert all(c["baseline_run_id"] is None for c in out["cells"])  # not the retried attempt
    (note,) = out["shard_notes"]
    assert "shard 1/2 reported 2 times" in note
    assert second["parent_run_id"] in note and first["parent_run_id"] in note


def _parent(run_id, spec, status="FINISHED", start=0, matrix="m1"):
    return SimpleNamespace(run_id=run_id, params={"shard": spec}, status=status, start_time=start,
                           tags={"parity.matrix_hash": matrix})  # fmt: skip


def test_pick_shards_by_hand():
    from parity_tracker.pipeline.night import pick_shards

    a1 = _parent("a1", "1/3", start=1)
    a1_retry_failed = _parent("a1b", "1/3", status="FAILED", start=5)
    a3 = _parent("a3", "3/3", start=2)
    pick = pick_shards([a1_retry_failed, a3, a1])
    assert [p.run_id for p in pick.chosen] == ["a1", "a3"]  # completed beats a newer failure
    assert pick.missing == ["2/3"] and pick.problems == []
    assert (
        len(pick.notes) == 1 and "used run a1" in pick.notes[0] and "ignored a1b" in pick.notes[0]
    )
    # shards that disagree on N: each split checked, both shards kept, the night has a problem
    pick = pick_shards([_parent("b1", "1/2"), _parent("b2", "2/4")])
    assert [p.run_id for p in pick.chosen] == ["b1", "b2"]
    assert pick.missing == ["2/2", "1/4", "3/4", "4/4"]
    (problem,) = pick.problems
    assert "disagree on the shard count" in problem and "b1" in problem and "b2" in problem
    one = pick_shards([_parent("c", "1/1")])
    assert (one.missing, one.notes, one.problems) == ([], [], [])
    (killed,) = pick_shards([_parent("k", "1/1", status="KILLED")]).problems
    assert "1/1 (run k) is KILLED" in killed
    (other,) = pick_shards([_parent("m1", "1/2"), _parent("m2", "2/2", matrix="m2")]).problems
    assert "different matrices" in other and "m1: shard 1/2 (run m1)" in other


def test_default_night_ids_without_a_commit_are_unique_per_night(night_env):
    from parity_tracker.pipeline.night import default_night_id

    day = dt.date(2026, 11, 30)
    ids = {default_night_id(None, night_env["cfg"], day) for _ in range(20)}
    assert len(ids) == 20 and all(i.startswith("20261130-nocommit-") for i in ids)
    same = {default_night_id("f" * 40, night_env["cfg"], day) for _ in range(3)}
    assert len(same) == 1
