"""A budget run makes three forwards: golden, twin (its reference side), candidate.

Issue 15 defines a budget run by three sides; issue 19 (measurement 7) prices it against three
plain forwards. Amended 2026-12-01 (``run.budget``): whenever a twin model runs, it is the run's
reference side, so the user's fp32 reference model only builds the golden and the twin, and the
reference-vs-candidate columns compare the candidate with PyTorch at the candidate's precision.

Expected values are computed independently of the product: plain ``copy.deepcopy(...)`` models
cast with ``.double()`` / ``.bfloat16()`` (the test model has no in-forward casts, so a plain
float64 copy is its golden), captured by the test's own forward hooks, reduced with numpy in
float64. Each test fails on the four-forward code (main at ed626ba): there the user's reference
forward runs, rows compare with the fp32 reference (``close``, not ``equal``), and a shared
module is refused only after the golden forward.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.errors import InputError
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode
from tests.test_budget import Net, capture, engine
from tests.test_budget_run import ENV, _cast_inputs, _run

BF16_EPS = 2.0**-7  # bfloat16 keeps 8 significant bits (7 stored)
K = 2.0  # the default budget factor (FlashAttention's tests)


def _outputs(result) -> dict[str, dict]:
    """Output rows by module name (``""`` for the root), as ``capture`` names them."""
    rows = {}
    for r in result.modules.to_pylist():
        if r["kind"] == "output":
            rows["output" if r["module"] in ("", "model") else r["module"]] = r
    return rows


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


@pytest.fixture(scope="module")
def net_and_input():
    torch.manual_seed(0)
    return Net().eval(), torch.randn(2, 3, 16, 16)


def _dtype_of(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


def test_the_reference_forward_never_runs_and_each_side_runs_once(net_and_input):
    reference, x = net_and_input
    reference = copy.deepcopy(reference)
    candidate = _cast_inputs(copy.deepcopy(reference).bfloat16(), torch.bfloat16)
    calls: list[str] = []

    def count(module, args):  # copied into the golden and the twin with the reference
        if module is reference:
            calls.append("reference")
        elif module is candidate:
            calls.append("candidate")
        else:  # a copy: the golden computes in float64, the twin in bfloat16
            calls.append({torch.float64: "golden", torch.bfloat16: "twin"}[_dtype_of(module)])

    handles = [m.register_forward_pre_hook(count) for m in (reference, candidate)]
    try:
        result = _run(reference, candidate, x)
    finally:
        for h in handles:
            h.remove()
    assert result.summary["mode"] == "budget" and result.summary["status"] == "completed"
    assert sorted(calls) == ["candidate", "golden", "twin"]  # main: + "reference"
    assert result.settings["reference_side"].startswith("twin (the reference at bfloat16")
    assert "reference_side: twin" in result.summary["mode_reason"]
    from dashboards.report import render_run_report  # the verdict bar names the reference side

    assert "reference side: twin (the reference at bfloat16" in render_run_report(result)


def test_a_pure_bf16_cast_is_equal_to_pytorch_at_bf16(net_and_input):
    reference, x = net_and_input
    candidate = _cast_inputs(copy.deepcopy(reference).to(torch.bfloat16), torch.bfloat16)
    rows = _outputs(_run(reference, candidate, x))
    assert len(rows) == 7  # conv1, norm1, conv2, norm2, fc1, fc2 and the root
    assert {r["status"] for r in rows.values()} == {"equal"}  # main: close (vs fp32)
    assert all(r["max_abs_diff"] == 0.0 for r in rows.values())


def _independent(reference: Net, candidate: nn.Module, x: torch.Tensor):
    """Golden, twin and candidate outputs per module, each model built here by hand."""
    golden = capture(copy.deepcopy(reference).double(), x.double())
    twin = capture(copy.deepcopy(reference).bfloat16(), x.bfloat16())
    cand = capture(candidate, x)
    return golden, twin, cand


def test_rows_compare_the_candidate_with_the_twin_and_keep_the_budget_columns(net_and_input):
    reference, x = net_and_input
    candidate = _cast_inputs(engine(reference, norm2_eps=5e-3), torch.bfloat16)
    golden, twin, cand = _independent(reference, candidate, x)
    rows = _outputs(_run(reference, candidate, x))
    assert set(rows) == set(golden)
    for name, row in rows.items():
        g, t, c = _np(golden[name]), _np(twin[name]), _np(cand[name])
        e_c, e_t = np.abs(c - g).max(), np.abs(t - g).max()
        ratio = e_c / max(e_t, BF16_EPS * np.abs(g).max())
        assert row["max_abs_diff"] == np.abs(c - t).max(), name  # main: |c - fp32 reference|
        assert row["golden_max_abs_err"] == pytest.approx(e_c, rel=1e-12, abs=0)
        assert row["twin_max_abs_err"] == pytest.approx(e_t, rel=1e-12, abs=0)
        assert row["error_ratio"] == pytest.approx(ratio, rel=1e-12, abs=0)
        bitwise = torch.equal(cand[name], twin[name])
        want = "mismatch" if ratio > K else ("equal" if bitwise else "close")
        assert row["status"] == want, name
    # the hand-injected eps bug is over budget there and only from there on
    assert rows["norm2"]["status"] == "mismatch" and rows["conv1"]["status"] == "equal"


class Transposed(nn.Module):
    """Linear → tanh → Linear; the candidate returns its output transposed (``align`` fixes)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.transpose = nn.Linear(8, 16), nn.Linear(16, 5), False

    def forward(self, x):
        y = self.b(torch.tanh(self.a(x)))
        return y.T if self.transpose else y


def test_align_applies_to_the_twin_as_reference_side():
    torch.manual_seed(6)
    reference, x = Transposed().eval(), torch.randn(4, 8)
    candidate = _cast_inputs(copy.deepcopy(reference).bfloat16(), torch.bfloat16)
    candidate.transpose = True

    def align(tag, ref, cand):
        return (ref, cand.T) if ref.shape != cand.shape else None

    golden = _np(copy.deepcopy(reference).double()(x.double()).detach())
    twin = _np(copy.deepcopy(reference).bfloat16()(x.bfloat16()).detach())
    rows = _outputs(_run(reference, candidate, x, align=align))
    out = rows["output"]
    e_t = np.abs(twin - golden).max()
    ratio = e_t / max(e_t, BF16_EPS * np.abs(golden).max())
    assert out["status"] == "equal" and out["max_abs_diff"] == 0.0  # main: close
    assert out["twin_max_abs_err"] == pytest.approx(e_t, rel=1e-12, abs=0)
    assert out["error_ratio"] == pytest.approx(ratio, rel=1e-12, abs=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_shared_module_is_refused_before_the_golden_forward(net_and_input, dtype):
    reference, x = net_and_input
    reference = copy.deepcopy(reference)
    candidate = copy.deepcopy(reference).to(dtype)
    candidate.fc1 = reference.fc1  # the candidate holds one of the reference's modules
    calls: list[torch.dtype] = []
    hook = reference.conv1.register_forward_pre_hook(lambda m, a: calls.append(_dtype_of(m)))
    try:
        with pytest.raises(InputError, match=r"shares module objects .*fc1") as err:
            _run(reference, candidate, x)
    finally:
        hook.remove()
    assert err.value.exit_code == 2
    assert calls == []  # main: [torch.float64]: the golden copy's conv1 ran first


class SelfCasting(nn.Module):
    """Casts its input to its own weights' dtype (a drive's float32 tensors reach any copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 12), nn.Linear(12, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x.to(self.a.weight.dtype))))


def test_a_drive_runs_golden_twin_and_candidate_once_per_step_and_never_the_reference():
    torch.manual_seed(7)
    reference = SelfCasting().eval()
    candidate = copy.deepcopy(reference).bfloat16()
    xs = [torch.randn(5, 6), torch.randn(5, 6) * 3]
    calls: list[tuple[str, int]] = []

    def drive(model, rec):
        for step, x in enumerate(xs):
            rec(step)
            model(x)

    def count(module, args):
        side = "reference" if module is reference else "candidate" if module is candidate else None
        side = side or {torch.float64: "golden", torch.bfloat16: "twin"}[_dtype_of(module)]
        calls.append((side, len(calls)))

    handles = [m.register_forward_pre_hook(count) for m in (reference, candidate)]
    try:
        result = run_parity(reference, candidate, drive=drive, mode="budget", environment=ENV,
                            dump_mode=DumpMode.NOT)  # fmt: skip
    finally:
        for h in handles:
            h.remove()
    sides = [side for side, _ in calls]
    assert sides == ["golden"] * 2 + ["twin"] * 2 + ["candidate"] * 2  # main: + reference × 2
    twin = copy.deepcopy(reference).bfloat16()  # built here: PyTorch at bf16
    roots = {r["step"]: r for r in result.modules.to_pylist() if r["tag"] == "checker_model"}
    for step, x in enumerate(xs):
        with torch.no_grad():
            diff = np.abs(_np(candidate(x)) - _np(twin(x))).max()
        assert roots[step]["max_abs_diff"] == diff == 0.0 and roots[step]["status"] == "equal"


def test_a_twin_forward_that_raises_is_the_reference_sides_failure():
    """A drive feeding float32 into the bf16 twin raises inside its forward: the run is kept
    (status ``failed``, the error on the reference side, the twin); main raised out of
    ``run_parity`` from its separate twin pass."""
    torch.manual_seed(8)
    reference = nn.Sequential(nn.Linear(4, 4), nn.Tanh()).eval()
    candidate = copy.deepcopy(reference).bfloat16()

    def drive(model, rec):
        rec(0)
        model(torch.ones(2, 4))  # float32 whatever the model's dtype

    result = run_parity(reference, candidate, drive=drive, mode="budget", environment=ENV,
                        dump_mode=DumpMode.NOT)  # fmt: skip
    error = result.summary["error"]
    assert result.summary["status"] == "failed" and not result.passed
    assert error["side"] == "reference" and error["type"] == "RuntimeError"
    assert "reference_side: twin (the reference at bfloat16" in result.summary["mode_reason"]
