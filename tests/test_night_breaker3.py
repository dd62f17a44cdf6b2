"""Third adversarial round on nights, baselines and commit selection (issue 18, wave 5).

Each test reproduces a wrong PASS found by the round: a reused night id, a night parent
standing for shards its merge never used, an abbreviated commit of two commits. Expected
values come from how the test set the store up (which runs it made, on which commit, with
which perturbation), never from the code's own output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from night_helpers import TINY

from parity_tracker.cli import cli


def invoke(*args, perturb=False):
    extra = {"PARITY_TEST_PERTURB": "fc2" if perturb else "none"}
    return CliRunner().invoke(cli, list(args), env=extra, catch_exceptions=False)


def nightly(env, commit, *extra, perturb=False):
    res = invoke("nightly", "--config", env["cfg"], "--commit", commit, "--json", *extra,
                 perturb=perturb)  # fmt: skip
    return res.exit_code, json.loads(res.stdout)


def merge(night, *extra):
    res = invoke("nightly-merge", "--night", night, "--json", *extra)
    return res.exit_code, json.loads(res.stdout)


def test_a_night_id_reused_on_another_commit_is_a_problem_not_a_pass(night_env):
    """A constant ``--night`` every day: day 2's merge must not hide day 1 from its baselines.

    Day 1 (commit a) passes; day 2 (commit b) perturbs ``2.weight``: against day 1 every cell
    regresses. Before the fix, the merge kept every run of the "night" (day 1 included) out of
    the baselines, found none, and exited 0.
    """
    a, b = "a" * 40, "b" * 40
    assert nightly(night_env, a, "--night", "nightly")[0] == 0
    assert merge("nightly")[0] == 0  # one commit so far: a sound night
    code, _ = nightly(night_env, b, "--night", "nightly", perturb=True)
    assert code == 1  # the shard itself diffs against day 1 and sees the regression
    code, out = merge("nightly")
    assert code == 1 and out["complete"] is False
    (problem,) = out["shard_problems"]
    assert "different commits" in problem and a in problem and b in problem
    assert out["headline"].startswith("FAIL (incomplete")


def test_a_night_parent_baseline_is_the_shards_its_merge_used(night_env):
    """``--baseline <night parent>`` means the cells its digest showed.

    Night n1 passes and is merged; then shard n1 is reported again (a retried CI job after the
    merge) with ``2.weight`` perturbed. Night n2, perturbed too, against the merged parent:
    its baselines must be the merged (unperturbed) cells, so it regresses. Before the fix the
    later perturbed runs (newest) were taken and n2 passed with exit 0.
    """
    a = "a" * 40
    _, used = nightly(night_env, a, "--night", "n1")
    _, merged = merge("n1")
    assert merged["headline"] == "PASS"
    _, later = nightly(night_env, a, "--night", "n1", perturb=True)  # after the merge
    assert {c["run_id"] for c in later["cells"]}.isdisjoint(c["run_id"] for c in used["cells"])
    code, out = nightly(night_env, "b" * 40, "--night", "n2", "--baseline",
                        merged["parent_run_id"][:10], perturb=True)  # fmt: skip
    want = {c["cell"]: c["run_id"] for c in used["cells"]}
    assert {c["cell"]: c["baseline_run_id"] for c in out["cells"]} == want
    assert code == 1 and out["regressions"] > 0


def test_an_abbreviated_commit_of_two_commits_is_refused(night_env):
    """``diff --base-commit abc`` when runs exist on abc1… and abc2…: git refuses an ambiguous
    short SHA; picking the newest silently diffed the wrong commit (here: exit 0, no
    regression, although abc1 → head regresses)."""
    c1, c2, head = "abc1" + "0" * 36, "abc2" + "0" * 36, "d" * 40
    nightly(night_env, c1, "--night", "x1")  # unperturbed
    nightly(night_env, c2, "--night", "x2", perturb=True)
    nightly(night_env, head, "--night", "x3", perturb=True)
    sel = ["--target", TINY, "--set", "quantization=none", "--json"]
    res = invoke("diff", "--base-commit", "abc", "--head-commit", head, *sel)
    assert res.exit_code == 2, res.output
    assert "ambiguous" in res.output and c1 in res.output and c2 in res.output
    # one more digit names one commit: abc1 is unperturbed, head perturbed -> regression
    res = invoke("diff", "--base-commit", "abc1", "--head-commit", head[:7], *sel)
    assert res.exit_code == 1 and json.loads(res.stdout)["counts"]["regression"] > 0


def test_a_cell_whose_target_failed_to_build_keeps_its_error_in_the_merge(night_env):
    """No run is logged for a cell whose target raises while building; its shard's
    ``cells.csv`` has the error. The merge named it "not in the store (spooled, or its shard
    died): sync, then merge again", a wrong cause and a fix that cannot work."""
    cfg = night_env["cwd"] / "broken.toml"
    cfg.write_text(f'[[matrix]]\ntarget = "{TINY}"\n\n[[matrix]]\ntarget = "cli_targets:broken"\n')
    res = invoke("nightly", "--config", str(cfg), "--commit", "a" * 40, "--night", "b1", "--json")
    assert res.exit_code == 1
    code, out = merge("b1")
    errors = {c["target"]: c["error"] for c in out["cells"]}
    assert code == 1 and errors[TINY] is None
    # cli_targets.broken raises RuntimeError("weights file missing") by construction
    assert "weights file missing" in errors["cli_targets:broken"]
    assert "spooled" not in errors["cli_targets:broken"]


def test_a_shard_that_died_before_listing_its_cells_makes_the_night_incomplete(night_env):
    """A shard parent opened but killed before attaching ``cells.json``: the store is fine, so
    the merge must not exit 3 (infrastructure); the night is incomplete (exit 1)."""
    from parity_tracker.track.parents import KIND_SHARD, TAG_KIND, TAG_NIGHT
    from parity_tracker.track.store import get_client

    nightly(night_env, "a" * 40, "--night", "d1", "--shard", "1/2")
    client = get_client(night_env["uri"])
    exp = client.get_experiment_by_name("parity").experiment_id
    dead = client.create_run(exp, tags={TAG_KIND: KIND_SHARD, TAG_NIGHT: "d1"}).info.run_id
    client.log_param(dead, "shard", "2/2")
    client.log_param(dead, "config", night_env["cfg"])
    client.set_terminated(dead, "KILLED")
    code, out = merge("d1")
    assert code == 1 and out["complete"] is False
    assert any(dead in p and "cells.json" in p for p in out["shard_problems"])


def test_an_expected_file_that_does_not_exist_is_an_input_error(night_env):
    """``--expected`` with a typo used to be read as an empty list: entries silently unused."""
    nightly(night_env, "a" * 40, "--night", "e1")
    missing = str(night_env["cwd"] / "expectd.toml")
    for args in (["nightly", "--config", night_env["cfg"], "--commit", "b" * 40],
                 ["nightly-merge", "--night", "e1"], ["diff", "x", "y"]):  # fmt: skip
        res = invoke(*args, "--expected", missing)
        assert res.exit_code == 2 and "expectd.toml" in res.output, (args, res.output)


CHATTY = '''"""A target that prints while building and in forward, as model code often does."""
import os

import torch
from torch import nn

from parity_tracker.pipeline.case import ParityCase


class Chatty(nn.Linear):
    def forward(self, x):
        print("forward!")
        return super().forward(x)


def build(settings):
    print("loading weights...")
    os.write(1, b"fd-level chatter\\n")  # C code and child processes write to fd 1
    torch.manual_seed(0)
    reference, candidate = Chatty(4, 4), Chatty(4, 4)
    candidate.load_state_dict(reference.state_dict())
    return ParityCase(reference, candidate, inputs=(torch.ones(2, 4),))
'''


@pytest.mark.slow
def test_json_stdout_is_one_document_when_the_target_prints(tmp_path):
    """``--json`` prints exactly one JSON document on stdout: a target's own prints (Python's
    ``print`` and raw writes to fd 1) go to stderr. They used to come first on stdout."""
    (tmp_path / "chatty_target.py").write_text(CHATTY)
    (tmp_path / "m.toml").write_text('[[matrix]]\ntarget = "chatty_target:build"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"}  # fmt: skip
    exe = str(Path(sys.executable).with_name("parity-tracker"))
    commit = ["--commit", "a" * 40]
    for args in (["run", "chatty_target:build", *commit],
                 ["nightly", "--config", "m.toml", *commit, "--night", "c1"]):  # fmt: skip
        res = subprocess.run([exe, *args, "--json"], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=120)  # fmt: skip
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)  # the whole of stdout: one document, nothing else
        assert isinstance(doc, dict) and "fd-level chatter" not in res.stdout
        assert "loading weights..." in res.stderr and "fd-level chatter" in res.stderr
        assert "forward!" in res.stderr
