"""Issue 13, item 3: every --json output and every JSON file parses with a strict parser.

A run whose candidate output holds inf and NaN goes through every CLI command that prints JSON
(run, diff, diff --all, history, history --tag, targets, nightly, report, sync, ui --dry-run);
each stdout and every ``*.json`` file written under the test folder (summary.json, index.json,
run.json, ...) is parsed with ``json.loads(..., parse_constant=<raise>)``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from parity_tracker.cli import cli
from parity_tracker.files import jsonio

TARGET = "trust_targets:nonfinite"


def _raise(constant):
    raise AssertionError(f"non-strict JSON constant {constant}")


def strict_loads(text):
    return json.loads(text, parse_constant=_raise)


def invoke(*args, nonfinite=False):
    env = {"TRUST_NONFINITE": "1" if nonfinite else "0"}
    res = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return res, strict_loads(res.stdout)


@pytest.mark.slow
def test_every_json_output_is_strict(in_tmp_cwd, sqlite_tracking_uri, monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_tracking_uri)
    res, base = invoke("run", TARGET, "--commit", "c1", "--json")
    assert res.exit_code == 0 and base["passed"] is True
    res, head = invoke("run", TARGET, "--commit", "c2", "--json", nonfinite=True)
    assert res.exit_code == 1 and head["passed"] is False
    res, diff = invoke("diff", base["run_id"], head["run_id"], "--json")
    rows = {r["tag"]: r for r in diff["rows"]}
    # the candidate's output: one inf against a finite value, one NaN: the max |Δ| is inf
    assert rows["checker_model"]["head_max_abs_diff"] == "inf"
    assert float(rows["checker_model"]["head_max_abs_diff"]) == math.inf
    res, every = invoke("diff", base["run_id"], head["run_id"], "--json", "--all")
    assert {r["tag"]: r for r in every["rows"]}["checker_model"]["head_max_abs_diff"] == "inf"
    invoke("history", TARGET, "--json")
    invoke("history", TARGET, "--tag", "checker_model", "--json")
    invoke("targets", "--json")
    invoke("report", head["run_id"], "--json", "-o", str(tmp_path / "r" / "report.html"))
    cfg = tmp_path / "nightly.toml"
    cfg.write_text(f'[[matrix]]\ntarget = "{TARGET}"\n')
    invoke("nightly", "--config", str(cfg), "--commit", "n1", "--json", nonfinite=True)
    invoke("sync", "--json")
    invoke("ui", "--dry-run", "--json")
    written = list(tmp_path.rglob("*.json"))
    assert any(p.name == "summary.json" for p in written)
    assert any(p.name == "index.json" for p in written)  # the dump of the failing run
    for path in written:
        strict_loads(path.read_text())


def test_one_rule_for_non_finite_values():
    doc = {"a": math.inf, "b": [-math.inf, np.float32("nan"), 1.5], "c": (np.int64(3), None)}
    text = jsonio.dumps(doc, sort_keys=True)
    assert strict_loads(text) == {"a": "inf", "b": ["-inf", "nan", 1.5], "c": [3, None]}
    with pytest.raises(ValueError, match="non-strict"):
        jsonio.loads('{"x": NaN}')
    with pytest.raises(ValueError, match="non-strict"):
        jsonio.loads("[Infinity]")


def test_atomic_json_and_dump_index_write_non_finite_as_strings(tmp_path):
    from parity_tracker.files.atomic import atomic_write_json

    path = atomic_write_json(tmp_path / "x.json", {"scale": math.nan, "hi": math.inf})
    assert strict_loads(path.read_text()) == {"hi": "inf", "scale": "nan"}
