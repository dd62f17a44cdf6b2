"""Op capture next to the TensorChecker's copy-on-write snapshots (issue 19).

An op-level run snapshots the reference's module outputs with ``torch._lazy_clone``
(``capture.snapshot``, tensors of at least ``COW_MIN_BYTES``). Reading such a tensor's storage
``data_ptr()`` makes torch copy the storage to a new address. The op recorder reads storage
addresses for every op input, so it must not: the producer of every snapshotted tensor would be
lost, and the store's copy-on-write index would point at the old address, so an in-place write
after the module boundary would overwrite the recorded op output.
"""

from __future__ import annotations

import copy
import tempfile

import numpy as np
import pytest
import torch
import torch.nn as nn
from inplace_models import ReadThenZero

from parity_tracker.capture.op_store import _ptr
from parity_tracker.capture.store import SpillDir
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode

N = 1 << 15  # 128 KiB of float32: above COW_MIN_BYTES (64 KiB), so snapshotted copy-on-write


@pytest.fixture(autouse=True)
def _temp_folder_in_tmp_path(tmp_path, monkeypatch):
    """Default dumps and spills (``tempfile.gettempdir()``) land in this test's ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(exist_ok=True)


class Double(nn.Module):
    def forward(self, x):
        return x * 2


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Double(), ReadThenZero()

    def forward(self, x):
        return self.b(self.a(x))


def test_ptr_leaves_a_copy_on_write_storage_shared():
    x = torch.arange(N, dtype=torch.float32)
    before = x.untyped_storage().data_ptr()
    copy_ = torch._lazy_clone(x)
    assert _ptr(x) == before  # the address the storage had before the lazy clone
    assert torch._C._is_cow_tensor(x) and torch._C._is_cow_tensor(copy_)  # nothing copied
    assert _ptr(x[5:]) == before  # a view: its storage's address, not its first element's


def test_in_place_write_after_a_snapshot_does_not_reach_the_recorded_output():
    ref = Pair()
    cand = copy.deepcopy(ref)
    x = torch.arange(N, dtype=torch.float32) / N
    result = run_parity(ref, cand, (x,), mode="equal", capture_ops=True, dump_mode=DumpMode.NOT)
    ops = {r["tag"]: r for r in result.ops.to_pylist()}
    # the same model on both sides: every op output is bitwise equal, x * 2 included (it was
    # compared against zeros when the in-place write reached the recorded reference output)
    doubled = ops["a@0::mul#0"]
    assert doubled["status"] == "equal", doubled
    assert {r["status"] for r in ops.values()} == {"equal"}
    # b's first op reads a's output: traced to its producer on both sides, an equal input
    assert ops["b@0::add#0"]["inputs_status"] == "passing"
    assert result.summary["status"] == "completed"


def test_spill_writes_a_copy_on_write_storage_without_copying_it(tmp_path):
    values = np.arange(N, dtype=np.float32) * 0.5 - 7.0
    x = torch.tensor(values)  # torch-allocated (a numpy-owned buffer cannot be lazily cloned)
    snapshot = torch._lazy_clone(x)
    view = x.view(64, -1)[2:5, ::2]  # a strided view: written as its storage span
    spill = SpillDir(tmp_path)
    whole, part = spill.write(x, "x.bin"), spill.write(view, "v.bin")
    assert torch._C._is_cow_tensor(x) and torch._C._is_cow_tensor(snapshot)  # still shared
    assert np.array_equal(np.fromfile(whole.path, dtype=np.float32), values)
    expected = values.reshape(64, -1)[2:5, ::2]
    assert np.array_equal(part.load().numpy(), expected)
    assert whole.nbytes == values.nbytes
    bf16 = torch.tensor(values[:1000]).to(torch.bfloat16)
    bits = bf16.view(torch.int16).numpy().view(np.uint16)  # bfloat16 has no numpy dtype
    assert np.array_equal(np.fromfile(spill.write(bf16, "b.bin").path, dtype=np.uint16), bits)
    empty = spill.write(torch.empty(0, 3), "e.bin")
    assert empty.nbytes == 0 and tuple(empty.load().shape) == (0, 3)
    spill.close()
