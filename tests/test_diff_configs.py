"""``diff`` across runs of different configurations warns, and a diff without changes says so.

Unit tests build settings and ``modules`` tables by hand (the expected lines are written out);
the CLI tests store runs of ``cli_targets:tiny`` on a private SQLite store.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from test_cli import invoke, run_json

from parity_tracker.analysis.configs import (
    config_differences,
    setting_differences,
    tolerance_differences,
)
from parity_tracker.analysis.render import no_changes_line


@pytest.fixture
def env(in_tmp_cwd, sqlite_tracking_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_tracking_uri)
    monkeypatch.delenv("PARITY_TEST_PERTURB", raising=False)
    return {"uri": sqlite_tracking_uri, "cwd": in_tmp_cwd}


def _modules(tags, rtol, atol, steps=None):
    n = len(tags)
    return pa.table({
        "tag": pa.array(tags, pa.string()),
        "step": pa.array(steps or [0] * n, pa.int32()),
        "rtol": pa.array(rtol, pa.float64()),
        "atol": pa.array(atol, pa.float64()),
    })  # fmt: skip


# --------------------------------------------------------------------------- units


def test_setting_differences_name_mode_target_and_settings_not_environment():
    base = {"target": "a", "quantization": "bf16", "mode": "budget", "num_threads": "2",
            "compile_graph_breaks": "0"}  # fmt: skip
    head = {"target": "b", "quantization": "bf16", "mode": "allclose", "num_threads": "8",
            "compile_graph_breaks": "3", "rtol": "0.01"}  # fmt: skip
    assert setting_differences(base, head) == [
        "mode: budget -> allclose",
        "rtol: (absent) -> 0.01",
        "target: a -> b",
    ]  # num_threads is environment, graph breaks a measured fact: neither is configuration
    assert setting_differences(base, dict(base)) == []


def test_tolerance_differences_count_shared_tags_only():
    base = _modules(["a", "b", "c", "gone"], [1e-3, 1e-3, None, 1.0], [1e-5, 1e-5, None, 1.0])
    head = _modules(["a", "b", "c", "new"], [1e-3, 1e-2, None, 5.0], [1e-5, 1e-5, None, 5.0])
    # shared: a (same), b (rtol differs), c (both null: same); gone/new are not shared
    assert tolerance_differences(base, head) == [
        "tolerances (rtol/atol): 1 of 3 shared tags, e.g. b: 0.001/1e-05 -> 0.01/1e-05"
    ]
    equal_mode = _modules(["a"], [None], [None])  # null (no tolerance) differs from a number
    assert tolerance_differences(base, equal_mode) == [
        "tolerances (rtol/atol): 1 of 1 shared tags, e.g. a: 0.001/1e-05 -> none/none"
    ]
    assert tolerance_differences(base, base) == []
    # no settings known (bare tables): only the tolerances are compared
    assert config_differences(None, None, base, base) == []


def _diff_table(base_status, head_status, change):
    n = len(base_status)
    return pa.table({
        "tag": [f"t{i}" for i in range(n)], "change": change,
        "base_status": base_status, "head_status": head_status,
    })  # fmt: skip


def test_no_changes_line_counts_and_tells_identical_statuses_apart():
    same = _diff_table(["equal", "close", "mismatch"], ["equal", "close", "mismatch"],
                       ["unchanged"] * 3)  # fmt: skip
    assert no_changes_line(same) == "no changes: 3 tensors compared, all statuses identical"
    # equal -> close keeps the pass/fail class (unchanged without a known hash): said so
    moved = _diff_table(["equal", "equal"], ["equal", "close"], ["unchanged"] * 2)
    line = no_changes_line(moved)
    assert line.startswith("no changes: 2 tensors compared, the same pass/fail class for all")
    assert "1 changed status within it (e.g. t1: equal -> close" in line
    assert "all statuses identical" not in line
    assert no_changes_line(_diff_table([], [], [])).startswith("no changes: 0 tensors compared")


# --------------------------------------------------------------------------- CLI


def test_diff_of_runs_of_different_modes_warns_on_stderr_and_in_json(env):
    _, budget = run_json("--quantization", "bf16", "--commit", "c1")
    _, allclose = run_json("--quantization", "bf16", "--mode", "allclose", "--commit", "c2")
    res = invoke("diff", budget["run_id"], allclose["run_id"], "--json")
    assert res.exit_code in (0, 1)  # the verdict is the diff's own, unchanged by the warning
    out = json.loads(res.stdout)  # stdout is one JSON document: the warning is on stderr
    assert out["config_differences"][0] == "mode: budget -> allclose"
    assert "warning: BASE and HEAD are runs of different configurations" in res.stderr
    assert "mode: budget -> allclose" in res.stderr
    md = invoke("diff", budget["run_id"], allclose["run_id"], "--format", "markdown")
    assert md.stdout.startswith("> **warning**: BASE and HEAD are runs of different")
    # other settings: named
    _, plain = run_json("--commit", "c3")
    res = invoke("diff", plain["run_id"], allclose["run_id"], "--json")
    diffs = json.loads(res.stdout)["config_differences"]
    assert "mode: equal -> allclose" in diffs and "quantization: none -> bf16" in diffs
    assert "candidate: copy -> bf16" in diffs


def test_diff_of_one_configuration_has_no_warning_and_markdown_says_no_changes(env):
    _, first = run_json("--commit", "c1")
    _, second = run_json("--commit", "c2")
    res = invoke("diff", first["run_id"], second["run_id"], "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["config_differences"] == []
    assert "warning" not in res.stderr
    md = invoke("diff", first["run_id"], second["run_id"], "--format", "markdown")
    assert md.exit_code == 0 and "warning" not in md.stderr
    # both runs are bitwise equal pairs: every tensor equal in both (the run's own count)
    n = first["summary"]["tensors_compared"]
    assert n == second["summary"]["tensors_compared"] > 0
    assert md.stdout.rstrip().endswith(f"no changes: {n} tensors compared, all statuses identical")


def test_diff_of_unchanged_runs_by_prefix_reports_full_ids_real_counts_and_the_line_alone(env):
    _, first = run_json("--commit", "c1")
    _, second = run_json("--commit", "c2")
    base, head = first["run_id"], second["run_id"]
    n = first["summary"]["tensors_compared"]  # bitwise equal pairs: every tensor unchanged
    assert n == second["summary"]["tensors_compared"] > 0
    res = invoke("diff", base[:10], head[:12], "--json")
    out = json.loads(res.stdout)
    assert (out["base"], out["head"]) == (base, head)  # resolved, not what was typed
    assert out["counts"]["unchanged"] == n and out["rows"] == []
    assert sum(out["counts"].values()) == n
    md = invoke("diff", base[:10], head[:12], "--format", "markdown")
    assert md.stdout.strip() == f"no changes: {n} tensors compared, all statuses identical"
