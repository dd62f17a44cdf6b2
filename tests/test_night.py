"""Issue 18 on the embedded store: nights and their merge, run-id prefixes, commits, retries,
torch-free read-only imports, and one JSON document on stdout against a real mlflow server."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from night_helpers import CELLS, MATRIX, TINY

from parity_tracker.cli import cli
from parity_tracker.errors import InputError


def invoke(*args, perturb=False):
    extra = {"PARITY_TEST_PERTURB": "fc2" if perturb else "none"}
    return CliRunner().invoke(cli, list(args), env=extra, catch_exceptions=False)


def shard(env, i, commit, *extra, perturb=False):
    res = invoke("nightly", "--config", env["cfg"], "--shard", f"{i}/2", "--commit", commit,
                 "--json", *extra, perturb=perturb)  # fmt: skip
    return res.exit_code, json.loads(res.stdout)


def test_default_night_id_is_date_commit_matrix_hash(night_env):
    from parity_tracker.pipeline.night import default_night_id

    day = dt.date(2026, 11, 30)
    digest = hashlib.sha256(MATRIX.encode()).hexdigest()[:8]
    assert (
        default_night_id("0123456789abcdef", night_env["cfg"], day)
        == f"20261130-0123456789ab-{digest}"
    )
    # without a commit: unique per night (a random suffix), see test_night_shards
    assert default_night_id(None, night_env["cfg"], day).startswith(f"20261130-nocommit-{digest}-")


def test_two_nights_of_two_shards_merge_with_per_cell_baselines(night_env):
    _, a1 = shard(night_env, 1, "a" * 40, "--night", "n1")
    _, a2 = shard(night_env, 2, "a" * 40, "--night", "n1")
    assert [c["cell"] for c in a1["cells"] + a2["cells"]] == CELLS
    res = invoke("nightly-merge", "--night", "n1", "--json")
    first = json.loads(res.stdout)
    assert res.exit_code == 0 and first["shard"] == "0/2" and first["night"] == "n1"
    assert [c["cell"] for c in first["cells"]] == CELLS
    assert all(c["baseline_run_id"] is None for c in first["cells"])
    assert "Cells without a baseline" in first["digest"]
    for name in CELLS:
        assert f"- {name}" in first["digest"]

    # night 2, shards swapped around: the baseline is still found per cell
    shard(night_env, 2, "b" * 40, "--night", "n2", perturb=True)
    shard(night_env, 1, "b" * 40, "--night", "n2", perturb=True)
    res = invoke("nightly-merge", "--night", "n2", "--json")
    second = json.loads(res.stdout)
    assert res.exit_code == 1 and second["regressions"] > 0  # --fail-on regression
    base = {c["cell"]: c["run_id"] for c in first["cells"]}
    assert {c["cell"]: c["baseline_run_id"] for c in second["cells"]} == base
    assert "Cells without a baseline" not in second["digest"]
    assert invoke("nightly-merge", "--night", "n2", "--fail-on", "never").exit_code == 0
    missing = invoke("nightly-merge", "--night", "n9")
    assert missing.exit_code == 2 and "n9" in missing.output


def test_merge_names_a_planned_cell_missing_from_the_store(night_env):
    from parity_tracker.track.store import get_client

    shard(night_env, 1, "c" * 40, "--night", "n3")
    _, s2 = shard(night_env, 2, "c" * 40, "--night", "n3")
    get_client(night_env["uri"]).delete_run(s2["cells"][0]["run_id"])  # as if it had been spooled
    res = invoke("nightly-merge", "--night", "n3", "--json")
    out = json.loads(res.stdout)
    assert res.exit_code == 1
    (lost,) = [c for c in out["cells"] if c["error"]]
    assert lost["cell"] == CELLS[1] and "not in the store" in lost["error"]


def test_explicit_baseline_covering_no_cell_exits_2(night_env):
    _, s1 = shard(night_env, 1, "d" * 40)
    res = invoke("nightly", "--config", night_env["cfg"], "--shard", "2/2", "--commit", "e" * 40,
                 "--baseline", s1["parent_run_id"])  # fmt: skip
    assert res.exit_code == 2
    assert s1["parent_run_id"] in res.output and "covers none" in res.output


def test_nightly_without_commit_exits_2_unless_allowed(night_env):
    res = invoke("nightly", "--config", night_env["cfg"], "--shard", "1/2")
    assert res.exit_code == 2 and "--allow-no-commit" in res.output
    ok = invoke("nightly", "--config", night_env["cfg"], "--shard", "1/2", "--allow-no-commit")
    assert ok.exit_code == 0


def test_history_never_marks_a_missing_commit_first_bad(night_env):
    from parity_tracker.analysis.history import build_history

    for perturb in (False, True):  # outside a git checkout: no commit recorded
        invoke("run", TINY, "--set", "quantization=none", perturb=perturb)
    hist = build_history(TINY, {"quantization": "none", "perturb": "none"}, tag="checker_2")
    assert [p.commit for p in hist.points] == [None, None]
    assert hist.first_bad_commit is None
    res = invoke("history", TINY, "--set", "quantization=none", "--tag", "checker_2")
    assert "first bad" not in res.output.replace("first bad commit:", "")


def test_run_ids_by_unique_prefix_everywhere_and_ambiguous_exits_2(night_env):
    from parity_tracker.track.query import RunStore
    from parity_tracker.track.store import get_client

    base = json.loads(invoke("run", TINY, "--json").stdout)["run_id"]
    head = json.loads(invoke("run", TINY, "--json", perturb=True).stdout)["run_id"]
    res = invoke("diff", base[:12], head[:12], "--format", "json")
    assert res.exit_code == 1 and json.loads(res.stdout)["counts"]["regression"] > 0
    out = night_env["cwd"] / "r.html"
    assert invoke("report", head[:8], "-o", str(out)).exit_code == 0 and out.is_file()
    # two runs sharing a first digit exist among 17 (pigeonhole over 16 hex digits)
    client = get_client(night_env["uri"])
    exp = client.get_experiment_by_name("parity").experiment_id
    ids = [base, head] + [client.create_run(exp).info.run_id for _ in range(15)]
    first = next(c for c in "0123456789abcdef" if sum(i.startswith(c) for i in ids) > 1)
    res = invoke("diff", first, head)
    assert res.exit_code == 2 and "ambiguous" in res.output
    assert sum(i in res.output for i in ids if i.startswith(first)) >= 2
    assert RunStore(night_env["uri"]).resolve_run_id(head[:10].upper()) == head
    with pytest.raises(InputError, match="malformed"):
        RunStore(night_env["uri"]).resolve_run_id("x'")


def test_retry_rides_out_transient_faults_within_the_window(monkeypatch):
    from parity_tracker.track import store

    monkeypatch.setattr(store.time, "sleep", lambda s: None)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return "ok"

    monkeypatch.setenv("PARITY_TRACKER_STORE_RETRY_S", "60")
    assert store.retry(flaky) == "ok" and len(calls) == 4
    calls.clear()
    monkeypatch.setenv("PARITY_TRACKER_STORE_RETRY_S", "0")
    with pytest.raises(ConnectionRefusedError):
        store.retry(flaky)
    assert len(calls) == 1
    with pytest.raises(ValueError):  # not transient: raised at once
        store.retry(lambda: (_ for _ in ()).throw(ValueError("RESOURCE_DOES_NOT_EXIST")))
    monkeypatch.setenv("PARITY_TRACKER_STORE_RETRY_S", "soon")
    with pytest.raises(InputError, match="PARITY_TRACKER_STORE_RETRY_S"):
        store.retry_window_s()
    monkeypatch.delenv("PARITY_TRACKER_STORE_RETRY_S")
    assert store.retry_window_s() >= 60


def test_read_only_commands_do_not_import_torch():
    code = (
        "import sys\n"
        "from parity_tracker.cli import cli\n"
        "import parity_tracker.analysis.history, parity_tracker.analysis.diff\n"
        "import parity_tracker.track.query, parity_tracker.pipeline.select\n"
        "from parity_tracker.track import RunStore\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.server
def test_json_is_one_document_against_a_real_server(mlflow_server, tmp_path, request):
    exe = str(Path(sys.executable).with_name("parity-tracker"))
    env = {"PYTHONPATH": str(Path(__file__).parent), "MLFLOW_TRACKING_URI": mlflow_server,
           "PARITY_TRACKER_CACHE": str(tmp_path / "cache")}  # fmt: skip
    import os

    env = {**os.environ, **env}
    exp = request.node.name[:40]
    run = subprocess.run([exe, "run", TINY, "--experiment", exp, "--json"], cwd=tmp_path,
                         env=env, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)  # the whole stdout: exactly one document
    assert doc["passed"] is True and "View run" not in run.stdout + run.stderr
    args = [exe, "history", TINY, "--experiment", exp, "--tag", "checker_2", "--json"]
    hist = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert hist.returncode == 0, hist.stderr
    assert json.loads(hist.stdout)["points"][0]["run_id"] == doc["run_id"]
    assert json.loads(hist.stdout)["points"][0]["tag_status"] == "equal"
    assert len(list((tmp_path / "cache" / "tag_lists").glob("*.json"))) == 1  # from run tags
    again = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert json.loads(again.stdout) == json.loads(hist.stdout)


@pytest.mark.server
def test_kept_heads_equal_a_full_search_and_drop_deleted_runs(mlflow_server, tmp_path, request,
                                                              monkeypatch):  # fmt: skip
    from parity_tracker.track.query import RunHead, find_run_heads, find_runs
    from parity_tracker.track.store import get_client

    monkeypatch.setenv("PARITY_TRACKER_CACHE", str(tmp_path / "cache"))
    client = get_client(mlflow_server)
    exp = client.create_experiment(request.node.name[:60])
    name = client.get_experiment(exp).name

    def log(i, complete=True, target="t"):
        rid = client.create_run(exp, start_time=1_000 + i).info.run_id
        client.log_param(rid, "target", target)
        client.log_metric(rid, "tensors_failing", float(i % 2))
        if complete:
            client.set_tag(rid, "parity.complete", "true")
        return rid

    def both():
        full = [RunHead.from_info(i) for i in find_runs(tracking_uri=mlflow_server,
                                                         experiment=name, target="t")]  # fmt: skip
        kept = find_run_heads(tracking_uri=mlflow_server, experiment=name, target="t")
        return full, kept

    ids = [log(i) for i in range(5)] + [log(5, complete=False), log(6, target="other")]
    full, kept = both()
    assert kept == full and len(kept) == 6
    (heads_file,) = (tmp_path / "cache" / "heads").iterdir()
    assert len(json.loads(heads_file.read_text())["runs"]) == 5  # the incomplete run is not kept
    client.delete_run(ids[1])
    client.set_tag(ids[5], "parity.complete", "true")
    ids.append(log(7))
    full, kept = both()
    assert kept == full and len(kept) == 6 and ids[1] not in {h.run_id for h in kept}
    assert [h.start_time for h in kept] == sorted((h.start_time for h in kept), reverse=True)


def test_merge_from_another_directory_applies_the_expected_file_the_shards_used(
    night_env, monkeypatch
):
    """Main: the merge looked for ``expected.toml`` beside the shards' relative ``config``,
    found nothing from another directory and turned expected cells into failures (exit 1)."""
    cwd = night_env["cwd"]
    exp = cwd / "expected.toml"
    exp.write_text(f'[[expected]]\ntarget = "{TINY}"\ntag = "*"\nreason = "known"\n'
                   "until = 2099-12-31\n")  # fmt: skip
    for i in (1, 2):  # relative --config, as a user in their project directory
        res = invoke("nightly", "--config", "nightly.toml", "--shard", f"{i}/2", "--commit",
                     "a" * 40, "--night", "e1", "--fail-on", "mismatch", perturb=True)  # fmt: skip
        assert res.exit_code == 0, res.output  # every failing tag is expected
    (cwd / "elsewhere").mkdir()
    monkeypatch.chdir(cwd / "elsewhere")
    res = invoke("nightly-merge", "--night", "e1", "--fail-on", "mismatch", "--json")
    assert res.exit_code == 0, res.output
    cells = json.loads(res.stdout)["cells"]
    failing = [c for c in cells if c["tensors_failing"]]
    assert failing and all(c["unexpected_failing"] == 0 and c["expected_used"] for c in failing)
    # the file edited since the shards read it: refuse, naming the path and the fix
    exp.write_text(exp.read_text().replace("known", "edited"))
    res = invoke("nightly-merge", "--night", "e1", "--fail-on", "mismatch")
    assert res.exit_code == 2 and str(exp.resolve()) in res.output and "--expected" in res.output
    exp.unlink()
    res = invoke("nightly-merge", "--night", "e1", "--fail-on", "mismatch")
    assert res.exit_code == 2 and str(exp.resolve()) in res.output and "--expected" in res.output
    # a night whose shards used no expected file merges as before: its failures count
    for i in (1, 2):
        invoke("nightly", "--config", "../nightly.toml", "--shard", f"{i}/2", "--commit",
               "a" * 40, "--night", "e2", "--fail-on", "never", perturb=True)  # fmt: skip
    assert invoke("nightly-merge", "--night", "e2", "--fail-on", "mismatch").exit_code == 1


def test_history_heatmap_covers_every_commit_of_a_configuration_failing_since_before(
    night_env, monkeypatch
):
    """Main drew the heatmap from this night's diff only (one commit; none at all when the
    failing tags are ``unchanged``) and bannered "NO REGRESSION" over failing parity."""
    from test_dashboards import _Doc

    from dashboards.nightly import render_history
    from parity_tracker.pipeline.nightly import run_nightly
    from parity_tracker.statuses import is_failing
    from parity_tracker.track import load_run

    monkeypatch.setenv("PARITY_TEST_PERTURB", "fc2")
    seen = []

    def capture(result, pages):
        seen.append((result, pages))
        return {}

    for commit in ("a" * 40, "b" * 40):  # failing the same way at both commits
        run_nightly(night_env["cfg"], commit=commit, fail_on="never", render=capture)
    result, pages = seen[-1]
    failing_cells = [c for c in result.cells if c.tensors_failing]
    assert failing_cells
    for cell in failing_cells:
        assert not cell.changes.get("regression")  # unchanged since commit a
        runs = [r for r in pages.runs if r["fingerprint"] == cell.fingerprint]
        assert {r["commit"] for r in runs} == {"a" * 40, "b" * 40}
        # expected, from each stored run's modules table: tag -> failing at some step
        want = {}
        for r in runs:
            rows = load_run(r["run_id"]).modules.to_pylist()
            for tag in {x["tag"] for x in rows if is_failing(x["status"])}:
                want.setdefault(tag, set()).add(r["commit"])
        got = {}
        for row in pages.tag_status:
            if row["fingerprint"] == cell.fingerprint and is_failing(row["status"]):
                got.setdefault(row["tag"], set()).add(row["commit"])
        assert got == want and all(c == {"a" * 40, "b" * 40} for c in want.values())
    doc = _Doc(render_history(pages.runs, pages.tag_status))
    heat = [f for name, f in doc.figures.items() if name.startswith("heatmap")]
    assert heat and all(len(f["data"][0]["x"]) == 2 for f in heat)  # both commits
    assert "NO NEW REGRESSION — PARITY FAILS" in doc.text("verdict")


def test_history_and_diff_accept_the_module_function_spelling_the_run_was_given(night_env):
    """Main: `run mypairs:build` stored target "my-net" (the case's own setting), and
    `history mypairs:build` / `diff --target mypairs:build` exited 2 "no stored run"."""
    (night_env["cwd"] / "mypairs.py").write_text(
        "from cli_targets import tiny\n\n\n"
        "def build(settings):\n"
        "    case = tiny(settings)\n"
        '    case.settings = {"target": "my-net", **case.settings}\n'
        "    return case\n"
    )
    spec = "mypairs:build"
    ids = {}
    for commit, perturb in (("a" * 40, False), ("b" * 40, True)):
        res = invoke("run", spec, "--commit", commit, "--json", perturb=perturb)
        ids[commit] = json.loads(res.stdout)["run_id"]
    res = invoke("history", spec, "--json")
    assert res.exit_code == 0, res.output
    hist = json.loads(res.stdout)
    assert hist["target"] == "my-net"
    assert [p["run_id"] for p in hist["points"]] == [ids["a" * 40], ids["b" * 40]]
    res = invoke("diff", "--base-commit", "a" * 7, "--head-commit", "b" * 7, "--target", spec,
                 "--format", "json")  # fmt: skip
    assert res.exit_code == 1 and json.loads(res.stdout)["counts"]["regression"] > 0
    # nothing matches: the stored target names are listed
    res = invoke("history", "nosuch_target_xyz")
    assert res.exit_code == 2 and "stored targets: my-net" in res.output
    res = invoke("diff", "--base-commit", "a" * 7, "--head-commit", "b" * 7, "--target",
                 "nosuch_target_xyz")  # fmt: skip
    assert res.exit_code == 2 and "stored targets: my-net" in res.output


def test_python_loaders_take_a_unique_run_id_prefix(night_env):
    """Main: ``load_run('c1c58812')`` raised MlflowException (the CLI alone resolved prefixes)."""
    from parity_tracker.repro import reproduce_run
    from parity_tracker.track import load_run
    from parity_tracker.track.store import get_client

    run_id = json.loads(invoke("run", TINY, "--json").stdout)["run_id"]
    loaded = load_run(run_id[:8])
    assert loaded.tracking_run_id == run_id  # the full id the prefix names
    assert loaded.modules.equals(load_run(run_id).modules)
    client = get_client(night_env["uri"])
    exp = client.get_experiment_by_name("parity").experiment_id
    ids = [run_id] + [client.create_run(exp).info.run_id for _ in range(16)]
    first = next(c for c in "0123456789abcdef" if sum(i.startswith(c) for i in ids) > 1)
    matches = [i for i in ids if i.startswith(first)]
    for loader in (load_run, reproduce_run):
        with pytest.raises(InputError, match="ambiguous") as info:
            loader(first)
        assert sum(i in str(info.value) for i in matches) >= 2


def test_matrix_columns_follow_the_quantization_the_run_recorded(night_env):
    """Main: a cell whose matrix entry says only ``candidate=bf16`` while its case records
    ``quantization=bf16`` was drawn under the default column "quantization=none"."""
    from dashboards.nightly import _matrix_grid
    from parity_tracker.pipeline.night import merge_night
    from parity_tracker.pipeline.nightly import run_nightly
    from parity_tracker.track.query import RunStore

    (night_env["cwd"] / "mycand.py").write_text(
        "from cli_targets import tiny\n\n"
        'SETTINGS = {"candidate": ["engine", "bf16"]}\n\n\n'
        "def build(settings):\n"
        '    q = "bf16" if settings.get("candidate") == "bf16" else "none"\n'
        '    case = tiny({"quantization": q})\n'
        '    case.settings = {"quantization": q, "candidate": settings.get("candidate")}\n'
        "    return case\n"
    )
    cfg = night_env["cwd"] / "cand.toml"
    cfg.write_text('[[matrix]]\ntarget = "mycand:build"\ncandidate = ["engine", "bf16"]\n')
    seen = []

    def capture(result, pages):
        seen.append(pages)
        return {}

    run_nightly(cfg, commit="a" * 40, fail_on="never", night="q1", render=capture)
    merge_night("q1", RunStore(night_env["uri"]), fail_on="never", render=capture)
    for pages in seen:  # the shard's pages, then the merged night's
        grid = _matrix_grid(pages.cells)
        assert grid["quants"] == ["none", "bf16"]
        rows = {label: tds for label, tds in grid["rows"]}
        # the recorded quantization picks the column (the cell's own: none for engine)
        assert rows["mycand:build candidate=bf16"][0] is None
        assert rows["mycand:build candidate=bf16"][1] is not None
        assert rows["mycand:build candidate=engine"][1] is None
