"""Where torch 2.13's copy-on-write ``resize_`` bug reaches a user's model (w11trust).

torch 2.13: a tensor whose storage was lazily cloned (``torch._lazy_clone``), grown by
``resize_`` (or by an ``out=`` kernel that resizes its output), then written, fails
``ctx != nullptr INTERNAL ASSERT FAILED at c10/core/impl/COW.cpp:124``, also after the clone
is freed (``tests/test_snapshot_cow_memo.py``). The checker lazily clones every captured
plain contiguous CPU tensor of at least ``COW_MIN_BYTES`` that fills its storage
(``Snapshotter.take``), and every such parameter (``Snapshotter.pin``). So a module that grows
a captured buffer or activation of that size in place (a preallocated cache grown with
``resize_``) and writes into it crashes under the checker, while it runs plainly. The strict
xfails below record that; the controls show the documented way out
(``COW_MIN_BYTES = math.inf``: every snapshot copied) and that smaller tensors never hit it.

Expected values: the cache after one call is its 16384 zeros then the 4 input values, as
numpy computes it; the reference and candidate run the same code, so every row is ``equal``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import parity_tracker.capture.snapshot as snapshot
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

pytestmark = pytest.mark.skipif(not snapshot._COW, reason="torch has no _lazy_clone")

_BUG = (
    "torch 2.13 copy-on-write resize_ bug (c10/core/impl/COW.cpp:124): a captured buffer or "
    "activation of >= COW_MIN_BYTES grown by resize_ and written while its snapshot lives"
)


class GrowingCache(nn.Module):
    """Appends its input to a preallocated cache buffer grown with ``resize_``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(n))

    def forward(self, x):
        n = self.cache.numel()
        self.cache.resize_(n + x.numel())
        self.cache[n:] = x
        return self.cache[n:] * 1.0


class Double(nn.Module):
    def forward(self, x):
        return x * 2.0


class GrowsItsChildsOutput(nn.Module):
    """Grows its child's output (captured by the child's hook) in place, then writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.child = Double()

    def forward(self, x):
        y = self.child(x)
        n = y.numel()
        y.resize_(2 * n)
        y[n:] = 1.0
        return y


def _run(make, x):
    ref, cand = make(), make()
    c = TensorChecker(verbose=False, eager_mode="equal")
    with (
        module_register_tensor_checker(ref, c),
        module_register_tensor_checker(cand, c),
        torch.no_grad(),
    ):
        ref(x)
        cand(x)
        rows = c.check("equal").to_rows()
    return ref, rows


N = snapshot.COW_MIN_BYTES // 4  # float32 elements of the smallest copy-on-write snapshot


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason=_BUG)
def test_a_cache_buffer_grown_in_its_forward():
    _run(lambda: GrowingCache(N), torch.arange(4.0))


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason=_BUG)
def test_an_activation_grown_by_its_parent():
    _run(GrowsItsChildsOutput, torch.ones(N))


@pytest.mark.parametrize("n", [N - 1, N])
def test_below_the_size_or_with_copies_it_runs(n, monkeypatch):
    if n == N:  # the documented way out: every snapshot a copy
        monkeypatch.setattr(snapshot, "COW_MIN_BYTES", math.inf)
    ref, rows = _run(lambda: GrowingCache(n), torch.arange(4.0))
    want = np.concatenate([np.zeros(n, np.float32), np.arange(4, dtype=np.float32)])
    assert np.array_equal(ref.cache.numpy(), want)
    assert rows and all(r["status"] == "equal" for r in rows), rows
