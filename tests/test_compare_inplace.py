"""``compare.hashing.array_in_place``: a numpy view of a tensor, read without side effects.

The reference values are what ``Tensor.numpy()`` gives for a PRIVATE copy of the same view
(``numpy()`` marks the storage it reads not resizable, so it is only called on copies here):
the same dtype, shape, values, and the view's strides in bytes. On main ed626ba the reader
(``numpy_in_place``) read a non-contiguous tensor's storage bytes as if they were in C order
(wrong values, silently), read a conjugate tensor's stored bytes as its values, and kept
nothing alive; ``array_in_place`` did not exist.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from parity_tracker.compare import hashing
from parity_tracker.compare.hashing import numpy_in_place

_DTYPES = [
    torch.bool,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]

_VIEWS = {
    "contiguous": lambda t: t,
    "0-d": lambda t: t[1, 2],
    "empty": lambda t: t[:0],
    "offset_rows": lambda t: t[2:5],
    "transposed": lambda t: t.t(),
    "step": lambda t: t[:, ::3],
    "column": lambda t: t[:, 4],
    "broadcast": lambda t: t[:1].expand(4, -1),  # stride 0
    "channels_last": lambda t: t.reshape(1, 2, 3, 6).contiguous(memory_format=torch.channels_last),
}


def _base(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 6, generator=g, dtype=torch.float64) * 50
    if dtype == torch.bool:
        return x > 0
    if dtype.is_complex:
        return torch.complex(x, -x).to(dtype)
    return x.to(dtype)


def _private_numpy(view: torch.Tensor, np_view=None) -> np.ndarray:
    """What numpy() gives for the same values in a private copy (C order)."""
    copy = view.clone().contiguous()
    if np_view is not None:
        copy = copy.view(np_view)
    return copy.numpy()


@pytest.mark.parametrize("view", sorted(_VIEWS))
@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_values_strides_and_no_side_effect(dtype, view):
    full = _base(dtype)
    t = _VIEWS[view](full)
    got = numpy_in_place(t)
    want = _private_numpy(t)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if t.numel():
        assert got.strides == tuple(s * t.element_size() for s in t.stride())
        assert np.shares_memory(got, hashing.array_in_place(full)) or view == "channels_last"
    assert not got.flags.writeable
    assert full.untyped_storage().resizable() and t.untyped_storage().resizable()


@pytest.mark.parametrize("view", ["contiguous", "transposed", "step", "broadcast"])
@pytest.mark.parametrize(
    ("dtype", "bits"), [(torch.bfloat16, np.uint16), (torch.float16, np.int16)]
)
def test_bits_of_a_dtype_numpy_lacks(dtype, bits, view):
    """bfloat16 (no numpy dtype) read as its bit patterns; a same-size dtype of any tensor."""
    full = torch.linspace(-3, 3, 36, dtype=torch.float64).reshape(6, 6).to(dtype)
    t = _VIEWS[view](full)
    got = hashing.array_in_place(t, bits)
    np.testing.assert_array_equal(got, _private_numpy(t, torch.int16).view(bits))
    assert full.untyped_storage().resizable()
    with pytest.raises(ValueError, match="does not read"):
        hashing.array_in_place(t, np.int32)  # 4-byte items over 2-byte elements
    with pytest.raises(TypeError):
        numpy_in_place(torch.zeros(3, dtype=torch.bfloat16))  # numpy has no bfloat16


def test_a_view_sees_later_writes_and_keeps_its_tensor_alive():
    t = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    view = numpy_in_place(t.t())
    t.add_(100)  # a view, not a copy
    assert view[0, 1] == 104
    view = numpy_in_place(torch.arange(1000, dtype=torch.float64)[10:].reshape(30, 33).t())
    gc.collect()
    noise = [torch.full((1000,), -1.0, dtype=torch.float64) for _ in range(50)]  # reuse bait
    want = np.arange(10, 1000, dtype=np.float64).reshape(30, 33).T
    np.testing.assert_array_equal(view, want)
    del noise


def test_writeable_only_on_request():
    t = torch.zeros(4, dtype=torch.float32)
    assert hashing.array_in_place(t, writeable=True).flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        numpy_in_place(t)[0] = 1.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(3, dtype=torch.complex64).conj(),
        lambda: torch._neg_view(torch.randn(3)),
        lambda: torch.empty(3, device="meta"),
        lambda: torch.randn(4, 4).to_sparse(),
    ],
    ids=["conjugate", "negative", "meta", "sparse"],
)
def test_tensors_whose_bytes_are_not_their_values_are_refused(make):
    """numpy() refuses these too; reading the stored bytes would give other values."""
    with pytest.raises((ValueError, RuntimeError)):
        numpy_in_place(make())
