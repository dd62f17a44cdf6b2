"""The bulk comparison of small pairs (compare/batch.py, issue 19) against compare_tensors.

``compare_small`` must give, for every bitwise-identical pair, the very record
``compare_tensors`` gives (every field), and ``None`` for every pair that is not bitwise
identical (compared alone by the caller). Whether a pair is identical is decided here
independently, from the numpy bytes. The checker's bulk path (``capture.holder``) must give the
same results and the same ``on_compared`` calls as the per-pair path, and keep the values of
capture time when the live candidate is written afterwards.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from parity_tracker.capture import holder as holder_module
from parity_tracker.compare import batch
from parity_tracker.compare.batch import bulk_eligible, compare_small
from parity_tracker.compare.core import compare_tensors
from parity_tracker.compare.finite import DOT_FINITE_MIN, _all_finite
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.statuses import is_passing
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.complex64,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
]
#: what the candidate is made of: a copy, or a copy with one kind of change
CHANGES = ["same", "ulp", "nan_same", "nan_one", "neg_zero", "inf_same", "inf_one", "flip"]


def _values(g: np.random.Generator, n: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.from_numpy(g.integers(0, 2, n).astype(bool))
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.from_numpy(g.integers(-100, 100, n)).to(dtype)
    return torch.from_numpy(g.standard_normal(n) * 3).to(dtype)


def _changed(ref: torch.Tensor, change: str, at: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(reference, candidate) with ``change`` applied at flat index ``at`` (if it applies)."""
    r, c = ref.clone().reshape(-1), ref.clone().reshape(-1)
    floaty = ref.dtype.is_floating_point or ref.dtype.is_complex
    if r.numel() == 0 or change == "same":
        pass
    elif not floaty or ref.dtype.is_complex:
        if change == "flip":
            c[at] = (~c[at]) if ref.dtype == torch.bool else c[at] + 1
        elif floaty and change in ("nan_same", "inf_same"):
            v = math.nan if change == "nan_same" else math.inf
            r[at] = c[at] = complex(v, 0.0)
    elif change == "ulp":
        c[at] = torch.nextafter(c[at], torch.tensor(math.inf, dtype=ref.dtype))
    elif change in ("nan_same", "inf_same"):
        r[at] = c[at] = math.nan if change == "nan_same" else -math.inf
    elif change in ("nan_one", "inf_one"):
        c[at] = math.nan if change == "nan_one" else math.inf
    elif change == "neg_zero":
        r[at], c[at] = 0.0, -0.0
    elif change == "flip":
        c[at] = c[at] + 1
    return r.reshape(ref.shape), c.reshape(ref.shape)


@st.composite
def pairs(draw):
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=3)))
    dtype = draw(st.sampled_from(DTYPES))
    n = math.prod(shape)
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ref = _values(g, n, dtype).reshape(shape)
    change = draw(st.sampled_from(CHANGES))
    r, c = _changed(ref, change, draw(st.integers(0, max(n - 1, 0))))
    if len(shape) >= 2 and draw(st.booleans()):  # non-contiguous: a transposed view
        r, c = r.transpose(0, 1), c.transpose(0, 1)
    return r, c


def _bytes(t: torch.Tensor) -> bytes:
    """The C-order bytes of ``t`` read by numpy (independent of the code under test)."""
    return np.ascontiguousarray(t.numpy()).tobytes()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(pairs(), min_size=1, max_size=12),
    st.sampled_from(["equal", "allclose"]),
    st.booleans(),
)
def test_compare_small_gives_compare_tensors_record_for_identical_pairs(items, mode, override):
    tags = [f"m{i}.output" for i in range(len(items))]
    tol = Tolerances({"m1.*": (0.5, 0.25)} if override else {})
    refs, cands = [r for r, _ in items], [c for _, c in items]
    assert all(bulk_eligible(r, c) for r, c in items)
    out = compare_small(refs, cands, tags, mode, tol)
    assert len(out) == len(items)
    for (r, c), tag, got in zip(items, tags, out, strict=True):
        identical = _bytes(r) == _bytes(c)
        if not identical:
            assert got is None  # never a record for contents that differ
            continue
        assert got is not None
        want = compare_tensors(r, c, mode=mode, tag=tag, tolerances=tol)
        assert got.to_dict() == want.to_dict()
        assert got.status == "equal"
        floaty = r.dtype.is_floating_point or r.dtype.is_complex
        nan = int(np.isnan(r.numpy()).sum()) if floaty else 0
        assert got.ref_nan == got.cand_nan == nan


def test_compare_small_hand_worked_records():
    a = torch.tensor([[1.0, -2.0], [math.nan, math.inf]])
    z = torch.zeros(0, 3)
    s = torch.tensor(7, dtype=torch.int32)
    out = compare_small([a, z, s], [a.clone(), z.clone(), s.clone()], [None] * 3, "allclose")
    assert [o.status for o in out] == ["equal"] * 3
    assert (out[0].ref_nan, out[0].ref_inf, out[0].cand_nan, out[0].cand_inf) == (1, 1, 1, 1)
    assert (out[0].rtol, out[0].atol) == (1.3e-6, 1e-5)  # torch.testing float32 defaults
    assert out[1].numel == 0 and out[1].ref_shape == (0, 3)
    assert (out[2].rtol, out[2].atol, out[2].max_ulp) == (0.0, 0.0, None)  # integers: exact
    # one ULP apart, and -0.0 against 0.0: not bitwise identical, left to the caller
    b = torch.tensor([1.0, 0.0])
    c = torch.tensor([float(np.nextafter(np.float32(1), np.float32(2))), 0.0])
    d = torch.tensor([1.0, -0.0])
    assert compare_small([b, b], [c, d], ["x", "y"], "equal") == [None, None]


def test_bulk_eligible_rejects_what_the_bulk_cannot_read():
    x = torch.zeros(4)
    assert bulk_eligible(x, x.clone())
    assert not bulk_eligible(x, x.double())  # dtypes differ
    assert not bulk_eligible(x, x.reshape(2, 2))  # shapes differ
    assert not bulk_eligible(x.bfloat16(), x.bfloat16())  # no numpy dtype
    assert not bulk_eligible(x, 1.0)
    big = torch.zeros(batch.BULK_MAX_BYTES // 4 + 1)
    assert not bulk_eligible(big, big.clone())
    cx = torch.zeros(2, dtype=torch.complex64)
    assert not bulk_eligible(cx, cx.conj())


class _Block(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        y = self.norm(self.lin(x))
        return y.float().mean(-1, keepdim=True).expand_as(y) + y.t().t()


class _Writes(nn.Module):
    """Blocks whose outputs the parent writes in place after they were captured."""

    def __init__(self, noise: float = 0.0, nan: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(3))
        self.noise, self.nan = noise, nan

    def forward(self, x):
        for i, b in enumerate(self.blocks):
            y = b(x)
            if self.nan and i == 1:
                y[0, 0] = math.nan
            elif self.noise and i == 2:
                y = y + self.noise
            x = y.clone()
            y.mul_(0)  # counted write after capture
            y.numpy()[...] = 5  # uncounted write after capture
        return x.to(torch.int64), (x > 0), x.t()  # the last: a non-contiguous view


def _run(checker: TensorChecker, noise: float, nan: bool) -> None:
    torch.manual_seed(0)
    ref = _Writes(nan=nan).eval()
    cand = _Writes(noise, nan).eval()
    cand.load_state_dict(ref.state_dict())
    x = torch.randn(4, 8)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(x)
        cand(x)


@pytest.mark.parametrize("mode", ["equal", "allclose"])
@pytest.mark.parametrize("noise,nan", [(0.0, False), (1e-7, False), (0.5, True)])
def test_checker_bulk_path_matches_the_per_pair_path(monkeypatch, mode, noise, nan):
    def run(bulk: bool):
        calls = []

        def seen(tag, step, ref, cand, comp):
            calls.append((tag, step, _bytes(ref), _bytes(cand), tuple(comp.to_dict().items())))

        if not bulk:  # the per-pair path: nothing held
            monkeypatch.setattr(holder_module, "PENDING_BYTES", 0)
        checker = TensorChecker(verbose=False, eager_mode=mode, on_compared=seen)
        _run(checker, noise, nan)
        held = len(checker._hold.held)
        rows = checker.check(mode).to_rows()
        monkeypatch.undo()
        return rows, sorted(calls, key=repr), held

    bulk_rows, bulk_calls, held = run(True)
    rows, calls, none_held = run(False)
    assert held > 10 and none_held == 0  # the bulk path was taken, and only there
    assert bulk_rows == rows
    assert bulk_calls == calls
    # the values of capture time: the in-place writes after capture never reached a verdict
    failing = {r["tag"] for r in rows if not is_passing(r["status"])}
    if noise == 0.0 and not nan:
        assert not failing
    if nan:
        assert any(r["ref_nan"] for r in rows)


def test_checker_bulk_path_flushes_within_its_byte_bound(monkeypatch):
    seen_bytes = []
    flush = holder_module.Holder.flush

    def tracking(self):
        seen_bytes.append(self.held.nbytes)
        flush(self)

    monkeypatch.setattr(holder_module.Holder, "flush", tracking)
    budget = 160 * 1024
    checker = TensorChecker(verbose=False, eager_mode="equal", max_resident_bytes=budget)
    _run(checker, 0.0, False)
    result = checker.check("equal")
    assert result.passed
    assert len(seen_bytes) > 2  # flushed during the run, then at the check
    assert max(seen_bytes) <= budget / 16  # the bound: max_resident_bytes / 16
    # a bound below two of the largest sides held: nothing is held, every pair compared at once
    small = TensorChecker(verbose=False, eager_mode="equal", max_resident_bytes=16 * 1024)
    _run(small, 0.0, False)
    assert len(small._hold.held) == 0
    assert small.check("equal").passed


@pytest.mark.parametrize("dtype", (np.float32, np.float64))
@pytest.mark.parametrize("n", (1, 2, 7, 16, 64, 255, DOT_FINITE_MIN - 1))
def test_small_arrays_take_the_vdot_proof_and_stay_exact(n, dtype):
    """Below DOT_FINITE_MIN the sum of squares is ``numpy.vdot``: same answers as ``isfinite``."""
    base = np.random.default_rng(n).standard_normal(n).astype(dtype)
    if n % 2:  # 2-D too: vdot reads any shape flat
        base = base.reshape(-1, 1)
    assert _all_finite(torch.from_numpy(base)) is True
    for bad in (np.nan, np.inf, -np.inf, np.finfo(dtype).max):  # the last: finite, square inf
        for i in sorted({*range(min(n, 64)), *range(max(n - 64, 0), n), n // 2}):
            a = base.copy().reshape(-1)
            a[i] = bad
            want = bool(np.isfinite(a).all())
            assert _all_finite(torch.from_numpy(a.reshape(base.shape))) is want, (bad, i)
