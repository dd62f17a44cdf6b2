"""Issue 19, budget wave 6: the compiled error scan reads copy-on-write tensors in place.

The checker snapshots large captures copy-on-write (``torch._lazy_clone``). ``Tensor.numpy()``
asks for writable data, so on a COW tensor whose storage is still shared (its source alive, or
a second snapshot of the same source) it first gives the tensor a private copy of every byte
(≈ 100 ms per budget run at 8×512). The scan must read the golden and the side in place: the
same maxima (checked against numpy float64 arithmetic on the source arrays), and the COW
tensors still share their source's memory afterwards (on main's code they did not: each scanned
golden got its own buffer).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parity_tracker.compare import budget, budget_scan

N = budget.SMALL + 777  # past the whole-tensor path: the compiled loop
COW = getattr(torch._C, "_is_cow_tensor", None)


@pytest.fixture(autouse=True)
def compiled():
    pytest.importorskip("numba")
    if budget_scan._load() is None:
        pytest.skip("compiled scan disabled (PARITY_NO_KERNEL)")
    if COW is None or not hasattr(torch, "_lazy_clone"):
        pytest.skip("this torch has no copy-on-write tensors")


def _expected(side: np.ndarray, golden: np.ndarray) -> tuple[float, float]:
    """``(max |side − golden|, max |golden|)`` in numpy float64 (side widened exactly)."""
    return float(np.max(np.abs(side.astype(np.float64) - golden))), float(np.max(np.abs(golden)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("offset", [0, 3])
def test_cow_golden_and_side_read_in_place(dtype, offset):
    rng = np.random.default_rng(7)
    g_np = rng.standard_normal(N + offset) * 3.0
    source = torch.tensor(g_np)  # torch-owned memory (a numpy-owned one cannot be COW)
    s_src = (source + torch.tensor(rng.standard_normal(N + offset) * 1e-3)).to(dtype)
    # the side's exact values, read before any clone (numpy() of a COW source copies it)
    side_np = s_src.to(torch.float64).numpy()[offset:]
    want = _expected(side_np, g_np[offset:])
    golden = torch._lazy_clone(source)[offset:]  # a view of a COW storage, source alive
    side = torch._lazy_clone(s_src)[offset:]

    scan = budget.max_abs_err(side, golden, golden_max=True)

    assert (scan.max_abs_err, scan.golden_max) == want
    assert scan.lost == 0 and scan.dtype == dtype
    for cow, src in ((golden, source), (side, s_src)):
        assert COW(cow), "the scan gave a copy-on-write tensor a private copy"
        assert cow.const_data_ptr() == src.const_data_ptr() + offset * src.element_size()


def test_cow_non_finite_still_takes_the_torch_rule():
    """A NaN in a COW golden: the loop declines, the torch path applies the non-finite rule."""
    g_np = np.random.default_rng(1).standard_normal(N)
    g_np[5] = np.nan
    source = torch.tensor(g_np)  # torch-owned memory (a numpy-owned one cannot be COW)
    golden = torch._lazy_clone(source)
    side = torch.from_numpy(g_np.copy()).float()
    side[5] = 1.0  # the golden has NaN there, the side a number: one element lost

    scan = budget.max_abs_err(side, golden)

    assert scan.max_abs_err == float("inf") and scan.lost == 1
