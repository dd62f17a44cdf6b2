"""A night's or a shard's parent run given where cells are meant (issue 18, wave 5).

``--baseline <night parent>`` stands for every cell of the night; a baseline that covers no
cell is refused before any cell runs; ``diff`` / ``report`` of a parent run is bad input
(exit 2) naming its cells. Expected run ids are the ones the test's own shards printed.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from parity_tracker.cli import cli

TINY = "cli_targets:tiny"
MATRIX = f'[[matrix]]\ntarget = "{TINY}"\nquantization = ["none", "bf16"]\n'


@pytest.fixture
def env(in_tmp_cwd, sqlite_tracking_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_tracking_uri)
    monkeypatch.delenv("PARITY_TEST_PERTURB", raising=False)
    cfg = in_tmp_cwd / "nightly.toml"
    cfg.write_text(MATRIX)
    return {"uri": sqlite_tracking_uri, "cfg": str(cfg)}


def invoke(*args, perturb=False):
    extra = {"PARITY_TEST_PERTURB": "fc2" if perturb else "none"}
    return CliRunner().invoke(cli, list(args), env=extra, catch_exceptions=False)


def nightly(env, *extra, perturb=False):
    res = invoke("nightly", "--config", env["cfg"], "--json", *extra, perturb=perturb)
    return res.exit_code, (json.loads(res.stdout) if res.stdout.strip() else None), res


def run_count(uri):
    from parity_tracker.track.store import get_client

    client = get_client(uri)
    exp = client.get_experiment_by_name("parity").experiment_id
    return len(client.search_runs([exp], max_results=1000))


def test_a_night_parent_baseline_covers_every_cell_and_parents_are_no_diff_input(env):
    _, s1, _ = nightly(env, "--shard", "1/2", "--commit", "a" * 40, "--night", "n1")
    _, s2, _ = nightly(env, "--shard", "2/2", "--commit", "a" * 40, "--night", "n1")
    cells = {c["cell"]: c["run_id"] for c in s1["cells"] + s2["cells"]}  # what the shards ran
    merged = json.loads(invoke("nightly-merge", "--night", "n1", "--json").stdout)
    night = merged["parent_run_id"]

    # the whole matrix in one shard, against the night parent: each cell gets its own cell
    code, out, _ = nightly(env, "--commit", "b" * 40, "--night", "n2", "--baseline", night,
                           perturb=True)  # fmt: skip
    assert {c["cell"]: c["baseline_run_id"] for c in out["cells"]} == cells
    assert code == 1 and out["regressions"] > 0  # the perturbation regresses against it

    # diff / report of a parent: bad input (2), naming the parent kind and a cell run id
    head = out["cells"][0]["run_id"]
    shard_cell = s1["cells"][0]["run_id"]
    for parent, kind, ids in [(night, "night parent", cells.values()),
                              (s1["parent_run_id"], "shard parent", [shard_cell])]:  # fmt: skip
        for args in (["diff", parent[:10], head], ["diff", head, parent], ["report", parent]):
            res = invoke(*args)
            assert res.exit_code == 2, (args, res.output)
            assert kind in res.output and parent in res.output
            assert all(i in res.output for i in ids) and "pass a cell's run id" in res.output


def test_a_baseline_covering_no_cell_is_refused_before_any_cell_runs(env):
    from parity_tracker.track.store import get_client

    _, s1, _ = nightly(env, "--shard", "1/2", "--commit", "c" * 40, "--night", "n3")
    client = get_client(env["uri"])
    bare = client.create_run(client.get_experiment_by_name("parity").experiment_id)
    before = run_count(env["uri"])
    # shard 1/2 ran the quantization=none cell only; shard 2/2 runs the bf16 one
    for baseline, words in [(s1["parent_run_id"], "covers none"),
                            (bare.info.run_id, "no stored parity run")]:  # fmt: skip
        code, out, res = nightly(env, "--shard", "2/2", "--commit", "d" * 40,
                                 "--baseline", baseline)  # fmt: skip
        assert code == 2 and out["error"]["type"] == "InputError"  # the --json error doc
        assert run_count(env["uri"]) == before  # refused first: no parent run, no cell run
        assert words in res.output and baseline in res.output


def test_a_night_parent_stands_for_every_shard_even_when_its_shard_list_tag_is_cut(env):
    """A night of many shards overflows ``parity.shard_runs`` (cut at 5,000 characters): the
    night parent still stands for the cells of every shard of its night (found by the night
    tag), not only the shards the cut tag still names."""
    from parity_tracker.track.parents import TAG_SHARD_RUNS
    from parity_tracker.track.store import get_client

    _, s1, _ = nightly(env, "--shard", "1/2", "--commit", "e" * 40, "--night", "n4")
    _, s2, _ = nightly(env, "--shard", "2/2", "--commit", "e" * 40, "--night", "n4")
    cells = {c["cell"]: c["run_id"] for c in s1["cells"] + s2["cells"]}
    night = json.loads(invoke("nightly-merge", "--night", "n4", "--json").stdout)["parent_run_id"]
    # what a cut tag leaves: the first shard whole, the second one's id cut in the middle
    cut = f"{s1['parent_run_id']},{s2['parent_run_id'][:7]}"
    get_client(env["uri"]).set_tag(night, TAG_SHARD_RUNS, cut)

    code, out, _ = nightly(env, "--commit", "f" * 40, "--night", "n5", "--baseline", night)
    assert code == 0, out
    assert {c["cell"]: c["baseline_run_id"] for c in out["cells"]} == cells
