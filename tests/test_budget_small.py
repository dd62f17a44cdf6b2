"""The small-side path of ``compare.budget.max_abs_err`` (issue 19, item 6, round 2).

Sides of at most ``budget.SMALL`` elements are scanned in whole-tensor ops; larger ones, and
any side with a non-finite difference, in the chunked pass. Both are checked against numpy
float64 of the widened sides (``test_budget_fast._want``: the rule of compare.budget), with the
small path forced off (``SMALL = 0``) and on, so neither path is left untested.
"""

from __future__ import annotations

import math

import pytest
import torch

import parity_tracker.compare.budget as budget
from tests.test_budget_fast import SIDE_DTYPES, _golden, _want


@pytest.mark.parametrize("small", [0, budget.SMALL])
@pytest.mark.parametrize("dtype", SIDE_DTYPES)
@pytest.mark.parametrize("n", [1, 7, 300, 5000])
def test_both_paths_match_numpy(monkeypatch, small, dtype, n):
    monkeypatch.setattr(budget, "SMALL", small)
    monkeypatch.setattr(budget, "SCAN_CHUNK", 1024)  # several chunks on the chunked path
    golden = _golden(n, n + 1)
    golden[n // 2] = -5000.0  # the largest magnitude, negative
    side = (golden * 1.003 - 0.2).to(dtype)
    kept = side.clone()
    got = budget.max_abs_err(side, golden, golden_max=True)
    assert torch.equal(side, kept)  # never written, even when already float64
    assert (got.max_abs_err, got.lost, got.golden_max) == _want(side, golden)
    assert got.dtype == dtype and got.problem == "" and got.side_hash is None
    assert budget.max_abs_err(side, golden).golden_max is None


@pytest.mark.parametrize("where", ["side", "golden"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_small_path_hands_non_finite_to_the_chunked_rule(where, value):
    golden = _golden(64, 2)
    side = golden.to(torch.bfloat16)
    (side if where == "side" else golden)[5] = value
    got = budget.max_abs_err(side, golden, golden_max=True)
    assert (got.max_abs_err, got.lost, got.golden_max) == _want(side, golden)


def test_side_error_digest_keeps_the_hash_and_the_scan():
    from parity_tracker.compare.hashing import content_hash

    golden = _golden(40, 4)
    side = golden.to(torch.float16)
    got = budget.side_error(golden, side, digest=True)
    worst, lost, top = _want(side, golden)
    assert (got.max_abs_err, got.lost, got.golden_max) == (worst, lost, top)
    assert got.side_hash == content_hash(side) and got.dtype == torch.float16
