"""Op-store spill files kept for reuse once free (``capture.spill_pool``, issue 19 wave 10).

Expected values are numpy copies taken before anything is spilled; every reuse must read the
bytes written last, and a file is never written while a record or a loaded view reads it.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture import spill_pool
from parity_tracker.capture.spill_pool import PooledSpillDir, SpillPool

pytestmark = pytest.mark.usefixtures("fresh_pool")  # tests/conftest.py: a pool of its own


def _values(seed: int, n: int = 1 << 12) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_a_free_file_is_written_again_and_reads_the_new_bytes(fresh_pool):
    first, second = _values(0), _values(1)
    spill = PooledSpillDir(None)
    rec = spill.append(torch.from_numpy(first.copy()))
    path = rec.pack.path
    assert np.array_equal(rec.load().numpy(), first)
    del rec
    gc.collect()
    assert fresh_pool.reused == 0 and fresh_pool.created == 1 and path.exists()
    again = PooledSpillDir(None).append(torch.from_numpy(second.copy()))
    assert again.pack.path == path and again.offset == 0  # the same file, from its start
    assert fresh_pool.reused == 1 and fresh_pool.created == 1
    assert np.array_equal(again.load().numpy(), second)


def test_a_file_with_a_live_view_is_not_reused(fresh_pool):
    first, second = _values(2), _values(3)
    rec = PooledSpillDir(None).append(torch.from_numpy(first.copy()))
    path, view = rec.pack.path, rec.load()
    del rec
    gc.collect()
    other = PooledSpillDir(None).append(torch.from_numpy(second.copy()))
    assert other.pack.path != path  # the first file is still read through ``view``
    assert np.array_equal(view.numpy(), first)
    assert np.array_equal(other.load().numpy(), second)
    del view
    gc.collect()
    assert fresh_pool.free_bytes == first.nbytes  # pooled once the view is gone


def test_a_file_with_a_live_record_is_not_reused_by_its_own_writer(fresh_pool):
    a, b = _values(4), _values(5)
    spill = PooledSpillDir(None)
    kept = spill.append(torch.from_numpy(a.copy()))
    new = spill.append(torch.from_numpy(b.copy()))
    assert new.pack is kept.pack and new.offset >= a.nbytes  # appended after, never over
    assert np.array_equal(kept.load().numpy(), a)
    assert np.array_equal(new.load().numpy(), b)


def test_a_removed_pooled_file_is_an_error_and_never_reused(fresh_pool):
    a, b = _values(6), _values(7)
    rec = PooledSpillDir(None).append(torch.from_numpy(a.copy()))
    path = rec.pack.path
    path.unlink()  # removed by someone else while the run lasts
    with pytest.raises(OSError, match="removed or cut"):
        rec.load()
    del rec
    gc.collect()
    other = PooledSpillDir(None).append(torch.from_numpy(b.copy()))
    assert other.pack.path != path and fresh_pool.reused == 0
    assert np.array_equal(other.load().numpy(), b)


def test_past_the_limit_free_files_are_deleted(tmp_path, monkeypatch):
    pool = SpillPool(limit=0)
    monkeypatch.setattr(spill_pool, "pool", pool)
    rec = PooledSpillDir(None).append(torch.from_numpy(_values(8)))
    path = rec.pack.path
    del rec
    gc.collect()
    assert not path.exists() and pool.free_bytes == 0


def test_a_forked_child_never_writes_the_parents_files(fresh_pool, monkeypatch):
    rec = PooledSpillDir(None).append(torch.from_numpy(_values(9)))
    path = rec.pack.path
    del rec
    gc.collect()
    monkeypatch.setattr(os, "getpid", lambda: -7)  # as seen in a forked child
    child = PooledSpillDir(None).append(torch.from_numpy(_values(10)))
    assert child.pack.path != path and path.exists()  # the parent's file is left alone


class _Chain(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x):
        for _ in range(6):
            x = torch.tanh(x * self.scale + 0.25)
        return x


def test_op_level_runs_reuse_the_files_and_compare_the_same(fresh_pool, monkeypatch):
    from parity_tracker import ops as ops_module
    from parity_tracker.run import run_parity
    from parity_tracker.tensor_checker import DumpMode

    monkeypatch.setattr(ops_module, "DEFAULT_MAX_RESIDENT_BYTES", 1 << 16)  # everything spills
    x = torch.from_numpy(_values(11, 1 << 16))  # 256 KiB activations
    kw = {"mode": "equal", "dump_mode": DumpMode.NOT, "capture_ops": True}
    results = [run_parity(_Chain(1.0), _Chain(1.001), inputs=(x,), **kw) for _ in range(2)]
    assert fresh_pool.created >= 1 and fresh_pool.reused >= fresh_pool.created
    ops = [{r["tag"]: r for r in res.ops.to_pylist()} for res in results]
    assert ops[0].keys() == ops[1].keys()
    for tag, row in ops[0].items():  # the second run, written over reused files, agrees
        assert ops[1][tag]["status"] == row["status"]
        assert ops[1][tag]["max_abs_diff"] == row["max_abs_diff"]
    last = max((t for t in ops[1] if "tanh" in t), key=lambda t: int(t.rsplit("#", 1)[1]))
    out = ops[1][last]
    assert out["status"] == "mismatch"
    a, b = x.numpy().copy(), x.numpy().copy()  # the float32 forwards, in numpy
    for _ in range(6):
        a = np.tanh(a * np.float32(1.0) + np.float32(0.25))
        b = np.tanh(b * np.float32(1.001) + np.float32(0.25))
    assert out["max_abs_diff"] == pytest.approx(float(np.max(np.abs(a - b))), rel=1e-4)


def test_an_explicit_spill_folder_outside_the_temp_folder_is_left_empty(tmp_path, fresh_pool):
    own = tmp_path.parent / f"{tmp_path.name}-own"  # not inside the (patched) temp folder
    spill = PooledSpillDir(own)
    rec = spill.append(torch.from_numpy(_values(12)))
    assert np.array_equal(rec.load().numpy(), _values(12))
    del rec
    gc.collect()
    spill.close()
    assert fresh_pool.created == 0 and not any(p.is_file() for p in own.rglob("*"))


def test_the_pool_counts_a_free_file_by_its_length_on_disk(fresh_pool):
    values = [_values(20 + i) for i in range(4)]  # 16 KiB each, at page-aligned offsets
    spill = PooledSpillDir(None)
    recs = [spill.append(torch.from_numpy(v.copy())) for v in values]
    path = recs[0].pack.path
    del recs
    gc.collect()
    assert fresh_pool.free_bytes == os.path.getsize(path) == 4 * values[0].nbytes
    small = PooledSpillDir(None).append(torch.from_numpy(values[0].copy()))
    assert small.pack.path == path and fresh_pool.free_bytes == 0
    del small
    gc.collect()
    assert fresh_pool.free_bytes == 4 * values[0].nbytes  # the file did not shrink
