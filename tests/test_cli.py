"""Every CLI command and error path through click's CliRunner, on a tiny in-test target.

The target ``cli_targets:tiny`` (tests/cli_targets.py) is two copies of a seeded MLP; the
environment variable ``PARITY_TEST_PERTURB=fc2`` moves the candidate's ``2.weight`` by 1e-3
without changing the settings, i.e. a new "commit" of the same configuration.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from parity_tracker.cli import cli

TINY = "cli_targets:tiny"
# The perturbed Linear's weight, its output and everything downstream of it (worked out from the
# model: Linear(0) -> ReLU(1) -> Linear(2) -> Tanh(3)); nothing upstream may regress.
DOWNSTREAM = {"checker_2.weight", "checker_2", "checker_3_input_0", "checker_3", "checker_model"}


@pytest.fixture
def env(in_tmp_cwd, sqlite_tracking_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_tracking_uri)
    monkeypatch.delenv("PARITY_TEST_PERTURB", raising=False)
    return {"uri": sqlite_tracking_uri, "cwd": in_tmp_cwd}


def invoke(*args, perturb=False, **kw):
    extra_env = {"PARITY_TEST_PERTURB": "fc2" if perturb else "none"}
    if args and args[0] == "nightly" and "--commit" not in args:  # tmp_path is no git checkout
        args = (*args, "--allow-no-commit")
    return CliRunner().invoke(cli, list(args), env=extra_env, catch_exceptions=False, **kw)


def run_json(*args, perturb=False):
    res = invoke("run", TINY, *args, "--json", perturb=perturb)
    return res, json.loads(res.stdout)


# --------------------------------------------------------------------------- targets


def test_targets_lists_builtins_with_settings():
    res = invoke("targets", "--json")
    assert res.exit_code == 0
    found = {t["name"]: t for t in json.loads(res.stdout)}
    assert found["digits-cnn"]["settings"]["quantization"][0] == "none"
    assert found["digits-cnn"]["source"] == "builtin"
    assert invoke("targets").exit_code == 0


# --------------------------------------------------------------------------- run


def test_run_pass_logs_and_exits_0(env):
    from parity_tracker.track import find_runs

    res, out = run_json("--commit", "c1")
    assert res.exit_code == 0, res.output
    assert out["passed"] is True and out["summary"]["tensors_failing"] == 0
    (info,) = find_runs(tracking_uri=env["uri"], target=TINY)
    assert info.run_id == out["run_id"] and info.commit == "c1"
    assert info.settings["perturb"] == "none"


def test_run_failure_exits_1_and_prints_summary(env):
    res = invoke("run", TINY, "--commit", "c2", perturb=True)
    assert res.exit_code == 1
    assert "PARITY FAILS" in res.stdout and "first divergence" in res.stdout
    assert "parity-tracker ui" in res.stdout


def test_budget_run_prints_its_worst_error_ratio(env):
    _, out = run_json("--quantization", "bf16", "--mode", "budget", perturb=True)
    s = out["summary"]
    res = invoke("run", TINY, "--quantization", "bf16", "--mode", "budget", perturb=True)
    assert res.exit_code == 0, res.output
    want = f"worst error_ratio: {s['worst_error_ratio']:.3g} at {s['worst_error_ratio_tag']}"
    assert want in res.stdout
    plain = invoke("run", TINY, "--mode", "allclose", "--rtol", "0", "--atol", "0.01", perturb=True)
    assert "error_ratio" not in plain.stdout  # no ratio outside budget mode


def test_run_shortcut_options_and_allclose(env):
    res, out = run_json("--quantization", "bf16")
    assert out["summary"]["mode"] == "budget"  # a cast: error budget (issue 15)
    assert out["summary"]["settings"]["quantization"] == "bf16"
    assert res.exit_code == 0 and out["summary"]["worst_error_ratio"] <= 2.0
    # a 1e-3 fp32 weight shift is about half a bf16 ULP of the weights (2**-9 at 0.25..0.5):
    # rounding, within PyTorch's own bf16 error
    res, out = run_json("--quantization", "bf16", "--mode", "budget", perturb=True)
    assert res.exit_code == 0 and out["summary"]["mode"] == "budget"
    res, out = run_json("--mode", "allclose", "--rtol", "0", "--atol", "0.01", perturb=True)
    assert res.exit_code == 0, out["summary"]["counts"]  # 1e-3 shifts are within atol 0.01


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["run", "nope"], ["unknown target 'nope'", "digits-cnn"]),
        (["run", TINY, "--set", "perturb=fc9"], ["perturb='fc9'", "none, fc2"]),
        (["run", TINY, "--set", "colour=red"], ["unknown setting 'colour'", "perturb"]),
        (["run", TINY, "--set", "novalue"], ["KEY=VALUE"]),
        (["run", TINY, "--rtol", "0.1"], ["rtol and atol must be given together"]),
        (["run", "cli_targets:broken"], ["failed to build", "weights file missing"]),
        (["run", "no_such_module:f"], ["cannot import module 'no_such_module'"]),
        (["run", TINY, "--mode", "fuzzy"], ["fuzzy"]),
    ],
)
def test_run_input_errors_exit_2(env, args, needles):
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    for needle in needles:
        assert needle in res.output


@pytest.mark.parametrize(
    "args, kind, needle",
    [
        (["run", "no_such_module:f"], "InputError", "cannot import module 'no_such_module'"),
        (["run", TINY, "--rtol", "0.1"], "InputError", "rtol and atol must be given together"),
        (["diff", "no-such-run", "no-such-run"], "InputError", "no-such-run"),
    ],
)
def test_json_input_error_is_one_error_document_on_stdout(env, args, kind, needle):
    res = invoke(*args, "--json")
    assert res.exit_code == 2
    doc = json.loads(res.stdout)  # a script reading stdout gets a document, not nothing
    assert set(doc) == {"error"} and doc["error"]["type"] == kind
    assert doc["error"]["exit_code"] == 2 and needle in doc["error"]["message"]
    assert "Error: " in res.stderr and needle in res.stderr  # still said on stderr
    plain = invoke(*args)  # without --json: nothing on stdout
    assert plain.exit_code == 2 and plain.stdout == ""


def test_run_store_unreachable_exits_3_with_spool_path(env):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = invoke("run", TINY, "--tracking-uri", "http://127.0.0.1:9", "--json")
    assert res.exit_code == 3
    # one JSON document: the run's (printed before the store error), no second error document
    assert json.loads(res.stdout)["run_id"] is None
    spooled = list((env["cwd"] / ".parity" / "spool").iterdir())
    # said once, by the Error line: the library's spool warning is not shown by the CLI
    assert [w for w in caught if "spooled to" in str(w.message)] == []
    said = [line for line in res.stderr.splitlines() if str(spooled[0]) in line]
    assert len(spooled) == 1 and len(said) == 1 and said[0].startswith("Error: ")
    # sync uploads it to the reachable store, exactly once
    sync = invoke("sync", "--tracking-uri", env["uri"], "--json")
    assert sync.exit_code == 0
    assert list(json.loads(sync.stdout)["uploaded"]) == [spooled[0].name]
    again = invoke("sync", "--tracking-uri", env["uri"], "--json")
    assert json.loads(again.stdout)["uploaded"] == {}


def test_run_interrupted_is_logged_killed_exit_130(env):
    from parity_tracker.track import find_runs
    from parity_tracker.track.store import get_client

    res = invoke("run", "cli_targets:interrupting")
    assert res.exit_code == 130
    (info,) = find_runs(tracking_uri=env["uri"], target="cli_targets:interrupting")
    assert get_client(env["uri"]).get_run(info.run_id).info.status == "KILLED"


# --------------------------------------------------------------------------- diff


@pytest.fixture
def two_commits(env):
    _, first = run_json("--commit", "c1")
    _, second = run_json("--commit", "c2", perturb=True)
    return first["run_id"], second["run_id"]


def test_diff_names_exactly_the_downstream_tags_as_regressions(two_commits):
    base, head = two_commits
    res = invoke("diff", base, head, "--json")
    assert res.exit_code == 1
    out = json.loads(res.stdout)
    regressions = {r["tag"] for r in out["rows"] if r["change"] == "regression"}
    assert regressions == DOWNSTREAM
    assert out["counts"]["regression"] == len(DOWNSTREAM)
    md = invoke("diff", base, head, "--format", "markdown")
    assert md.exit_code == 1 and "| regression | checker_2 |" in md.stdout
    table = invoke("diff", base, head)
    assert table.exit_code == 1 and "regression" in table.stdout


def test_diff_same_run_and_fix_exit_0(two_commits):
    base, head = two_commits
    same = invoke("diff", base, base, "--json")
    assert same.exit_code == 0 and json.loads(same.stdout)["rows"] == []
    fixed = invoke("diff", head, base, "--json")  # failing -> passing: fixes, exit 0
    assert fixed.exit_code == 0
    assert json.loads(fixed.stdout)["counts"]["fix"] == len(DOWNSTREAM)


def test_diff_by_commit_selectors(two_commits):
    res = invoke("diff", "--base-commit", "c1", "--head-commit", "c2", "--target", TINY, "--json")
    assert res.exit_code == 1
    assert json.loads(res.stdout)["base"] == two_commits[0]
    missing = invoke("diff", "--base-commit", "c7", "--head-commit", "c2", "--target", TINY)
    assert missing.exit_code == 2 and "'c7'" in missing.output
    assert invoke("diff", "--base-commit", "c1", "--head-commit", "c2").exit_code == 2


def test_diff_expected_entry_turns_regressions_into_expected(two_commits, tmp_path):
    base, head = two_commits
    expected = tmp_path / "expected.toml"
    expected.write_text(
        f'[[expected]]\ntarget = "{TINY}"\ntag = "checker_*"\nreason = "known"\n'
        "until = 2999-01-01\n"
    )
    res = invoke("diff", base, head, "--expected", str(expected), "--json")
    assert res.exit_code == 0
    assert json.loads(res.stdout)["counts"]["expected"] == len(DOWNSTREAM)


def test_diff_unknown_run_id_exits_2_naming_it(env):
    unknown = "0123456789abcdef0123456789abcdef"
    for base, head in ((unknown, "feedbeef"), ("feedbeef", unknown)):
        res = invoke("diff", base, head)
        # both ids are unknown; the first one read (head, by diff_runs) is named
        assert res.exit_code == 2 and f"'{head}'" in res.output
    assert invoke("diff").exit_code == 2  # neither ids nor commits


# --------------------------------------------------------------------------- history


def test_history_names_first_bad_commit(two_commits):
    run_json("--commit", "c3", perturb=True)
    res = invoke("history", TINY, "--tag", "checker_2", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [p["commit"] for p in out["points"]] == ["c1", "c2", "c3"]
    assert [p["tag_status"] for p in out["points"]] == ["equal", "mismatch", "mismatch"]
    assert out["first_bad_commit"] == "c2"
    text = invoke("history", TINY, "--last", "2")
    assert text.exit_code == 0 and "first bad commit: c2" in text.stdout


def test_history_errors(env):
    assert invoke("history", "nope").exit_code == 2
    res = invoke("history", TINY)
    assert res.exit_code == 2 and "no stored run" in res.output


# --------------------------------------------------------------------------- report, ui


def test_report_rebuilds_html(two_commits, tmp_path):
    out = tmp_path / "r.html"
    res = invoke("report", two_commits[1], "-o", str(out), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["path"] == str(out.resolve())
    assert out.read_text().lstrip().lower().startswith("<!doctype html")
    assert invoke("report", "deadbeef" * 4).exit_code == 2


def test_report_title_of_a_custom_target_names_its_candidate(env, tmp_path):
    """``cli_targets:loose`` sets no ``candidate``: the title names the candidate's class (the
    seeded ``nn.Sequential``), where it read ``vs ?``; ``tiny`` keeps its ``candidate``."""
    import re

    for target, want in (("cli_targets:loose", "Sequential"), (TINY, "copy")):
        res = invoke("run", target, "--commit", "c1", "--json")
        out = tmp_path / "r.html"
        assert invoke("report", json.loads(res.stdout)["run_id"], "-o", str(out)).exit_code == 0
        title = re.search(r"<title>(.*?)</title>", out.read_text()).group(1)
        assert title == f"parity: {target} vs {want}"


def test_ui_dry_run_binds_loopback(env):
    res = invoke("ui", "--dry-run", "--port", "5123", "--json")
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert out["url"] == "http://127.0.0.1:5123"
    assert out["open"] == out["experiments_url"]  # no parity experiment yet: the list
    assert (
        out["experiments_url"]
        == "http://127.0.0.1:5123/#/experiments?workflowType=machine_learning"
    )
    cmd = out["command"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--backend-store-uri") + 1] == env["uri"]


# --------------------------------------------------------------------------- nightly


def _matrix(tmp_path: Path, body: str | None = None) -> Path:
    path = tmp_path / "nightly.toml"
    path.write_text(body or f'[[matrix]]\ntarget = "{TINY}"\nquantization = ["none", "bf16"]\n')
    return path


def test_nightly_twice_then_regression_then_expected(env, tmp_path):
    cfg = _matrix(tmp_path)
    first = invoke("nightly", "--config", str(cfg), "--commit", "n1", "--json")
    assert first.exit_code == 0, first.output
    one = json.loads(first.stdout)
    assert len(one["cells"]) == 2 and one["regressions"] == 0
    assert all(c["baseline_run_id"] is None for c in one["cells"])
    # second night, new commit, same numerics: diffs against the first, no regression, no drift
    second = json.loads(invoke("nightly", "--config", str(cfg), "--commit", "n2", "--json").stdout)
    firsts = {c["cell"]: c["run_id"] for c in one["cells"]}
    for cell in second["cells"]:
        assert cell["baseline_run_id"] == firsts[cell["cell"]]
        assert cell["changes"]["regression"] == 0 and cell["changes"]["drift"] == 0
    # third night perturbs fc2: the none cell regresses, exit 1, digest names the tag
    third = invoke("nightly", "--config", str(cfg), "--commit", "n3", "--json", perturb=True)
    assert third.exit_code == 1
    out = json.loads(third.stdout)
    none_cell = next(c for c in out["cells"] if "quantization=none" in c["cell"])
    assert none_cell["changes"]["regression"] == len(DOWNSTREAM)
    assert "checker_2" in out["digest"] and "Regressions" in out["digest"]
    # an expected entry for that cell turns it into expected: exit 0
    (tmp_path / "expected.toml").write_text(
        f'[[expected]]\ntarget = "{TINY}"\nsettings = {{ quantization = "none" }}\n'
        'tag = "checker_*"\nreason = "fc2 retrained"\nuntil = 2999-12-31\n'
    )
    fourth = invoke("nightly", "--config", str(cfg), "--commit", "n4", "--json", perturb=True)
    four = json.loads(fourth.stdout)
    assert fourth.exit_code == 0, four["digest"]
    cell = next(c for c in four["cells"] if "quantization=none" in c["cell"])
    assert cell["changes"]["expected"] == len(DOWNSTREAM) and cell["changes"]["regression"] == 0
    assert "fc2 retrained" in four["digest"]


def test_nightly_writes_parent_artifacts_and_prints_digest(env, tmp_path):
    import pyarrow.parquet as pq

    from parity_tracker.track.store import get_client

    cfg = _matrix(tmp_path)
    res = invoke("nightly", "--config", str(cfg), "--commit", "a1")
    assert res.exit_code == 0, res.output
    # stdout is the digest (`> digest.md`); where to browse the runs goes to stderr
    assert "Parity nightly" in res.stdout and "parity-tracker ui" not in res.stdout
    assert "parity-tracker ui" in res.stderr
    client = get_client(env["uri"])
    parent = next(
        r for r in client.search_runs([client.get_experiment_by_name("parity").experiment_id])
        if r.data.tags.get("parity.kind") == "nightly"
    )  # fmt: skip
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"digest.md", "regressions.parquet", "matrix.html", "history.html"} <= names
    local = client.download_artifacts(parent.info.run_id, "regressions.parquet", str(tmp_path))
    assert "change" in pq.read_table(local).column_names
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    assert len(children) == 2


def test_nightly_expired_entry_fails_and_names_itself(env, tmp_path):
    cfg = _matrix(tmp_path)
    (tmp_path / "expected.toml").write_text(
        f'[[expected]]\ntarget = "{TINY}"\ntag = "checker_9"\nreason = "old"\nuntil = 2020-01-01\n'
    )
    res = invoke("nightly", "--config", str(cfg), "--json")
    assert res.exit_code == 1
    out = json.loads(res.stdout)
    assert out["expired"] and "expected.toml#1" in out["expired"][0]
    assert "EXPIRED" in out["digest"]
    never = invoke("nightly", "--config", str(cfg), "--json", "--fail-on", "never")
    assert never.exit_code == 0


def test_nightly_shards_and_fail_on_mismatch(env, tmp_path):
    cfg = _matrix(tmp_path)
    s1 = json.loads(invoke("nightly", "--config", str(cfg), "--shard", "1/2", "--json").stdout)
    s2 = json.loads(invoke("nightly", "--config", str(cfg), "--shard", "2/2", "--json").stdout)
    assert [c["cell"] for c in s1["cells"]] == [f"{TINY}[perturb=none,quantization=none]"]
    assert [c["cell"] for c in s2["cells"]] == [f"{TINY}[perturb=none,quantization=bf16]"]
    res = invoke("nightly", "--config", str(cfg), "--shard", "1/2", "--fail-on", "mismatch",
                 "--json", perturb=True)  # fmt: skip
    assert res.exit_code == 1  # failing tensors, regressions or not


def test_nightly_explicit_baseline(env, tmp_path):
    cfg = _matrix(tmp_path)
    first = json.loads(invoke("nightly", "--config", str(cfg), "--commit", "b1", "--json").stdout)
    run_json("--commit", "b2")  # a newer run of one configuration: auto would pick it
    res = invoke("nightly", "--config", str(cfg), "--commit", "b3", "--json",
                 "--baseline", first["parent_run_id"])  # fmt: skip
    out = json.loads(res.stdout)
    wanted = {c["cell"]: c["run_id"] for c in first["cells"]}
    assert {c["cell"]: c["baseline_run_id"] for c in out["cells"]} == wanted
    bad = invoke("nightly", "--config", str(cfg), "--baseline", "ab" * 16)
    assert bad.exit_code == 2 and "ab" * 16 in bad.output


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        ('[[matrix]\ntarget = "x"\n', ["nightly.toml:1", "malformed TOML"]),
        ('[[matrix]]\ntarget = "nope"\n', ["#1", "unknown target 'nope'"]),
        (f'[[matrix]]\ntarget = "{TINY}"\nperturb = ["none", "fc7"]\n', ["#1", "none, fc2"]),
        ("[other]\nx = 1\n", ["unknown top-level keys"]),
        ("", ["no [[matrix]] entries"]),
    ],
)
def test_nightly_bad_config_exits_2(env, tmp_path, body, needles):
    res = invoke("nightly", "--config", str(_matrix(tmp_path, body or "\n")))
    assert res.exit_code == 2
    for needle in needles:
        assert needle in res.output


def test_nightly_usage_errors(env, tmp_path):
    cfg = _matrix(tmp_path)
    assert invoke("nightly", "--config", str(cfg), "--shard", "3/2").exit_code == 2
    assert invoke("nightly", "--config", str(cfg), "--shard", "x").exit_code == 2
    missing = invoke("nightly", "--config", str(tmp_path / "absent.toml"))
    assert missing.exit_code == 2 and "absent.toml" in missing.output
    res = invoke("nightly", "--config", str(cfg), "--tracking-uri", "http://127.0.0.1:9")
    assert res.exit_code == 3


def test_nightly_interrupted_ends_parent_killed_exit_130(env, tmp_path):
    from parity_tracker.track.store import get_client

    cfg = _matrix(tmp_path, '[[matrix]]\ntarget = "cli_targets:interrupting"\n')
    res = invoke("nightly", "--config", str(cfg), "--json")
    assert res.exit_code == 130
    client = get_client(env["uri"])
    runs = client.search_runs([client.get_experiment_by_name("parity").experiment_id])
    kinds = {r.data.tags.get("parity.kind", "cell"): r.info.status for r in runs}
    assert kinds == {"nightly": "KILLED", "cell": "KILLED"}


def test_ui_on_a_server_store_just_prints_its_url(env):
    res = invoke("ui", "--tracking-uri", "http://127.0.0.1:5999", "--json")
    assert res.exit_code == 0
    assert json.loads(res.stdout) == {
        "url": "http://127.0.0.1:5999", "command": None,
        "note": "the store is already an MLflow server", "open": "http://127.0.0.1:5999",
        "runs_url": None, "experiments": [],
        "experiments_url": "http://127.0.0.1:5999/#/experiments?workflowType=machine_learning",
    }  # fmt: skip


def test_diff_by_abbreviated_commit(env):
    _, first = run_json("--commit", "a1b2c3d4" + "0" * 32)
    _, second = run_json("--commit", "f9e8d7c6" + "0" * 32, perturb=True)
    res = invoke(
        "diff", "--base-commit", "a1b2c3d", "--head-commit", "f9e8d7c", "--target", TINY, "--json"
    )
    assert res.exit_code == 1
    out = json.loads(res.stdout)
    assert (out["base"], out["head"]) == (first["run_id"], second["run_id"])


def test_run_target_module_in_working_directory(env, monkeypatch):
    import sys

    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(env["cwd"]))])
    (Path(env["cwd"]) / "my_pairs.py").write_text(
        "import torch\n"
        "from parity_tracker import ParityCase\n"
        "def build(settings):\n"
        "    torch.manual_seed(0)\n"
        "    ref = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
        "    cand = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
        "    cand.load_state_dict(ref.state_dict())\n"
        "    return ParityCase(ref, cand, inputs=(torch.ones(2, 4),))\n"
    )
    res = invoke("run", "my_pairs:build", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["summary"]["counts"]["mismatch"] == 0
