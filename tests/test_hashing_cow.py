"""``content_hash`` of a copy-on-write tensor reads it in place (wave 8, w8trust).

``torch._lazy_clone`` makes two tensors share one buffer until one is written; ``numpy()`` (and
``data_ptr()``) first gives the tensor read a private copy at a new address. Hashing must not
do that: after ``content_hash`` the source and its lazy clone still share one data address
(read with ``torch._C._data_address``, which does not copy), and the hash is xxh3-64 of the
header and the bytes numpy gave before the clone was made.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xxhash

from parity_tracker.compare.hashing import content_hash

_lazy_clone = getattr(torch, "_lazy_clone", None)
_address = getattr(torch._C, "_data_address", None)
_is_cow = getattr(torch._C, "_is_cow_tensor", None)

pytestmark = pytest.mark.skipif(
    None in (_lazy_clone, _address, _is_cow), reason="this torch has no copy-on-write tensors"
)


def _expected(t: torch.Tensor, np_view=None) -> str:
    """xxh3-64 of ``"{dtype}|{shape}|"`` and the C-order bytes numpy gives (taken before any
    lazy clone exists, on a private copy)."""
    c = t.detach().clone().contiguous()
    a = c.view(np_view).numpy() if np_view is not None else c.numpy()
    header = f"{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}|"
    return xxhash.xxh3_64(header.encode() + np.ascontiguousarray(a).tobytes()).hexdigest()


_CASES = {
    "float32": (lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4), None, None),
    "int64_0d": (lambda: torch.tensor(7, dtype=torch.int64), None, None),
    "bfloat16": (lambda: torch.linspace(-3, 3, 10).to(torch.bfloat16), torch.int16, None),
    "float8": (
        lambda: torch.linspace(-2, 2, 9).to(torch.float8_e4m3fn),
        torch.uint8,
        None,
    ),
    "offset_slice": (lambda: torch.arange(20, dtype=torch.float64), None, lambda t: t[5:15]),
    "transposed": (lambda: torch.arange(12.0).reshape(3, 4), None, lambda t: t.t()),
    "bf16_transposed": (
        lambda: torch.arange(12.0).reshape(3, 4).to(torch.bfloat16),
        torch.int16,
        lambda t: t.t(),
    ),
    "requires_grad": (lambda: torch.randn(4, 5, requires_grad=True), None, None),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_content_hash_leaves_a_copy_on_write_buffer_shared(case):
    make, np_view, view = _CASES[case]
    src = make()
    want = _expected(view(src) if view else src, np_view)
    lazy = _lazy_clone(src)
    seen = view(lazy) if view else lazy
    assert _is_cow(lazy) and _address(lazy) == _address(src)
    got = content_hash(seen)
    assert _address(lazy) == _address(src), "hashing copied the shared buffer"
    assert _is_cow(lazy) and _is_cow(src)
    assert got == want
    assert content_hash(seen.detach().clone()) == want  # a private tensor: the same digest


@pytest.mark.parametrize("n", [1, 40, 200])  # small identical path, digest path, copy-on-write size
def test_a_compared_tensor_stays_resizable(n):
    """compare_tensors reads its sides in place: numpy() would mark their storages not
    resizable for good, and a model's own later resize_ raised (w8brk1)."""
    from parity_tracker.compare.core import compare_tensors

    ref = torch.arange(n * n, dtype=torch.float32).reshape(n, n)
    cand = ref.clone()
    assert compare_tensors(ref, cand, mode="equal").status == "equal"
    cand.resize_(n + 1, n)  # raised "Trying to resize storage that is not resizable"
    ref.resize_(n + 1, n)
    assert tuple(cand.shape) == (n + 1, n)


def test_numpy_in_place_is_a_read_only_view_of_the_same_values():
    from parity_tracker.compare.hashing import numpy_in_place

    t = torch.arange(12, dtype=torch.int16).reshape(3, 4)[1:]  # contiguous, storage offset 4
    view = numpy_in_place(t)
    assert view.dtype == np.int16 and view.shape == (2, 4)
    np.testing.assert_array_equal(view, np.arange(4, 12, dtype=np.int16).reshape(2, 4))
    assert not view.flags.writeable
    t.add_(1)  # a view, not a copy: it sees the tensor's bytes
    assert view[0, 0] == 5
