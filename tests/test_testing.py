"""parity_tracker.testing: operator-test assertions (seed section 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity_tracker.testing import assert_tensor_allclose, assert_tensor_equal


def test_equal_passes_and_returns_the_comparison():
    a = torch.tensor([1.0, float("nan"), 3.0])
    comparison = assert_tensor_equal(a, a.clone())  # NaN at the same place counts as equal
    assert comparison.status == "equal"


def test_equal_failure_message_names_count_and_worst_element():
    reference = torch.zeros(2, 3)
    candidate = reference.clone()
    candidate[1, 2] = 0.5
    candidate[0, 0] = 0.25
    with pytest.raises(AssertionError) as info:
        assert_tensor_equal(reference, candidate, msg="silu")
    text = str(info.value)
    assert text.startswith("silu: mismatch")
    assert "2 of 6 elements differ" in text
    assert "max abs diff 0.5" in text and "(1, 2)" in text


def test_equal_rejects_dtype_or_shape_difference():
    with pytest.raises(AssertionError, match="shape_mismatch"):
        assert_tensor_equal(torch.zeros(2, 3), torch.zeros(3, 2))
    with pytest.raises(AssertionError):
        assert_tensor_equal(torch.zeros(3), torch.zeros(3, dtype=torch.float64))


def test_allclose_uses_tolerances():
    reference = np.array([1.0, 2.0, 4.0], dtype=np.float32)
    candidate = reference + np.float32(1e-3)
    assert assert_tensor_allclose(reference, candidate, rtol=0, atol=2e-3).passed
    with pytest.raises(AssertionError, match="3 of 3 elements differ"):
        assert_tensor_allclose(reference, candidate, rtol=0, atol=1e-4)
    with pytest.raises(AssertionError):
        assert_tensor_allclose(torch.ones(3), torch.ones(3) + 1e-3)  # float32 defaults
