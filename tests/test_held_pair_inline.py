"""Issue 19 (wave 9): the inline tests of a held small pair decide exactly as ``_readable`` did.

``HeldPairs._add_held`` tests a live side inline (type, dtype, layout, device, nested,
conjugate and negative bits, shape) and copies its bytes with a known size (``batch._copy``);
``Snapshotter.take`` tests ``holdable`` inline. Each case below checks what is held (or that
nothing is) against numpy, and the verdict of a whole eager run against values worked out by
hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture import Snapshotter
from parity_tracker.compare.batch import HeldBytes, HeldPairs, _copy
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker


def _held(values) -> HeldBytes:
    t = torch.tensor(values)
    return HeldBytes(np.ascontiguousarray(t.numpy()).tobytes(), t.dtype, tuple(t.shape))


def test_copy_of_a_non_contiguous_tensor_and_of_an_uncached_size_is_its_c_order_bytes():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # non-contiguous
    assert (
        _copy(t, 48)
        == np.ascontiguousarray(np.arange(12, dtype=np.float32).reshape(3, 4).T).tobytes()
    )
    odd = torch.arange(7919, dtype=torch.int8)  # a size no earlier read cached
    assert _copy(odd, 7919) == np.arange(7919, dtype=np.int8).tobytes()


@pytest.mark.parametrize(
    "live",
    [
        lambda: torch.tensor([1.0, 2.0], dtype=torch.float64),  # another dtype
        lambda: torch.tensor([[1.0, 2.0]]),  # another shape
        lambda: torch.tensor([1.0, 2.0]).to_sparse(),  # another layout
        lambda: torch.tensor([1.0 + 0j, 2.0 + 0j]).conj(),  # conjugate bit (complex ref below)
        lambda: torch.tensor([1.0 + 0j, 2.0 + 0j]).conj().imag,  # negative bit
    ],
)
def test_a_live_side_the_bulk_cannot_read_is_not_held(live):
    t = live()
    ref = _held([1.0 + 0j, 2.0 + 0j]) if t.is_complex() else _held([1.0, 2.0])
    if t.is_neg():
        ref = _held([0.0, 0.0])
    held = HeldPairs()
    assert held.add("k", "t", ref, t) is False
    assert len(held) == 0


def test_a_readable_live_side_is_held_with_its_bytes_of_now():
    ref = _held([1.0, 2.0, 3.0])
    live = torch.tensor([1.0, 2.0, 4.0])
    held = HeldPairs()
    assert held.add("k", "t", ref, live) is True
    live.add_(1)  # written after: the held copy keeps the values of the add
    r, c = held.tensors(0)
    np.testing.assert_array_equal(c.numpy(), np.array([1.0, 2.0, 4.0], dtype=np.float32))
    np.testing.assert_array_equal(r.numpy(), np.array([1.0, 2.0, 3.0], dtype=np.float32))
    assert held.compare("equal") == [None]  # 3 != 4: left to the per-pair path


def test_take_holds_a_small_tensor_as_its_bytes_and_a_non_contiguous_one_in_c_order():
    snap = Snapshotter()
    snap.bytes_max = 4096
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    copy = snap.take(t)
    assert type(copy) is HeldBytes and copy.shape == (3, 2)
    expected = np.ascontiguousarray(np.arange(6, dtype=np.float32).reshape(2, 3).T)
    np.testing.assert_array_equal(copy.load().numpy(), expected)
    big = torch.zeros(1025)  # 4100 bytes: over bytes_max, a tensor copy
    assert isinstance(snap.take(big), torch.Tensor)


class _Neg(nn.Module):
    def forward(self, x):
        return x.conj().imag  # a view with the negative bit


class _Two(nn.Module):
    def __init__(self, offset: float) -> None:
        super().__init__()
        self.neg, self.offset = _Neg(), offset

    def forward(self, x):
        return self.neg(x) + self.offset


def test_an_eager_run_with_unreadable_small_sides_reports_the_hand_worked_verdicts():
    checker = TensorChecker(verbose=False, eager_mode="equal", dump_mode=DumpMode.NOT)
    x = torch.tensor([1.0 + 2j, 3.0 - 4j])
    ref, cand = _Two(0.0), _Two(1.0)
    with (
        torch.no_grad(),
        module_register_tensor_checker(ref, checker, side=0),
        module_register_tensor_checker(cand, checker, side=1),
    ):
        ref(x)
        cand(x)
    by_tag = {r.tag: r.status for r in checker.check("equal").results}
    # neg: -imag(conj(x)) = imag(x) = [2, -4] on both sides; the root adds 0 vs 1
    assert by_tag["checker_neg"] == "equal"
    assert by_tag["checker_model"] == "mismatch"
