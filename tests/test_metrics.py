"""Metrics against an independent numpy float64 reference: a table of cases × dtypes.

The expected values come from ``_np_expected`` below, written directly from the documented
formulas with numpy masks (no call into parity_tracker), and from hand-worked examples.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from parity_tracker.compare import metrics
from parity_tracker.compare.metrics import cosine_from_sums, diff_stats, sqnr_from_sums

INF, NAN = math.inf, math.nan
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# finfo of each dtype, written out (not read from torch): (mantissa bits p incl. implicit, emin)
FORMAT = {
    torch.float16: (11, -14),
    torch.bfloat16: (8, -126),
    torch.float32: (24, -126),
    torch.float64: (53, -1022),
}


def _np_ulp(r: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Spacing of the dtype at |r| via frexp: 2**(max(e, emin) - (p - 1)), p mantissa bits."""
    p, emin = FORMAT[dtype]
    _, e = np.frexp(np.abs(r))  # |r| = m · 2**e, m in [0.5, 1): exponent of the leading bit is e-1
    e = np.where(r == 0, emin, np.maximum(e - 1, emin))
    return np.ldexp(1.0, e - (p - 1))


def _np_expected(r: np.ndarray, c: np.ndarray, rtol: float, atol: float, dtype) -> dict:
    r, c = r.astype(np.float64).ravel(), c.astype(np.float64).ravel()
    both = np.isfinite(r) & np.isfinite(c)
    matched_nf = (np.isnan(r) & np.isnan(c)) | (np.isinf(r) & np.isinf(c) & (r == c))
    d = np.where(both, np.abs(np.where(both, c, 0) - np.where(both, r, 0)), INF)
    d[matched_nf] = 0.0
    ar = np.abs(np.where(both, r, 0.0))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel = np.where(d == 0, 0.0, d / ar)
        ulp = np.where(d == 0, 0.0, d / _np_ulp(np.where(np.isfinite(r), r, 0.0), dtype))
    ulp[~both & ~matched_nf] = INF
    rf, cf = np.where(both, r, 0.0), np.where(both, c, 0.0)
    sig, noise = float(np.sum(rf * rf)), float(np.sum(d * d))
    if noise == 0:
        sqnr = INF
    elif sig == 0 or noise == INF:
        sqnr = -INF
    else:
        sqnr = 10 * math.log10(sig / noise)
    nr, nc = np.linalg.norm(rf), np.linalg.norm(cf)
    cos = 1.0 if nr == nc == 0 else (0.0 if nr * nc == 0 else float(rf @ cf / (nr * nc)))
    n = r.size
    return dict(
        max_abs_diff=float(d.max()) if n else 0.0,
        max_abs_diff_index=int(np.argmax(d)) if n and d.max() > 0 else None,
        max_rel_diff=float(rel.max()) if n else 0.0,
        mean_abs_diff=float(d.mean()) if n else 0.0,
        mismatch_count=int(np.sum(d > atol + rtol * ar)),
        sqnr_db=sqnr,
        cosine=cos,
        max_ulp=float(ulp.max()) if n else 0.0,
        ref_nan=int(np.isnan(r).sum()),
        cand_nan=int(np.isnan(c).sum()),
        ref_inf=int(np.isinf(r).sum()),
        cand_inf=int(np.isinf(c).sum()),
    )


def _case(name: str) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(abs(hash(name)) % 2**32)
    if name == "noise":
        r = g.standard_normal((7, 13))
        return r, r + 1e-3 * g.standard_normal((7, 13))
    if name == "zeros_in_reference":
        r = g.standard_normal(40)
        r[::3] = 0.0
        c = r.copy()
        c[::6] = 0.25  # r == 0 and c != 0 → relative difference inf
        return r, c
    if name == "nan_same_positions":
        r = g.standard_normal(30)
        r[[2, 7]] = NAN
        c = r + 0.01
        return r, c
    if name == "nan_one_side":
        r = g.standard_normal(30)
        c = r.copy()
        c[11] = NAN
        return r, c
    if name == "inf_same_and_opposite":
        r = np.array([INF, -INF, INF, 1.0, 2.0, -3.0])
        c = np.array([INF, -INF, -INF, 1.0, INF, -3.5])
        return r, c
    if name == "signed_zero":
        return np.array([0.0, -0.0, 1.0]), np.array([-0.0, 0.0, 1.0])
    if name == "all_zero_reference":
        return np.zeros(9), np.full(9, 0.5)
    if name == "both_zero":
        return np.zeros((3, 3)), np.zeros((3, 3))
    if name == "zero_d":
        return np.array(1.5), np.array(1.75)
    if name == "empty":
        return np.zeros((0, 4)), np.zeros((0, 4))
    if name == "large":
        r = g.uniform(-6e4, 6e4, 64)
        return r, r * (1 + 1e-2)
    if name == "subnormal_reference":
        return np.array([0.0, 1e-45, 2.0]), np.array([1e-40, 0.0, 2.0])
    raise KeyError(name)


CASES = [
    "noise",
    "zeros_in_reference",
    "nan_same_positions",
    "nan_one_side",
    "inf_same_and_opposite",
    "signed_zero",
    "all_zero_reference",
    "both_zero",
    "zero_d",
    "empty",
    "large",
    "subnormal_reference",
]


def _close(got, want, rel=1e-9) -> bool:
    if want is None or got is None:
        return got is want
    if isinstance(want, float) and math.isinf(want):
        return got == want
    return got == pytest.approx(want, rel=rel, abs=1e-300)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("tol", [(0.0, 0.0), (1e-3, 1e-5)], ids=["exact", "tol"])
def test_metrics_table(case: str, dtype: torch.dtype, tol) -> None:
    r_np, c_np = _case(case)
    r = torch.from_numpy(r_np).to(dtype)
    c = torch.from_numpy(c_np).to(dtype)
    # the values actually compared: the dtype-rounded inputs, widened exactly to float64
    want = _np_expected(r.double().numpy(), c.double().numpy(), *tol, dtype)
    got = diff_stats(r, c, rtol=tol[0], atol=tol[1])
    for key, value in want.items():
        assert _close(getattr(got, key), value), (key, getattr(got, key), value)
    for value in (got.max_abs_diff, got.max_rel_diff, got.mean_abs_diff, got.max_ulp):
        assert not math.isnan(value)
    assert got.cosine is None or not math.isnan(got.cosine)


def test_hand_worked_example() -> None:
    r = torch.tensor([1.0, 2.0, 4.0, 0.0], dtype=torch.float64)
    c = torch.tensor([1.0, 2.5, 3.0, 0.0], dtype=torch.float64)
    s = diff_stats(r, c, rtol=0.2, atol=0.1)
    # d = [0, .5, 1, 0]; allowed = [.3, .5, .9, .1] → only index 2 exceeds
    assert s.mismatch_count == 1
    assert (s.max_abs_diff, s.max_abs_diff_index) == (1.0, 2)
    assert (s.max_rel_diff, s.max_rel_diff_index) == (0.25, 1)  # .5/2 = .25 > 1/4 tie → first
    assert s.mean_abs_diff == 1.5 / 4
    assert s.sqnr_db == pytest.approx(10 * math.log10(21 / 1.25))
    assert s.cosine == pytest.approx(18 / (math.sqrt(21) * math.sqrt(16.25)))
    # ULP of float64 at 2.0 is 2**-51 and at 4.0 is 2**-50
    assert s.max_ulp == 1.0 / 2**-50


def test_int64_ids_512_apart_exact() -> None:
    r = torch.tensor([2**62, 7, -(2**63)], dtype=torch.int64)
    c = torch.tensor([2**62 + 512, 7, 2**63 - 1], dtype=torch.int64)
    s = diff_stats(r, c, rtol=0.5, atol=1000.0)
    assert s.max_abs_diff == float(2**64 - 1)  # the wrapped int64 difference, taken in float64
    assert s.max_abs_diff_index == 2
    s = diff_stats(r[:2], c[:2], rtol=0.0, atol=0.0)
    assert (s.max_abs_diff, s.max_abs_diff_index, s.mismatch_count) == (512.0, 0, 1)
    assert s.max_ulp is None


def test_chunks_and_workers_agree_with_numpy() -> None:
    g = np.random.default_rng(3)
    r_np = g.standard_normal(10_007).astype(np.float32)
    c_np = r_np.copy()
    c_np[[5, 4_000, 9_999]] += np.float32(0.5)
    c_np[4_001] = np.nan
    want = _np_expected(r_np, c_np, 1.3e-6, 1e-5, torch.float32)
    for chunk, workers in [(1000, 1), (1000, 3), (64, 2), (1 << 16, 1)]:
        got = diff_stats(
            torch.from_numpy(r_np),
            torch.from_numpy(c_np),
            rtol=1.3e-6,
            atol=1e-5,
            chunk=chunk,
            workers=workers,
        )
        for key, value in want.items():
            assert _close(getattr(got, key), value), (chunk, workers, key)


def test_float8_ulp_and_values() -> None:
    r = torch.tensor([1.0, 256.0, 0.0], dtype=torch.float8_e4m3fn)
    c = torch.tensor([1.125, 288.0, 2**-9], dtype=torch.float8_e4m3fn)
    s = diff_stats(r, c)
    # e4m3fn: ULP at 1 is 2**-3, at 256 is 32, at 0 the subnormal spacing 2**-9 → 1 ULP each
    assert s.max_ulp == 1.0
    assert s.max_abs_diff == 32.0 and s.max_abs_diff_index == 1
    r5 = torch.tensor([1.0, -4.0], dtype=torch.float8_e5m2)
    c5 = torch.tensor([1.5, -4.0], dtype=torch.float8_e5m2)
    s5 = diff_stats(r5, c5)
    assert s5.max_ulp == 2.0  # ULP at 1 is 2**-2; 0.5 / 0.25
    assert s5.mismatch_count == 1


def test_complex_modulus_and_parts() -> None:
    r = torch.tensor([1 + 1j, 2 - 1j, 0j], dtype=torch.complex128)
    c = torch.tensor([1 + 1j, 2 + 2j, 3 + 4j], dtype=torch.complex128)
    s = diff_stats(r, c, rtol=0.0, atol=0.0)
    assert (s.max_abs_diff, s.max_abs_diff_index) == (5.0, 2)  # |3+4j|
    assert s.mismatch_count == 2
    assert s.mean_abs_diff == pytest.approx(8.0 / 3)
    # as real vectors: r = (1,1,2,-1,0,0), c = (1,1,2,2,3,4)
    assert s.cosine == pytest.approx(4 / (math.sqrt(7) * math.sqrt(35)))
    assert s.sqnr_db == pytest.approx(10 * math.log10(7 / (9 + 25)))
    assert s.max_ulp == INF or s.max_ulp > 0  # 3 at a zero reference: huge ULP count


@pytest.mark.parametrize(
    ("signal", "noise", "want"),
    [(4.0, 0.0, INF), (0.0, 0.0, INF), (0.0, 1.0, -INF), (1.0, INF, -INF), (100.0, 1.0, 20.0)],
)
def test_sqnr_defined_cases(signal, noise, want) -> None:
    assert sqnr_from_sums(signal, noise) == pytest.approx(want)


@pytest.mark.parametrize(
    ("dot", "rr", "cc", "want"),
    [(0.0, 0.0, 0.0, 1.0), (0.0, 0.0, 2.0, 0.0), (2.0, 4.0, 1.0, 1.0), (-1.0, 1.0, 1.0, -1.0)],
)
def test_cosine_defined_cases(dot, rr, cc, want) -> None:
    assert cosine_from_sums(dot, rr, cc) == want


def test_pure_functions_match_engine() -> None:
    r = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    c = torch.tensor([[1.5, -2.0], [2.0, 0.5]])
    assert metrics.max_abs_diff(r, c) == (1.0, 2)
    assert metrics.max_rel_diff(r, c) == (0.5, 0)
    assert metrics.mean_abs_diff(r, c) == 0.375
    assert metrics.mismatch_count(r, c) == 2
    assert metrics.mismatch_count(r, c, rtol=0.5, atol=0.0) == 0
    assert metrics.sqnr_db(r, c) == pytest.approx(10 * math.log10(14.25 / 1.25))
    assert metrics.cosine_similarity(r, c) == pytest.approx(
        (1.5 + 4 + 6 + 0.25) / (math.sqrt(14.25) * math.sqrt(2.25 + 4 + 4 + 0.25))
    )
    assert metrics.max_ulp(r, c) == 0.5 / 2**-23  # float32 ULP at 1.0 is 2**-23
    assert metrics.nonfinite_counts(torch.tensor([NAN, INF, -INF, 1.0])) == (1, 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_max_ulp_exact_across_binades_and_chunks(dtype: torch.dtype) -> None:
    # The engine skips chunks/elements whose ULP ratio cannot beat the running max (ratio <=
    # 2·rel); values spread over 40 binades, zeros and subnormals make the ULP maximum sit
    # where the relative maximum does not. Expected: numpy frexp spacing, every element.
    g = np.random.default_rng(11)
    n = 6_000
    r = g.standard_normal(n) * np.exp2(g.integers(-20, 20, n))
    r[::97] = 0.0
    r[5::101] = 1e-45 if dtype == torch.float32 else 0.0
    c = r + r * g.standard_normal(n) * 1e-2 + np.where(g.random(n) < 0.01, 1e-6, 0.0)
    rt, ct = torch.from_numpy(r).to(dtype), torch.from_numpy(c).to(dtype)
    want = _np_expected(rt.double().numpy(), ct.double().numpy(), 0.0, 0.0, dtype)["max_ulp"]
    for chunk, workers in [(64, 1), (500, 2), (1 << 16, None)]:
        got = diff_stats(rt, ct, chunk=chunk, workers=workers)
        assert _close(got.max_ulp, want), (chunk, workers, got.max_ulp, want)


def test_max_ulp_later_chunk_with_smaller_rel_but_larger_ulp() -> None:
    # Hand-worked: chunk 1 r = 1.0, c = 1 + 2**-10 → rel 2**-10, 2**13 ULP (eps 2**-23);
    # chunk 2 r = 1.875, c = r + 1.5·2**-10 → rel 0.8·2**-10 (smaller), but ulp(1.875) =
    # 2**-23 too, so 1.5·2**13 = 12288 ULP (larger). Max ULP 12288, max rel 2**-10.
    r = torch.tensor([1.0, 1.0, 1.875, 1.875])
    c = torch.tensor([1.0 + 2**-10, 1.0, 1.875 + 1.5 * 2**-10, 1.875])
    got = diff_stats(r, c, chunk=2, workers=1)
    assert got.max_ulp == 12288.0
    assert (got.max_rel_diff, got.max_rel_diff_index) == (2**-10, 0)
