"""Small models shared by the op-level in-place tests (``test_ops_cow``, ``test_ops_borrow``)."""

from __future__ import annotations

from torch import nn


class ReadThenZero(nn.Module):
    """Reads its input, then zeroes it in place: a write after the op's read and the hook."""

    def forward(self, y):
        z = y + 1
        y.mul_(0)
        return z + y
