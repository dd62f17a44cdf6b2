"""Issue 19, item 4: the fused pass and the small-pair path change no result.

- The compiled loop (numba, optional) and the numpy fold give bit-identical chunk results and
  ``DiffStats`` (same fixed summation order), including tails, zeros, subnormals, ties and the
  chunks they both refuse (NaN/inf, sums leaving float64).
- Through ``diff_stats`` (many chunks) both agree with the independent numpy float64 reference
  of ``tests/test_metrics.py`` (``_np_expected``), with its rules (counts and indices exact).
- The small-pair path of ``compare_tensors`` (≤ 256 elements, whole-array numpy) gives the same
  record, field by field, as the general chunked path.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_metrics import _close, _np_expected

from parity_tracker.compare import compare_tensors, core, fused, metrics

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SIZES = [1, 63, 64, 255, 256, 257, 1000, 4099, 20000]


def _case(name: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    r = g.standard_normal(n)
    c = r + 1e-3 * g.standard_normal(n)
    if name == "zeros":  # zeros in the reference, some matched (0/0), some not (x/0 = inf)
        r[::3] = 0.0
        c[::6] = 0.0
    elif name == "ties":  # the greatest difference at several places: the first index counts
        c = r.copy()
        c[n // 3 :: 7] = r[n // 3 :: 7] + 0.5
    elif name == "subnormal":  # float64 subnormal references: ULP scale = tiny
        r = r * 1e-310
        c = c * 1e-310
    elif name == "huge":  # sums of squares overflow: both folds refuse, the general path scales
        r = r * 1e200
        c = c * 1e200
    elif name == "nan":
        r[n // 2] = math.nan
        c[n // 2] = math.nan
        c[0] = math.inf
    elif name == "equal":
        c = r.copy()
    elif name == "signed_zero":
        r[:] = 0.0
        c[:] = -0.0
    return r, c


CASES = ["noise", "zeros", "ties", "subnormal", "huge", "nan", "equal", "signed_zero"]


def _tensors(name, n, dtype, cand_dtype=None):
    r, c = _case(name, n)
    return torch.from_numpy(r).to(dtype), torch.from_numpy(c).to(cand_dtype or dtype)


@pytest.fixture
def eager_only(monkeypatch):
    monkeypatch.setitem(fused._KERNEL, "fn", None)
    monkeypatch.setitem(fused._KERNEL, "built", True)


@pytest.mark.parametrize("dtype", [*FLOATS, (torch.float32, torch.float16)], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_compiled_and_numpy_folds_are_identical(compiled, case, dtype) -> None:
    ref_dtype, cand_dtype = dtype if isinstance(dtype, tuple) else (dtype, dtype)
    for n in SIZES:
        r, c = _tensors(case, n, ref_dtype, cand_dtype)
        tiny = float(torch.finfo(ref_dtype).tiny)
        kernel_fold, eager_fold = fused.KernelFold(n, compiled), fused.EagerFold(n)
        for tol in ((0.0, 0.0), (1.3e-6, 1e-5)):
            for half_best, bests in (
                (-1.0, (0.0, 0.0)),
                (1e-3, (0.5, 0.5)),
                (math.inf, (9.0, 9.0)),
            ):
                got = kernel_fold(r, c, tol, half_best, tiny, bests)
                want = eager_fold(r, c, tol, half_best, tiny, bests)
                assert got == want, (case, n, tol, half_best, got, want)


def _stats(r, c, *, kernel: bool, monkeypatch, **kw) -> metrics.DiffStats:
    with monkeypatch.context() as m:
        m.setattr(fused, "KERNEL_MIN", 0)
        if not kernel:
            m.setitem(fused._KERNEL, "fn", None)
            m.setitem(fused._KERNEL, "built", True)
        return metrics.diff_stats(r, c, **kw)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_diff_stats_many_chunks_match_numpy_both_ways(compiled, monkeypatch, case, dtype):
    r, c = _tensors(case, 5000, dtype)
    tol = (1.3e-6, 1e-5)
    with np.errstate(all="ignore"):
        want = _np_expected(r.double().numpy(), c.double().numpy(), *tol, dtype)
    results = [
        _stats(
            r, c, kernel=k, monkeypatch=monkeypatch, rtol=tol[0], atol=tol[1], chunk=700, workers=w
        )
        for k in (True, False)
        for w in (1, 2)
    ]
    assert results[0] == results[2] and results[1] == results[3]  # compiled == numpy, per layout
    # the reference's plain sums of squares under/overflow there (hand values: test_trust_metrics)
    skip = {"sqnr_db", "cosine"} if case in ("subnormal", "huge") else set()
    for got in results:
        for key, value in want.items():
            if key not in skip:
                assert _close(getattr(got, key), value), (key, getattr(got, key), value)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 3000),
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([1.0, 1e-30, 1e30, 1e-310]),
    specials=st.integers(0, 3),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16]),
)
def test_fuzz_compiled_equals_numpy(n, seed, scale, specials, dtype) -> None:
    pytest.importorskip("numba")
    fn = fused.kernel()
    if fn is None:
        return
    g = np.random.default_rng(seed)
    r = g.standard_normal(n) * scale
    c = r * (1 + 1e-4 * g.standard_normal(n))
    for _ in range(specials):
        k = int(g.integers(n))
        c[k] = g.choice([0.0, -0.0, r[k], 2 * r[k]])
        r[int(g.integers(n))] = 0.0
    rt, ct = torch.from_numpy(r).to(dtype), torch.from_numpy(c).to(dtype)
    tiny = float(torch.finfo(dtype).tiny)
    args = ((1e-3, 1e-5), -1.0, tiny, (0.0, 0.0))
    assert fused.KernelFold(n, fn)(rt, ct, *args) == fused.EagerFold(n)(rt, ct, *args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", ["equal", "allclose"])
def test_small_pair_path_gives_the_general_record(monkeypatch, case, dtype, mode) -> None:
    for n in (1, 5, 64, 255, 256):
        r, c = _tensors(case, n, dtype)
        fast = compare_tensors(r, c, mode=mode)
        with monkeypatch.context() as m:
            m.setattr(core, "SMALL_PAIR", 0)  # every differing pair takes the chunked engine
            general = compare_tensors(r, c, mode=mode)
        assert fast.to_dict() == general.to_dict(), (case, n)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_small_pair_metrics_match_numpy(case, dtype) -> None:
    r, c = _tensors(case, 64, dtype)
    got = compare_tensors(r, c, mode="allclose", rtol=1e-3, atol=1e-5)
    with np.errstate(all="ignore"):
        want = _np_expected(r.double().numpy(), c.double().numpy(), 1e-3, 1e-5, dtype)
    skip = {"sqnr_db", "cosine"} if case in ("subnormal", "huge") else set()  # as above
    for key, value in want.items():
        if key in skip:
            continue
        if key.endswith("_index"):
            value = None if value is None else (value,)
        assert _close(getattr(got, key), value), (key, getattr(got, key), value)


def test_small_pair_costs_no_chunk_engine(monkeypatch) -> None:
    """A 64-element differing pair never builds the chunked accumulator."""

    def refuse(*args, **kwargs):
        raise AssertionError("chunked engine used for a small pair")

    monkeypatch.setattr(metrics, "DiffAccumulator", refuse)
    got = compare_tensors(torch.ones(64), torch.full((64,), 1.5), mode="allclose")
    assert got.status == "mismatch" and got.mismatch_count == 64 and got.max_abs_diff == 0.5


def test_a_failing_compiled_loop_falls_back_to_the_same_results(monkeypatch) -> None:
    """A broken numba install never costs a comparison: the numpy fold takes over, warned once."""

    def broken(*args):
        raise RuntimeError("no LLVM here")

    r, c = _tensors("noise", 3000, torch.float32)
    want = _stats(r, c, kernel=False, monkeypatch=monkeypatch, rtol=1e-3, atol=1e-5, chunk=700)
    monkeypatch.setattr(fused, "KERNEL_MIN", 0)
    monkeypatch.setitem(fused._KERNEL, "fn", broken)
    monkeypatch.setitem(fused._KERNEL, "built", True)
    with pytest.warns(RuntimeWarning, match="compiled comparison loop unavailable"):
        got = metrics.diff_stats(r, c, rtol=1e-3, atol=1e-5, chunk=700)
    assert got == want
    assert fused.kernel() is None  # not tried again in this process


def test_concurrent_comparisons_share_no_scratch() -> None:
    """Folds are reused per thread: comparisons in parallel threads match the serial ones."""
    from concurrent.futures import ThreadPoolExecutor

    pairs = [_tensors(case, 70_000, torch.float32) for case in ("noise", "zeros", "ties")] * 3
    serial = [metrics.diff_stats(r, c, rtol=1e-3, atol=1e-5) for r, c in pairs]
    with ThreadPoolExecutor(3) as pool:
        parallel = list(pool.map(lambda p: metrics.diff_stats(*p, rtol=1e-3, atol=1e-5), pairs))
    assert parallel == serial
