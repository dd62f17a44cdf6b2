"""The cheaper budget passes (issue 19, item 6) give exactly what the plain ones gave.

- ``max_abs_err`` (one reused float64 scratch chunk, the floor's ``max |golden|`` read in the
  same pass) against numpy float64 of the widened sides, element by element, across chunk
  edges, for every real dtype and the non-finite rules of ``compare.budget``;
- ``capture.copies.cast_copy`` (the golden's and the twin's copies without a first copy at the
  reference's dtype) against ``copy.deepcopy`` + ``.double()`` / ``.to(dtype)``.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

import parity_tracker.compare.budget as budget
from parity_tracker.capture.copies import cast_copy
from parity_tracker.capture.golden import golden_copy
from parity_tracker.capture.twin import make_twin

SIDE_DTYPES = [
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.bool,
]


def _want(side: torch.Tensor, golden: torch.Tensor) -> tuple[float, int, float]:
    """``(max error, lost, largest finite |golden|)`` by numpy, the rule of compare.budget."""
    s = side.to(torch.float64).numpy().reshape(-1)  # widening is exact for these dtypes
    g = golden.numpy().reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(s - g)
    same = (s == g) | (np.isnan(s) & np.isnan(g))
    d[same] = 0.0
    bad = ~np.isfinite(d)
    lost = int(bad.sum())
    worst = math.inf if lost else (float(d.max()) if d.size else 0.0)
    finite = np.abs(g[np.isfinite(g)])
    return worst, lost, float(finite.max()) if finite.size else 0.0


def _golden(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, dtype=torch.float64, generator=gen) * 40


@pytest.mark.parametrize("dtype", SIDE_DTYPES)
@pytest.mark.parametrize("n", [0, 1, 6, 7, 8, 50])
def test_max_abs_err_matches_numpy_across_chunks(monkeypatch, dtype, n):
    monkeypatch.setattr(budget, "SCAN_CHUNK", 7)  # many chunks, a ragged last one
    golden = _golden(n, n)
    side = (golden * 1.01 + 0.3).to(dtype)
    got = budget.max_abs_err(side, golden, golden_max=True)
    worst, lost, top = _want(side, golden)
    assert (got.max_abs_err, got.lost, got.golden_max) == (worst, lost, top)
    assert got.dtype == dtype
    assert budget.max_abs_err(side, golden).golden_max is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_max_abs_err_non_finite_rules_match_numpy(monkeypatch, dtype):
    monkeypatch.setattr(budget, "SCAN_CHUNK", 4)
    golden = _golden(20, 3)
    golden[[1, 9, 14]] = torch.tensor([math.nan, math.inf, -math.inf], dtype=torch.float64)
    side = golden.to(dtype).clone()
    side[[2, 9, 17]] = torch.tensor([math.inf, math.inf, math.nan]).to(dtype)  # 2 lost
    side[14] = math.inf  # +inf where the golden is -inf: lost
    got = budget.max_abs_err(side, golden, golden_max=True)
    want = _want(side, golden)
    assert (got.max_abs_err, got.lost, got.golden_max) == want
    assert want[1] == 3 and want[0] == math.inf


def test_max_abs_err_only_non_finite_golden_has_zero_top():
    golden = torch.tensor([math.nan, math.inf], dtype=torch.float64)
    got = budget.max_abs_err(golden.float(), golden, golden_max=True)
    assert (got.max_abs_err, got.lost, got.golden_max) == (0.0, 0, 0.0)


def test_max_abs_err_non_contiguous_and_complex_sides():
    golden = _golden(60, 5).reshape(6, 10)
    side = golden.t().contiguous().t().to(torch.bfloat16)  # same values, transposed strides
    assert budget.max_abs_err(side, golden).max_abs_err == _want(side, golden)[0]
    zc = torch.complex(golden, -golden)
    cc = (zc * 1.001).to(torch.complex64)
    want = float(np.abs(cc.numpy().astype(np.complex128) - zc.numpy()).max())
    assert budget.max_abs_err(cc, zc, golden_max=True).max_abs_err == want


def test_floor_from_the_scan_equals_budget_floor(monkeypatch):
    monkeypatch.setattr(budget, "SCAN_CHUNK", 5)
    golden = _golden(33, 9)
    golden[31] = -900.0  # the largest magnitude, negative, in the last chunk
    golden[4] = math.inf
    cand, twin = (golden * 1.004).bfloat16(), golden.bfloat16()
    out = budget.budget_compare(golden, twin, cand, reference=golden.float())
    assert out.floor == budget.budget_floor(golden, 2.0**-7) == 2.0**-7 * 900.0


# --- cast_copy ----------------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight  # tied
        self.norm = nn.BatchNorm1d(4)  # float buffers and an int64 counter
        self.a.bias.requires_grad_(False)
        self.register_buffer("steps", torch.tensor([3, 4], dtype=torch.int32))

    def forward(self, x):
        return self.norm(self.b(self.a(x)))


def _same_module(got: nn.Module, want: nn.Module) -> None:
    gs, ws = got.state_dict(keep_vars=True), want.state_dict(keep_vars=True)
    assert list(gs) == list(ws)
    for name in gs:
        g, w = gs[name], ws[name]
        assert type(g) is type(w) and g.dtype == w.dtype and g.requires_grad == w.requires_grad
        assert torch.equal(g, w), name
    assert [type(m) for m in got.modules()] == [type(m) for m in want.modules()]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_cast_copy_equals_deepcopy_then_convert(dtype):
    net = _Net()
    net.norm.running_mean.uniform_(-1, 1)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    got = cast_copy(net, dtype)
    want = copy.deepcopy(net)
    want = want.double() if dtype == torch.float64 else want.to(dtype)
    _same_module(got, want)
    assert got.b.weight is got.a.weight  # tied weights stay one tensor
    assert got.steps.dtype == torch.int32 and got.norm.num_batches_tracked.dtype == torch.int64
    assert got.steps.data_ptr() != net.steps.data_ptr()  # integer buffers are copies too
    for name, v in net.state_dict().items():  # the original is untouched
        assert v.dtype == before[name].dtype and torch.equal(v, before[name])
    x = torch.randn(3, 4, dtype=dtype)
    with torch.no_grad():
        got.eval()(x)
    assert torch.equal(net.norm.running_mean, before["norm.running_mean"])


def test_cast_copy_falls_back_for_complex_and_parameter_subclasses():
    class Tagged(nn.Parameter):
        pass

    net = nn.Linear(3, 3)
    net.register_buffer("phase", torch.ones(3, dtype=torch.complex64))
    got = cast_copy(net, torch.float64)
    assert got.phase.dtype == torch.complex64  # .double() keeps complex, as golden_copy did
    _same_module(got, copy.deepcopy(net).double())
    grad = nn.Linear(3, 3)
    grad.register_buffer("scale", torch.ones(3, requires_grad=True))
    got = cast_copy(grad, torch.float64)
    want = copy.deepcopy(grad).double()
    assert got.scale.requires_grad and got.scale.grad_fn is not None  # as .double() leaves it
    assert want.scale.requires_grad and torch.equal(got.scale, want.scale)
    sub = nn.Linear(3, 3)
    sub.weight = Tagged(sub.weight.detach().clone())
    got = cast_copy(sub, torch.bfloat16)
    assert type(got.weight) is Tagged and got.weight.dtype == torch.bfloat16
    _same_module(got, copy.deepcopy(sub).to(torch.bfloat16))


def test_golden_and_twin_copies_use_it():
    net = _Net()
    golden, twin = golden_copy(net), make_twin(net, torch.bfloat16)
    _same_module(golden, copy.deepcopy(net).double())
    _same_module(twin, copy.deepcopy(net).to(torch.bfloat16))
    assert make_twin(net, torch.float32) is net


# --- a candidate bitwise equal to the twin reuses the twin's scan ------------------------------


def _cases():
    gen = torch.Generator().manual_seed(21)
    golden = torch.randn(5, 300, dtype=torch.float64, generator=gen) * 7
    golden[0, 3] = math.nan
    twin = golden.bfloat16()
    other = twin.clone()
    other[4, 299] = other[4, 299] * 1.5  # one element differs: no reuse
    lost = twin.clone()
    lost[2, 2] = math.inf  # loses a value the twin keeps
    return golden, twin, {"same": twin.clone(), "other": other, "lost": lost}


@pytest.mark.parametrize("which", ["same", "other", "lost"])
def test_reused_twin_scan_gives_the_same_record(monkeypatch, which):
    golden, twin, cands = _cases()
    cand, ref = cands[which], golden.float()
    scan = budget.side_error(golden, twin, digest=True)
    assert scan.side_hash is not None and scan.golden_max == float(
        np.nanmax(np.abs(golden.numpy()))
    )
    calls = []
    real = budget.max_abs_err
    monkeypatch.setattr(budget, "max_abs_err", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = budget.budget_compare(golden, scan, cand, reference=ref)
    assert len(calls) == (0 if which == "same" else 1)
    monkeypatch.setattr(budget, "max_abs_err", real)
    want = budget.budget_compare(golden, twin, cand, reference=ref)  # the twin as a tensor
    assert got == want
    # and against numpy (float64 of the widened sides, finite elements where both agree)
    worst, _, top = _want(cand, golden)
    assert (got.golden_max_abs_err, got.floor) == (worst, 2.0**-7 * top)
    assert got.status == ("close" if which == "same" else "mismatch")
