"""A merged night never passes on a wrong picture of its cells (the issue-18 merge, reviewed).

Each test sets a night up so that one cell the night should report fails (or a shard is not
trustworthy), and checks the merge says so. Expected values come from how the test built the
night: which cells each shard runs (cell ``k`` of the matrix runs in shard ``k % N + 1``), which
``k`` was made to fail (``$PARITY_TEST_FAIL_K``, ``cli_targets.loose``), and a matrix hash
computed here from its definition (xxh3_64 of canonical JSON), never read back from the merge.
"""

from __future__ import annotations

import json

import pytest
import xxhash
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from parity_tracker.cli import cli

LOOSE = "cli_targets:loose"
K4 = f'[[matrix]]\ntarget = "{LOOSE}"\nk = ["0", "1", "2", "3"]\n'
K2 = f'[[matrix]]\ntarget = "{LOOSE}"\nk = ["0", "1"]\n'


def invoke(*args, fail_k=""):
    env = {"PARITY_TEST_PERTURB": "none", "PARITY_TEST_FAIL_K": fail_k}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def write(night_env, name, text):
    path = night_env["cwd"] / name
    path.write_text(text)
    return str(path)


def shard(cfg, spec, night, fail_k=""):
    res = invoke("nightly", "--config", cfg, "--shard", spec, "--commit", "a" * 40,
                 "--night", night, "--fail-on", "never", "--json", fail_k=fail_k)  # fmt: skip
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def merge(night, *extra):
    res = invoke("nightly-merge", "--night", night, "--json", *extra)
    return res, json.loads(res.stdout)


def by_k(out):
    return {c["settings"]["k"]: c for c in out["cells"]}


def test_shards_of_two_splits_fail_the_night_and_keep_every_cell(night_env):
    cfg = write(night_env, "k4.toml", K4)
    s13 = shard(cfg, "1/3", "mixed", fail_k="3")  # cells k=0 and k=3 (3 % 3 == 0); k=3 fails
    shard(cfg, "2/3", "mixed")  # k=1
    shard(cfg, "3/3", "mixed")  # k=2
    s12 = shard(cfg, "1/2", "mixed")  # a stray run of another split: k=0 and k=2, both pass
    res, out = merge("mixed")
    assert res.exit_code == 1 and out["complete"] is False
    assert out["missing_shards"] == ["2/2"]  # the 1/2 split never ran its second half
    (problem,) = out["shard_problems"]
    assert "disagree on the shard count" in problem
    assert s13["parent_run_id"] in problem and s12["parent_run_id"] in problem
    cells = by_k(out)
    assert sorted(cells) == ["0", "1", "2", "3"]  # k=3, only in shard 1/3, is not dropped
    assert cells["3"]["passed"] is False
    assert out["headline"].startswith("FAIL") and "incomplete" in out["headline"]
    assert "## Shard problems" in out["digest"] and s12["parent_run_id"] in out["digest"]
    never, out = merge("mixed", "--fail-on", "never")
    assert never.exit_code == 0 and out["headline"].startswith("FAIL")
    plain = invoke("nightly-merge", "--night", "mixed")
    assert plain.exit_code == 1 and "disagree on the shard count" in plain.output


def _hash(ks):
    """xxh3_64 of the canonical JSON of the cells of ``k = ks`` over ``loose``, by hand."""
    doc = [{"target": LOOSE, "settings": [["k", k]], "mode": "auto", "ops": False, "rtol": None,
            "atol": None, "dump_mode": "FIRST_NOT_EQUAL"} for k in ks]  # fmt: skip
    return xxhash.xxh3_64_hexdigest(json.dumps(doc, sort_keys=True).encode())


def test_shards_of_different_matrices_fail_the_night_naming_shards_and_hashes(night_env):
    from parity_tracker.track.store import get_client

    a = shard(write(night_env, "k4.toml", K4), "1/2", "dm", fail_k="3")  # k=0, k=2 of K4
    b = shard(write(night_env, "k2.toml", K2), "2/2", "dm", fail_k="3")  # k=1 of K2
    client = get_client(night_env["uri"])
    tags = {r: client.get_run(r).data.tags for r in (a["parent_run_id"], b["parent_run_id"])}
    assert tags[a["parent_run_id"]]["parity.matrix_hash"] == _hash(["0", "1", "2", "3"])
    assert tags[b["parent_run_id"]]["parity.matrix_hash"] == _hash(["0", "1"])
    res, out = merge("dm")
    assert res.exit_code == 1 and out["complete"] is False  # K4's k=3 (failing) never ran
    (problem,) = out["shard_problems"]
    assert "different matrices" in problem
    for run_id, hash_ in ((a["parent_run_id"], _hash("0123")), (b["parent_run_id"], _hash("01"))):
        assert run_id in problem and hash_ in problem
    assert "different matrices" in out["digest"]


def test_a_shard_without_a_matrix_hash_is_unknown_and_said_so(night_env):
    from parity_tracker.track.store import get_client

    cfg = write(night_env, "k4.toml", K4)
    old = shard(cfg, "1/2", "old")["parent_run_id"]
    shard(cfg, "2/2", "old")
    get_client(night_env["uri"]).delete_tag(old, "parity.matrix_hash")  # as recorded before it
    with pytest.warns(RuntimeWarning, match="no parity.matrix_hash"):
        res, out = merge("old")
    assert res.exit_code == 0 and out["complete"] is True and out["shard_problems"] == []
    (note,) = out["shard_notes"]
    assert old in note and "unknown" in note


def test_cells_whose_settings_hold_separators_keep_their_own_names_and_runs(night_env):
    cfg = write(night_env, "mc.toml", f'[[matrix]]\ntarget = "{LOOSE}"\na = ["1,b=2"]\n\n'
                f'[[matrix]]\ntarget = "{LOOSE}"\na = ["1"]\nb = ["2"]\n')  # fmt: skip
    one = invoke("nightly", "--config", cfg, "--night", "nc", "--commit", "a" * 40, "--json",
                 "--fail-on", "never")  # fmt: skip
    ran = {c["cell"]: c["run_id"] for c in json.loads(one.stdout)["cells"]}
    res, out = merge("nc", "--fail-on", "mismatch")
    comma, plain = f'{LOOSE}[a="1,b=2"]', f"{LOOSE}[a=1,b=2]"  # the comma one fails (loose)
    assert [c["cell"] for c in out["cells"]] == [comma, plain]
    assert {c["cell"]: c["run_id"] for c in out["cells"]} == ran and len(set(ran.values())) == 2
    assert [c["passed"] for c in out["cells"]] == [False, True]
    assert res.exit_code == 1 and out["headline"].startswith("FAIL")


@pytest.mark.parametrize(
    ("second", "named"),
    [('b = "2"\na = "1"', f"{LOOSE}[b=2,a=1]"), ('a = "1"\nb = "2"\nmode = "equal"', None)],
)
def test_a_matrix_with_two_cells_of_one_identity_exits_2_naming_both(night_env, second, named):
    first = f'[[matrix]]\ntarget = "{LOOSE}"\na = "1"\nb = "2"\n'
    cfg = write(night_env, "dup.toml", f'{first}\n[[matrix]]\ntarget = "{LOOSE}"\n{second}\n')
    res = invoke("nightly", "--config", cfg, "--commit", "a" * 40)
    assert res.exit_code == 2
    assert f"{LOOSE}[a=1,b=2]" in res.output and (named or f"{LOOSE}[a=1,b=2]") in res.output
    assert "#1" in res.output and "#2" in res.output  # both entries named


_TEXT = st.text(alphabet='ab1,=[]"\\', max_size=4)


@given(st.dictionaries(_TEXT, _TEXT, min_size=2, max_size=4))
def test_folding_a_setting_into_the_previous_value_changes_the_name(settings):
    """``{k1: v1, k2: v2, ...}`` and ``{k1: "v1,k2=v2", ...}`` are distinct cells."""
    from parity_tracker.pipeline.matrix import Cell

    (k1, v1), (k2, v2), *rest = settings.items()
    folded = {k1: f"{v1},{k2}={v2}", **dict(rest)}
    a, b = Cell("t", tuple(settings.items())), Cell("t", tuple(folded.items()))
    assert a.settings != b.settings and a.name != b.name


def test_a_shard_parent_not_finished_makes_the_night_incomplete(night_env):
    from parity_tracker.track.store import get_client

    cfg = write(night_env, "k4.toml", K4)
    shard(cfg, "1/2", "run")
    s2 = shard(cfg, "2/2", "run")["parent_run_id"]
    get_client(night_env["uri"]).update_run(s2, status="RUNNING")  # as if still running
    res, out = merge("run")
    assert res.exit_code == 1 and out["complete"] is False and out["missing_shards"] == []
    (problem,) = out["shard_problems"]
    assert "2/2" in problem and s2 in problem and "RUNNING" in problem
    assert sorted(by_k(out)) == ["0", "1", "2", "3"]
    assert invoke("nightly-merge", "--night", "run", "--fail-on", "never").exit_code == 0
