"""Root-cause cases and their reproducers against independently known truths (wave 4).

- Case A ("the kernel differs") needs bitwise-equal inputs: an op whose inputs only pass
  allclose is case B (the difference is already in its inputs: look upstream), both in the ops
  table and in the reproducer's replay.
- An op fed by a copy/conversion that ran on one side only (a candidate-only ``_to_copy``,
  as in llama bf16's rotary embedding) names that producer instead of blaming its kernel.
- A reproducer's README names the MLflow run it comes from once, and its case once.

The expected values are worked out from the models' construction (numpy in float32, and a
numpy bfloat16 rounding), never read from the code under test.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.files import repro_lib
from parity_tracker.repro.command import reproducer_from_material
from parity_tracker.run import run_parity

D = 1e-6  # the candidate's offset: well inside fp32 allclose (atol 1e-5)


class Cancel(nn.Module):
    """``((x + d) - x) * 1e6``: a difference d inside tolerance, amplified past it by the mul."""

    def __init__(self, d: float) -> None:
        super().__init__()
        self.d = d

    def forward(self, x):
        return ((x + self.d) - x) * 1e6


class Scale(nn.Module):
    """``x * w``; ``cast=True`` keeps ``w`` in bfloat16 and converts it with ``.float()``."""

    def __init__(self, w: torch.Tensor, cast: bool) -> None:
        super().__init__()
        self.cast = cast
        self.register_buffer("w", w.to(torch.bfloat16) if cast else w.clone())

    def forward(self, x):
        return x * (self.w.float() if self.cast else self.w)


def _x() -> torch.Tensor:
    return torch.linspace(0.25, 0.5, 16)


def _bf16_round(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 -> float32 by round-to-nearest-even on the bits (no torch)."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return r.astype(np.uint32).view(np.float32)


def _rows(result) -> dict[str, dict]:
    return {r["tag"]: r for r in result.ops.to_pylist()}


def _kept(result) -> dict:
    return json.loads((result.dump_dir / "repro" / "kept.json").read_text())


def _replay_message(folder) -> str:
    with pytest.raises(AssertionError) as err:
        repro_lib.check_op(folder)
    return str(err.value)


def _cancel_run(tmp_path):
    return run_parity(
        Cancel(0.0), Cancel(D), (_x(),), mode="allclose", capture_ops=True,
        dump_path=tmp_path / "dump", environment={},
    )  # fmt: skip


def test_inputs_that_only_pass_allclose_are_case_b_not_a(tmp_path):
    result = _cancel_run(tmp_path)
    rows = _rows(result)
    # the offset enters at add and stays inside tolerance through sub: no root cause there
    assert rows["model@0::add#0"]["status"] == "close"
    assert rows["model@0::sub#0"]["status"] == "close"
    mul = rows["model@0::mul#0"]
    assert mul["status"] == "mismatch" and mul["inputs_status"] == "passing"
    assert (mul["root_cause"], mul["cause"]) == (True, "B")
    assert "not bitwise equal" in mul["message"] and "look upstream" in mul["message"]
    assert "case A" not in mul["message"] and "kernel differs" not in mul["message"]
    assert [rc["cause"] for rc in result.summary["root_causes"]] == ["B"]


def test_case_b_reproducer_replay_names_the_input_difference(tmp_path):
    result = _cancel_run(tmp_path)
    item = _kept(result)["items"][0]
    assert (item["tag"], item["cause"]) == ("model@0::mul#0", "B")
    folder = reproducer_from_material(result.dump_dir / "repro", None, tmp_path / "r", "run-x")
    message = _replay_message(folder.path)
    # independent: the mul's input 0 is (x + d) - x in float32 on the candidate, 0 on the
    # reference; PyTorch's mul by 1e6 of the candidate's input is the candidate's output
    x = _x().numpy()
    want = float(np.max(np.abs((x + np.float32(D)) - x)))
    assert want > 0.0
    found = re.search(r"value \(input 0: not bitwise equal, max abs diff ([^)]+)\)", message)
    assert found is not None, message
    assert float(found.group(1)) == pytest.approx(want, rel=1e-6)
    assert "gives the candidate's output" in message
    assert "kernel differs" not in message


def test_bitwise_equal_inputs_with_another_result_stay_case_a(tmp_path):
    class Mul(nn.Module):
        def __init__(self, k: float) -> None:
            super().__init__()
            self.k = k

        def forward(self, x):
            return (x + 0.0) * self.k

    result = run_parity(Mul(3.0), Mul(3.5), (_x(),), mode="allclose", capture_ops=True,
                        dump_path=tmp_path / "d", environment={})  # fmt: skip
    mul = _rows(result)["model@0::mul#0"]
    assert _rows(result)["model@0::add#0"]["status"] == "equal"
    assert (mul["root_cause"], mul["cause"]) == (True, "A")
    assert mul["message"].startswith("root cause (case A): inputs bitwise equal")
    folder = reproducer_from_material(result.dump_dir / "repro", None, tmp_path / "r", "run-y")
    assert "kernel differs (bitwise-equal inputs" in _replay_message(folder.path)


def test_op_fed_by_a_candidate_only_to_copy_names_it(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(16)
    x = _x()
    result = run_parity(Scale(w, False), Scale(w, True), (x,), capture_ops=True,
                        dump_path=tmp_path / "d", environment={})  # fmt: skip
    rows = _rows(result)
    assert rows["model@0::_to_copy#0"]["status"] == "missing_reference"
    mul = rows["model@0::mul#0"]
    assert mul["status"] == "mismatch"
    assert (mul["root_cause"], mul["cause"]) == (True, "B")
    assert (
        "input 1 comes from model@0::_to_copy#0, which ran on the candidate side only "
        "(missing_reference)"
    ) in mul["message"]
    assert "case A" not in mul["message"] and "kernel" not in mul["message"].split(";")[-1]
    (rc,) = result.summary["root_causes"]
    assert (rc["tag"], rc["cause"]) == ("model@0::mul#0", "B")
    # the replay sees the conversion's rounding: |w - bf16(w)|, by hand on the bits
    folder = reproducer_from_material(result.dump_dir / "repro", None, tmp_path / "r", "run-z")
    message = _replay_message(folder.path)
    want = float(np.max(np.abs(w.numpy() - _bf16_round(w.numpy()))))
    found = re.search(r"value \(input 1: not bitwise equal, max abs diff ([^)]+)\)", message)
    assert found is not None and float(found.group(1)) == pytest.approx(want, rel=1e-6)
    assert "kernel differs" not in message
    readme = (folder.path / "README.md").read_text()
    assert "Root cause (case B): a copy/conversion that ran on one side only" in readme
    assert readme.lower().count("root cause (case") == 1


@pytest.mark.slow
def test_readme_names_the_stored_run_once_and_its_case_once(tmp_path, sqlite_tracking_uri):
    from parity_tracker.repro import reproduce_run
    from parity_tracker.track import log_run

    result = _cancel_run(tmp_path)
    run_id = log_run(result, tracking_uri=sqlite_tracking_uri)
    assert run_id != result.run_id  # the MLflow id is not the parity run id
    rep = reproduce_run(run_id, out=tmp_path / "out", tracking_uri=sqlite_tracking_uri)
    text = (rep.path / "README.md").read_text()
    (header,) = [line for line in text.splitlines() if line.startswith("From ")]
    assert header.count(run_id) == 1 and result.run_id not in header
    assert text.count(run_id) == 1
    assert text.lower().count("root cause (case") == 1
    assert "Root cause (case B): input(s) 0 pass allclose but are not bitwise equal" in text
    assert run_id in (rep.path / "test_repro.py").read_text()
    assert json.loads((rep.path / "repro.json").read_text())["tracking_run_id"] == run_id
