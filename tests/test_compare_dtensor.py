"""DTensor inputs are gathered with full_tensor() (one-process gloo group, loopback only)."""

from __future__ import annotations

import pytest
import torch

from parity_tracker.compare import compare_tensors

dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def mesh():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_dtensor_full_tensor_compared(mesh) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.arange(6.0).reshape(2, 3)
    dt = distribute_tensor(full, mesh, [Shard(0)])
    got = compare_tensors(dt, full)
    assert got.status == "equal" and got.ref_shape == (2, 3) and got.ref_device == "cpu"
    other = full.clone()
    other[1, 0] = 10.0
    got = compare_tensors(dt, other)
    assert (got.max_abs_diff, got.max_abs_diff_index) == (7.0, (1, 0))
