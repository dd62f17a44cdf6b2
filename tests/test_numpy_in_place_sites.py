"""The histogram, the dump writer and the ONNX Runtime feed read user tensors in place.

``Tensor.numpy()`` marks a tensor's storage not resizable for good, so a model's own later
``resize_`` raised "Trying to resize storage that is not resizable" after the tool had only
read the tensor (w9trust fixed the comparison; these three sites still called it). Each test
reads a tensor through one site, checks the values against an independent copy, then resizes
the tensor: it raises on the old code.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity_tracker.adapters.onnx import _numpy as onnx_feed
from parity_tracker.files.dump import to_numpy
from parity_tracker.run.histogram import diff_histogram


def _grow(t: torch.Tensor) -> None:
    t.resize_(t.numel() * 4)  # raises on a storage .numpy() marked not resizable
    assert t.numel() >= 4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_diff_histogram_leaves_both_sides_resizable(dtype):
    ref = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=dtype)
    cand = torch.tensor([1.0, 2.5, 3.0, 8.0], dtype=dtype)  # |Δ| = 0, 0.5, 0, 4
    h = diff_histogram(ref, cand, bins=2)
    assert h["numel"] == 4 and h["zero_count"] == 2 and sum(h["counts"]) == 2
    _grow(ref)
    _grow(cand)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float64])
def test_dump_to_numpy_leaves_the_tensor_resizable(dtype):
    t = torch.arange(6, dtype=dtype).reshape(2, 3)
    expected = np.arange(6).reshape(2, 3).astype(str(dtype).removeprefix("torch."))
    array, info, extra = to_numpy(t)
    np.testing.assert_array_equal(array, expected)
    assert info["stored_dtype"] == str(expected.dtype) and extra == {}
    _grow(t)


def test_dump_to_numpy_of_a_transpose_is_its_values():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    array, _, _ = to_numpy(t)
    np.testing.assert_array_equal(array, np.arange(6, dtype=np.float32).reshape(2, 3).T)


def test_onnx_feed_reads_the_input_in_place():
    x = torch.tensor([[0.5, -1.0], [2.0, 3.25]])
    feed = onnx_feed(x)
    np.testing.assert_array_equal(feed, np.array([[0.5, -1.0], [2.0, 3.25]], np.float32))
    _grow(x)


def test_onnx_feed_of_a_conjugate_view_is_its_values():
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    np.testing.assert_array_equal(onnx_feed(z.conj()), np.array([1 - 2j, 3 + 4j], np.complex64))
    assert isinstance(onnx_feed([1.0, 2.0]), np.ndarray)
