"""Issue 13, item 4: SQNR and cosine at the ends of the float64 range, against hand values.

Every input is a power-of-two multiple of small integers, so it is exact in float64 and the
expected value is worked out by hand from the integers alone (the scale cancels):

- ``r = [3, 5]·s``, ``c = [3, 6]·s``: ``d = [0, 1]·s``, SQNR ``= 10·log10((9 + 25) / 1)``,
  cosine ``= (9 + 30) / sqrt(34 · 45)``;
- ``r = [1, 2]·s``, ``c = [2, 1]·s``: cosine ``4 / 5``, SQNR ``10·log10(5 / 2)``.
"""

from __future__ import annotations

import math

import pytest
import torch

from parity_tracker.compare import compare_tensors
from parity_tracker.compare.metrics import diff_stats

SCALES = [-1072, -1060, -1000, -700, -600, -300, 0, 300, 600, 700, 1000, 1020]


def _t(values, k):
    return torch.tensor([math.ldexp(v, k) for v in values], dtype=torch.float64)


@pytest.mark.parametrize("k", SCALES)
def test_sqnr_and_cosine_are_scale_free(k):
    s = diff_stats(_t([3, 5], k), _t([3, 6], k))
    assert s.sqnr_db == pytest.approx(10 * math.log10(34), rel=1e-12)
    assert s.cosine == pytest.approx(39 / math.sqrt(34 * 45), rel=1e-12)
    assert s.max_abs_diff == math.ldexp(1, k)


@pytest.mark.parametrize("k", SCALES)
def test_cosine_of_non_parallel_vectors_is_not_one(k):
    s = diff_stats(_t([1, 2], k), _t([2, 1], k))
    assert s.cosine == pytest.approx(0.8, rel=1e-12)
    assert s.sqnr_db == pytest.approx(10 * math.log10(5 / 2), rel=1e-12)


@pytest.mark.parametrize("k", [-1000, -600, 600, 1000])
def test_orthogonal_vectors_have_cosine_zero(k):
    s = diff_stats(_t([1, 0], k), _t([0, 1], k))
    assert s.cosine == 0.0
    assert s.sqnr_db == pytest.approx(10 * math.log10(1 / 2), rel=1e-12)


def test_tiny_difference_under_a_large_signal_is_finite():
    # r = [2**600, 2**-600], c differs by 2**-650 in the second element:
    # SQNR = 10·log10((2**1200 + 2**-1200) / 2**-1300) = 10·log10(2)·2500 (to 1e-700 relative)
    r = torch.tensor([2.0**600, 2.0**-600], dtype=torch.float64)
    c = torch.tensor([2.0**600, 2.0**-600 + 2.0**-650], dtype=torch.float64)
    s = diff_stats(r, c)
    assert s.sqnr_db == pytest.approx(10 * math.log10(2) * 2500, rel=1e-12)
    assert math.isfinite(s.sqnr_db)


def test_overflowing_difference_of_finite_values():
    # r = [a, -a], c = -r with a = 1.5·2**1023: c − r overflows, yet SQNR = 10·log10(1/4)
    a = math.ldexp(1.5, 1023)
    r = torch.tensor([a, -a], dtype=torch.float64)
    s = diff_stats(r, -r)
    assert s.sqnr_db == pytest.approx(10 * math.log10(1 / 4), rel=1e-12)
    assert s.cosine == -1.0


def test_chunks_with_different_scales_agree_with_one_chunk():
    # mixed magnitudes spread over chunks of 2: the running scale must stay consistent
    values = [[2.0**-1060, 3.0 * 2**-1060], [2.0**500, 3.0], [5.0 * 2**-900, 1.0]]
    r = torch.tensor([v for pair in values for v in pair], dtype=torch.float64)
    c = r.clone()
    c[0], c[3], c[4] = 2.0**-1059, 4.0, 6.0 * 2**-900
    whole, chunked = diff_stats(r, c), diff_stats(r, c, chunk=2)
    assert chunked.sqnr_db == pytest.approx(whole.sqnr_db, rel=1e-12)
    assert chunked.cosine == pytest.approx(whole.cosine, rel=1e-12)
    # by hand: the signal is 2**1000 (+ negligible), the noise 1 (element 3: 4 − 3)
    assert whole.sqnr_db == pytest.approx(10 * math.log10(2) * 1000, rel=1e-12)


@pytest.mark.parametrize("k", [-1060, -700, 700, 1000])
def test_differing_pair_is_never_reported_identical(k):
    comp = compare_tensors(_t([3, 5], k), _t([3, 6], k), mode="equal")
    assert comp.status == "mismatch"
    assert comp.sqnr_db == pytest.approx(10 * math.log10(34), rel=1e-12)
    assert comp.cosine < 1.0
