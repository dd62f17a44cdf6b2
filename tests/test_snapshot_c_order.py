"""Snapshots of permuted (channels-last) activations: C-order copies that never alias."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity_tracker.capture.snapshot import Snapshotter


@pytest.mark.parametrize(
    "shape", [(1, 8, 5, 7), (2, 8, 5, 7), (1, 1, 5, 7), (1, 8, 1, 1), (3, 4, 1, 6), (1, 64, 9, 9)]
)
def test_channels_last_snapshot_holds_the_values_of_capture_time(shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    x = x.to(memory_format=torch.channels_last)
    expected = np.array(x.numpy(), order="C", copy=True)  # C-order values, taken by numpy
    copy = Snapshotter().take(x)
    x.mul_(-2.0).add_(1.0)  # written after the capture
    assert copy.is_contiguous()
    assert copy.shape == x.shape
    np.testing.assert_array_equal(copy.numpy(), expected)
    assert copy.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
