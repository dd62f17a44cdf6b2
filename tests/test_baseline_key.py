"""The baseline key is the config fingerprint AND the judged mode (and recorded tolerances).

A budget run (bf16 judged against PyTorch's own bf16 error) and an allclose run of the same
target and settings give different statuses for the same numbers; pairing them would report
fake regressions or fixes. These tests store such runs through the CLI on a private SQLite
store and check that no baseline lookup (nightly auto, nightly explicit, ``baseline_modules``)
ever pairs runs of different modes.
"""

from __future__ import annotations

import json

import pytest
from test_cli import TINY, invoke, run_json

from parity_tracker.run.mode import baseline_key, baseline_params


@pytest.fixture
def env(in_tmp_cwd, sqlite_tracking_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_tracking_uri)
    monkeypatch.delenv("PARITY_TEST_PERTURB", raising=False)
    return {"uri": sqlite_tracking_uri, "cwd": in_tmp_cwd}


def test_baseline_key_and_params_are_fingerprint_and_mode():
    assert baseline_params("f2b5421f83f281a2", "budget") == {
        "config_fingerprint": "f2b5421f83f281a2",
        "mode": "budget",
    }
    assert baseline_key("f2b5421f83f281a2", "allclose") == "f2b5421f83f281a2/allclose"
    assert baseline_key("f2b5421f83f281a2", "allclose") != baseline_key(
        "f2b5421f83f281a2", "budget"
    )
    # an unknown mode or fingerprint: no key, never paired
    assert baseline_key("f2b5421f83f281a2", None) is None
    assert baseline_key(None, "equal") is None


def _params(uri: str, run_id: str) -> dict[str, str]:
    from parity_tracker.track.store import get_client

    return dict(get_client(uri).get_run(run_id).data.params)


def test_budget_and_allclose_runs_share_a_fingerprint_but_never_a_baseline(env):
    from parity_tracker.pipeline.baseline import baseline_modules
    from parity_tracker.track.query import RunStore

    _, budget = run_json("--quantization", "bf16", "--commit", "c1")
    _, allclose = run_json("--quantization", "bf16", "--mode", "allclose", "--commit", "c2")
    assert budget["summary"]["mode"] == "budget" and allclose["summary"]["mode"] == "allclose"
    pb, pa_ = _params(env["uri"], budget["run_id"]), _params(env["uri"], allclose["run_id"])
    # the same configuration (the fingerprint leaves the judged mode out) ...
    assert pb["config_fingerprint"] == pa_["config_fingerprint"]
    assert (pb["mode"], pa_["mode"]) == ("budget", "allclose")
    store = RunStore(env["uri"], "parity")
    fp = pb["config_fingerprint"]
    # ... but the budget run on c1 is never the allclose run's baseline
    found = baseline_modules("auto", head_run_id=allclose["run_id"], head_commit="c2",
                             fingerprint=fp, mode="allclose", store=store)  # fmt: skip
    assert found == (None, None)
    # a newer budget run (c3) is skipped: the allclose head on c4 pairs with the allclose c2
    _, newer_budget = run_json("--quantization", "bf16", "--commit", "c3")
    _, head = run_json("--quantization", "bf16", "--mode", "allclose", "--commit", "c4")
    base_id, table = baseline_modules("auto", head_run_id=head["run_id"], head_commit="c4",
                                      fingerprint=fp, mode="allclose", store=store)  # fmt: skip
    assert base_id == allclose["run_id"] != newer_budget["run_id"]
    assert table.num_rows == allclose["summary"]["tensors_compared"]
    # and the budget head on c3 pairs with the budget c1
    found = baseline_modules("auto", head_run_id=newer_budget["run_id"], head_commit="c3",
                             fingerprint=fp, mode="budget", store=store)  # fmt: skip
    assert found[0] == budget["run_id"]
    # an explicit baseline run stands for its own key only
    assert store.baseline_runs(budget["run_id"]) == {f"{fp}/budget": budget["run_id"]}


def _matrix(tmp_path, mode: str):
    path = tmp_path / f"{mode}.toml"
    path.write_text(f'[[matrix]]\ntarget = "{TINY}"\nquantization = "bf16"\nmode = "{mode}"\n')
    return path


def test_nightly_never_diffs_an_allclose_cell_against_a_budget_night(env, tmp_path):
    budget_cfg, allclose_cfg = _matrix(tmp_path, "budget"), _matrix(tmp_path, "allclose")
    first = json.loads(invoke("nightly", "--config", str(budget_cfg), "--commit", "n1",
                              "--json").stdout)  # fmt: skip
    assert first["cells"][0]["mode"] == "budget"
    res = invoke("nightly", "--config", str(allclose_cfg), "--commit", "n2", "--json")
    (cell,) = json.loads(res.stdout)["cells"]
    assert cell["mode"] == "allclose"
    assert cell["baseline_run_id"] is None  # the only earlier run of this fingerprint is budget
    assert cell["changes"]["regression"] == 0 and cell["changes"]["fix"] == 0
    # explicitly naming the budget night: it covers no allclose cell (exit 2, says so)
    bad = invoke("nightly", "--config", str(allclose_cfg), "--commit", "n3",
                 "--baseline", first["parent_run_id"])  # fmt: skip
    assert bad.exit_code == 2 and "configuration and mode" in bad.output
    # a later allclose night pairs with the newest allclose run (n3's cell ran and was logged
    # before the explicit baseline was found wanting), never with the budget one
    again = json.loads(invoke("nightly", "--config", str(allclose_cfg), "--commit", "n4",
                              "--json").stdout)  # fmt: skip
    base_id = again["cells"][0]["baseline_run_id"]
    assert base_id not in (None, first["cells"][0]["run_id"], cell["run_id"])
    assert _params(env["uri"], base_id)["mode"] == "allclose"


def test_tolerances_given_are_recorded_and_part_of_the_fingerprint(env):
    _, plain = run_json("--mode", "allclose", "--commit", "c1")
    _, loose = run_json("--mode", "allclose", "--rtol", "0.01", "--atol", "0.001", "--commit", "c2")
    p, q = _params(env["uri"], plain["run_id"]), _params(env["uri"], loose["run_id"])
    assert "rtol" not in p and "atol" not in p
    assert (q["rtol"], q["atol"]) == ("0.01", "0.001")
    assert p["config_fingerprint"] != q["config_fingerprint"]
    # the fingerprint of a run without tolerance options is unchanged: the same as before
    _, again = run_json("--mode", "allclose", "--commit", "c3")
    assert _params(env["uri"], again["run_id"])["config_fingerprint"] == p["config_fingerprint"]
