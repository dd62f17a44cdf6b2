"""Where a run's dumps go and when they are removed (wave 4): no orphaned temporary data.

``run_parity`` dumps under ``<tempdir>/parity-dumps/<parity run id>`` when no ``dump_path`` is
given; ``pipeline.run_target`` (the CLI, the nightly) removes that folder once the tensors are
stored (uploaded to MLflow or copied into the spool) and says where they are; a crash before
they are stored leaves them on disk. Every test points the system temporary folder into
``tmp_path`` and runs in it, so nothing is written anywhere else.

The worst-tensors table states its order (``compare.verdict.WORST_ORDER``), checked against
rows whose two criteria disagree.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from markupsafe import escape

from parity_tracker.cli import cli
from parity_tracker.compare.verdict import WORST_ORDER, worst_tensors

TINY = "cli_targets:tiny"


@pytest.fixture
def env(in_tmp_cwd, sqlite_tracking_uri, monkeypatch):
    tmp = in_tmp_cwd / "systemp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_tracking_uri)
    monkeypatch.delenv("PARITY_TEST_PERTURB", raising=False)
    return {"uri": sqlite_tracking_uri, "cwd": in_tmp_cwd, "dumps": tmp / "parity-dumps"}


def _invoke(*args):
    env = {"PARITY_TEST_PERTURB": "fc2"}
    return CliRunner().invoke(cli, ["run", TINY, *args], env=env, catch_exceptions=False)


def _leftovers(root: Path) -> list[Path]:
    return sorted(root.rglob("*")) if root.exists() else []


def _candidate_fc2_output() -> np.ndarray:
    """Linear(2) of the perturbed candidate on the target's input, computed here directly."""
    from cli_targets import _model

    cand = _model()
    with torch.no_grad():
        cand[2].weight.add_(1e-3)
        x = torch.linspace(-1, 1, 24).reshape(3, 8)
        return cand[2](cand[1](cand[0](x))).numpy()


def test_logged_run_keeps_its_tensors_in_mlflow_and_removes_the_temp_folder(env, tmp_path):
    from parity_tracker.track.artifacts import download_folder

    res = _invoke("--json")
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    run_id = out["run_id"]
    assert f"logged as tensors/ of MLflow run {run_id}" in out["dumps"]
    assert "temporary folder" in out["dumps"] and out["dumps"].endswith("removed")
    assert str(env["dumps"]) in out["dumps"]
    assert not env["dumps"].exists()  # the run's folder, then the emptied root
    # nothing lost: the candidate's fc2 output is in the run's tensors/ artifacts
    got = download_folder(run_id, "tensors", tmp_path / "dl", tracking_uri=env["uri"])
    assert got is not None
    entries = json.loads((got / "index.json").read_text())["files"]
    (entry,) = [e for e in entries if e["tag"] == "checker_2" and e["side"] == 1]
    np.testing.assert_array_equal(np.load(got / entry["file"]), _candidate_fc2_output())


def test_text_output_says_where_dumps_went_and_how_worst_tensors_are_sorted(env):
    res = _invoke()
    assert res.exit_code == 1, res.output
    flat = " ".join(res.stdout.split())
    assert "dumped tensors logged as tensors/ of MLflow run" in flat
    assert f"sorted by: {' '.join(WORST_ORDER.split())}" in flat
    assert _leftovers(env["dumps"]) == []


def test_spooled_run_keeps_a_copy_in_the_spool_and_removes_the_temp_folder(env):
    res = _invoke("--tracking-uri", "http://127.0.0.1:9", "--json")  # the CLI's Error line
    assert res.exit_code == 3  # says where it was spooled; no Python warning repeats it
    out = json.loads(res.stdout)
    (spooled,) = (env["cwd"] / ".parity" / "spool").iterdir()
    tensors = spooled / "artifacts" / "tensors"
    assert f"spooled with the run under {tensors}" in out["dumps"]
    assert (tensors / "index.json").is_file() and list(tensors.glob("*.npy"))
    assert _leftovers(env["dumps"]) == []


def test_a_crash_while_logging_leaves_the_dump_on_disk(env, monkeypatch):
    import parity_tracker.track as track
    from parity_tracker.pipeline.run_target import run_target

    def crash(*args, **kwargs):
        raise RuntimeError("the process died while logging")

    monkeypatch.setattr(track, "log_run", crash)
    monkeypatch.setenv("PARITY_TEST_PERTURB", "fc2")
    with pytest.raises(RuntimeError, match="died while logging"):
        run_target(TINY, {}, tracking_uri=env["uri"])
    (run_dir,) = env["dumps"].iterdir()
    (check,) = run_dir.glob("check-*")
    entries = json.loads((check / "index.json").read_text())["files"]
    assert any(e["tag"] == "checker_2" and e["side"] == 1 for e in entries)
    assert all((check / e["file"]).is_file() for e in entries if "file" in e)


def test_unlogged_run_and_caller_chosen_folder_are_kept(env, tmp_path):
    import cli_targets

    from parity_tracker.pipeline.run_target import run_target
    from parity_tracker.run.dumps import discard_default_dump

    done = run_target(TINY, {"perturb": "fc2"}, log=False)
    assert done.dumps == f"dumped tensors kept in {done.result.dump_dir} (the run was not stored)"
    assert done.result.dump_dir.is_dir() and list(done.result.dump_dir.glob("*.npy"))
    case = cli_targets.tiny({"perturb": "fc2"})
    from parity_tracker.run import run_parity

    mine = run_parity(case.reference, case.candidate, case.inputs, dump_path=tmp_path / "mine",
                      environment={})  # fmt: skip
    assert discard_default_dump(mine) is None and mine.dump_dir.is_dir()


def test_worst_order_caption_matches_the_order():
    rows = [
        {"tag": "big_diff_high_sqnr", "status": "mismatch", "sqnr_db": 40.0, "max_abs_diff": 5.0},
        {"tag": "shape", "status": "shape_mismatch", "sqnr_db": None, "max_abs_diff": None},
        {"tag": "small_diff_low_sqnr", "status": "mismatch", "sqnr_db": 3.0, "max_abs_diff": 0.1},
        {"tag": "tie_bigger", "status": "mismatch", "sqnr_db": 40.0, "max_abs_diff": 7.0},
    ]
    # by the caption: mismatches by lowest SQNR (3 dB before 40 dB although 0.1 < 5.0), the
    # 40 dB tie by the larger max |Δ| (7.0 first), then the shape mismatch
    assert [r["tag"] for r in worst_tensors(rows)] == [
        "small_diff_low_sqnr", "tie_bigger", "big_diff_high_sqnr", "shape",
    ]  # fmt: skip
    assert WORST_ORDER.index("lowest SQNR") < WORST_ORDER.index("largest max |Δ|")


def test_report_states_the_worst_tensor_order(tmp_path):
    import cli_targets

    from parity_tracker.dashboards.report import render_run_report
    from parity_tracker.run import run_parity

    case = cli_targets.tiny({"perturb": "fc2"})
    result = run_parity(case.reference, case.candidate, case.inputs, dump_path=tmp_path / "d",
                        environment={})  # fmt: skip
    html = render_run_report(result)
    assert f"sorted by: {escape(WORST_ORDER)}" in html
