"""The run record (``RunSummary``): typed, frozen, versioned, strict JSON; the histogram of the
worst tensor computed in the run stage; no default write outside the temporary folder."""

from __future__ import annotations

import copy
import dataclasses
import json
import tempfile

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.errors import InputError
from parity_tracker.files.tables import SUMMARY_SCHEMA_VERSION
from parity_tracker.run import RunSummary, run_parity
from parity_tracker.run.histogram import diff_histogram


def _pair():
    """fc0 → relu → fc1: the candidate's fc0 is off by 1e-2 (the first divergence), its fc1
    by 1.0 (a far worse tensor later on)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    cand = copy.deepcopy(ref)
    with torch.no_grad():
        cand[0].weight += 1e-2
        cand[2].weight += 1.0
    return ref, cand, (torch.randn(6, 4, generator=torch.Generator().manual_seed(1)),)


@pytest.mark.parametrize("dump_mode", ["first_not_equal", "not"])
def test_failing_allclose_run_has_the_worst_tensor_histogram(dump_mode, tmp_path):
    ref, cand, inputs = _pair()
    result = run_parity(
        ref, cand, inputs, mode="allclose", dump_mode=dump_mode, dump_path=tmp_path / "d",
        environment={},
    )  # fmt: skip
    s = result.record
    assert not s.passed and s.first_divergence is not None
    assert s.worst_tensor is not None
    hist = s.worst_tensor_histogram
    assert hist is not None and hist["tag"] == s.worst_tensor.tag
    row = next(r for r in result.modules.to_pylist() if r["tag"] == s.worst_tensor.tag)
    numel = int(np.prod(row["cand_shape"]))
    assert hist["numel"] == numel
    assert sum(hist["counts"]) + hist["zero_count"] + hist["nonfinite"] == numel
    assert hist["edges"][-1] == pytest.approx(row["max_abs_diff"], rel=1e-6)
    # the worst is the lowest SQNR among mismatches (hand check over the table)
    mism = [r for r in result.modules.to_pylist() if r["status"] == "mismatch"]
    assert s.worst_tensor.sqnr_db == min(r["sqnr_db"] for r in mism)


def test_passing_run_has_no_worst_tensor(tmp_path):
    ref, _, inputs = _pair()
    result = run_parity(ref, copy.deepcopy(ref), inputs, dump_path=tmp_path, environment={})
    assert result.passed
    assert result.record.worst_tensor is None and result.record.worst_tensor_histogram is None


def test_record_round_trips_through_strict_json(tmp_path):
    ref, cand, inputs = _pair()
    result = run_parity(ref, cand, inputs, mode="allclose", dump_path=tmp_path, environment={})
    text = result.record.to_json()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert data["schema_version"] == SUMMARY_SCHEMA_VERSION
    assert RunSummary.from_json(text) == result.record
    # old readers: same keys as the untyped dict, readable as a mapping
    assert result.summary["tensors_failing"] == result.record.tensors_failing
    assert result.record["first_divergence"]["tag"] == result.record.first_divergence.tag


def test_record_is_frozen_and_summary_edits_do_not_leak(tmp_path):
    ref, cand, inputs = _pair()
    result = run_parity(ref, cand, inputs, mode="allclose", dump_path=tmp_path, environment={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.record.passed = True  # type: ignore[misc]
    result.summary["passed"] = True
    assert result.passed is False
    newer = result.record.replace(environment={"git_commit": "abc"})
    assert newer.environment == {"git_commit": "abc"} and result.record.environment == {}


def test_non_finite_values_are_written_as_strings():
    # issue 13: one rule for every JSON writer (files.jsonio): "nan", "inf", "-inf"
    s = RunSummary(run_id="r", status="completed", passed=True, mode="equal")
    text = s.replace(output_max_abs_diff=float("nan"), output_sqnr_db=float("-inf")).to_json()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON: {c}"))
    assert data["output_max_abs_diff"] == "nan" and data["output_sqnr_db"] == "-inf"


def test_v0_summary_migrates_and_keeps_unknown_keys():
    v0 = {"run_id": "r", "status": "completed", "passed": False, "mode": "allclose",
          "worst_tensor_histogram": {"tag": "checker_fc", "step": 0, "counts": [1]},
          "expected": "known"}  # fmt: skip
    s = RunSummary.from_dict(v0)
    assert s.schema_version == SUMMARY_SCHEMA_VERSION
    assert s.worst_tensor.tag == "checker_fc"
    assert s.extra == {"expected": "known"} and s.to_dict()["expected"] == "known"


def test_newer_summary_version_is_refused():
    with pytest.raises(InputError, match="newer"):
        RunSummary.from_dict(
            {"run_id": "r", "status": "completed", "passed": True, "mode": "equal",
             "schema_version": SUMMARY_SCHEMA_VERSION + 1}
        )  # fmt: skip


def test_diff_histogram_against_hand_counts():
    hist = diff_histogram(np.zeros(4), np.array([0.0, 1e-3, 1e-2, np.inf]), bins=1)
    assert hist["zero_count"] == 1 and hist["nonfinite"] == 1
    assert hist["counts"] == [2] and hist["edges"] == [1e-3, 1e-2]


def test_default_dump_goes_to_the_temp_folder(tmp_path, monkeypatch):
    """No dump_path: the dump lands under the system temp folder, never under the cwd."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir(), tmp.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    ref, cand, inputs = _pair()
    result = run_parity(ref, cand, inputs, mode="allclose", environment={})
    assert result.dump_dir is not None and result.dump_dir.is_relative_to(tmp)
    assert list(cwd.iterdir()) == []
