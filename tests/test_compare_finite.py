"""The one-read "all finite" test of identical pairs (issue 19, measurement 1).

``compare.core._all_finite`` first tries the sum of squares of a float32/float64 array (one
BLAS read) and falls back to numpy's exact ``isfinite`` when that sum is not finite. These
tests put NaN, +inf and -inf at every position of the dot kernel's SIMD blocks and tails and
check the answer and the NaN/inf counts of ``compare_tensors`` against counts numpy computes
from the definition (``np.isnan`` / ``np.isinf``), never against the code's own output.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity_tracker.compare.core import DOT_FINITE_MIN, _all_finite, compare_tensors

SIZES = (DOT_FINITE_MIN, DOT_FINITE_MIN + 1, DOT_FINITE_MIN + 37, 5 * DOT_FINITE_MIN + 15)
DTYPES = (np.float32, np.float64)


def _finite_array(n: int, dtype) -> np.ndarray:
    return np.random.default_rng(n).standard_normal(n).astype(dtype)


def _positions(n: int) -> list[int]:
    """Every position of the first and last 64 elements, and a few in the middle."""
    return sorted({*range(64), *range(n - 64, n), n // 2, n // 3 + 1})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_single_non_finite_element_is_found_anywhere(n, dtype):
    base = _finite_array(n, dtype)
    assert _all_finite(torch.from_numpy(base)) is True
    for bad in (np.nan, np.inf, -np.inf):
        for i in _positions(n):
            a = base.copy()
            a[i] = bad
            assert _all_finite(torch.from_numpy(a)) is False, (bad, i)


@pytest.mark.parametrize("dtype", DTYPES)
def test_square_overflow_falls_back_to_the_exact_pass(dtype):
    """Finite values whose squares overflow: the sum is inf, the answer must still be True."""
    big = np.finfo(dtype).max / 2
    a = np.full(DOT_FINITE_MIN * 2, big, dtype=dtype)
    assert not np.isfinite(np.dot(a, a))  # the premise: the one-read sum overflows
    assert _all_finite(torch.from_numpy(a)) is True
    a[7] = np.nan
    assert _all_finite(torch.from_numpy(a)) is False


def test_multi_dimensional_and_0d_arrays():
    a = _finite_array(4 * DOT_FINITE_MIN, np.float32).reshape(8, -1, 2)
    assert _all_finite(torch.from_numpy(a)) is True
    a[3, 5, 1] = np.inf
    assert _all_finite(torch.from_numpy(a)) is False
    assert _all_finite(torch.tensor(float("nan"))) is False
    assert _all_finite(torch.tensor(1.5)) is True


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", (DOT_FINITE_MIN + 5, (1 << 20) + 3))  # small path, chunked path
def test_identical_pair_counts_match_numpy(n, dtype):
    """NaN/inf counts of an identical pair (both sides) equal numpy's count of the array."""
    a = _finite_array(n, dtype)
    rng = np.random.default_rng(7)
    idx = rng.choice(n, size=40, replace=False)
    a[idx[:13]] = np.nan
    a[idx[13:30]] = np.inf
    a[idx[30:]] = -np.inf
    want_nan, want_inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
    assert (want_nan, want_inf) == (13, 27)
    ref, cand = torch.from_numpy(a.copy()), torch.from_numpy(a.copy())
    c = compare_tensors(ref, cand, mode="equal")
    assert c.status == "equal"
    assert (c.ref_nan, c.ref_inf, c.cand_nan, c.cand_inf) == (want_nan, want_inf) * 2
    clean = compare_tensors(
        torch.from_numpy(_finite_array(n, dtype)),
        torch.from_numpy(_finite_array(n, dtype)),
        mode="equal",
    )
    assert (clean.ref_nan, clean.ref_inf, clean.cand_nan, clean.cand_inf) == (0, 0, 0, 0)
