"""An op-level run spills each buffer once: module snapshots borrow the op store's file (issue 19).

In an op-level run the reference's module outputs are snapshotted copy-on-write
(``torch._lazy_clone``) while the op store holds the op output they came from: one buffer, two
holders. ``SnapshotStore`` then reads the op store's spill file instead of writing the same
bytes again. The copy must never lie: an in-place write after a capture must not reach what
either holder compares. The expected statuses below follow from values worked out by hand
(``2x`` differs from ``2x + 1`` and from ``0`` for every ``x`` in ``[1, 2)``).
"""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch
import torch.nn as nn
from inplace_models import ReadThenZero

import parity_tracker.ops as ops_module
import parity_tracker.tensor_checker as checker_module
from parity_tracker.capture.snapshot import SnapshotStore
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode

N = 1 << 15  # 128 KiB of float32: above COW_MIN_BYTES (64 KiB), so snapshotted copy-on-write
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _temp_folder_in_tmp_path(tmp_path, monkeypatch):
    """Default spills (``tempfile.gettempdir()``) land in this test's ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(exist_ok=True)


@pytest.fixture
def borrows(monkeypatch):
    """Bytes of snapshots that read an op-store file (a spy on ``SnapshotStore._borrow``)."""
    seen: list[int] = []
    real = SnapshotStore._borrow

    def spy(self, entry, lent, address, version):
        ok = real(self, entry, lent, address, version)
        if ok:
            seen.append(lent.nbytes)
        return ok

    monkeypatch.setattr(SnapshotStore, "_borrow", spy)
    return seen


def _budgets(monkeypatch, ops_bytes: int, snap_bytes: int) -> None:
    monkeypatch.setattr(ops_module, "DEFAULT_MAX_RESIDENT_BYTES", ops_bytes)
    monkeypatch.setattr(checker_module, "OPS_RUN_RESIDENT_BYTES", snap_bytes)


class Scale(nn.Module):
    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


class ShiftThenDouble(nn.Module):
    """``(x + shift) * 2``, then ``+ bump`` in place: a write between the op and the hook."""

    def __init__(self, shift: float, bump: float):
        super().__init__()
        self.shift, self.bump = shift, bump

    def forward(self, x):
        y = (x + self.shift) * 2
        y.add_(self.bump)
        return y


class Chain(nn.Module):
    def __init__(self, *mods: nn.Module):
        super().__init__()
        self.mods = nn.ModuleList(mods)

    def forward(self, x):
        for m in self.mods:
            x = m(x)
        return x


def _tail() -> list[nn.Module]:
    """Enough 128 KiB outputs after the interesting modules to push them out of any budget."""
    return [Scale(1.0 + i / 64) for i in range(24)]


def _run(ref: nn.Module, cand: nn.Module, x: torch.Tensor):
    result = run_parity(ref, cand, (x,), mode="equal", capture_ops=True, dump_mode=DumpMode.NOT)
    ops = {r["tag"]: r for r in result.ops.to_pylist()}
    mods = {r["tag"]: r for r in result.modules.to_pylist()}
    return ops, mods


def _x() -> torch.Tensor:
    return torch.tensor(1.0 + np.arange(N, dtype=np.float32) / N)  # in [1, 2)


def _can_borrow(ops_bytes: int, snap_bytes: int) -> bool:
    """Snapshots spill (past their budget) while the op store still holds the buffer (> 0)."""
    return ops_bytes > 0 and snap_bytes < 64 * MiB


BUDGETS = [(0, 0), (256 << 10, 0), (256 << 10, 256 << 10), (1 * MiB, 512 << 10), (0, 64 * MiB)]


@pytest.mark.parametrize(("ops_bytes", "snap_bytes"), BUDGETS)
def test_identical_models_borrow_and_stay_equal(monkeypatch, borrows, ops_bytes, snap_bytes):
    _budgets(monkeypatch, ops_bytes, snap_bytes)
    ref = Chain(Scale(2.0), *_tail())
    ops, mods = _run(ref, Chain(Scale(2.0), *_tail()), _x())
    assert {r["status"] for r in ops.values()} == {"equal"}
    assert {r["status"] for r in mods.values()} == {"equal"}
    if _can_borrow(ops_bytes, snap_bytes):
        assert sum(borrows) >= 8 * N * 4  # at least 8 of the 25 module outputs borrowed


@pytest.mark.parametrize(("ops_bytes", "snap_bytes"), BUDGETS)
def test_write_between_op_and_hook_never_lies(monkeypatch, borrows, ops_bytes, snap_bytes):
    # reference: mul gives 2x, then add_ makes it 2x + 1 before the module hook sees it;
    # candidate: mul gives 2x + 1 (the reference's value AFTER the write), add_ adds 0
    _budgets(monkeypatch, ops_bytes, snap_bytes)
    ref = Chain(ShiftThenDouble(0.0, 1.0), *_tail())
    cand = Chain(ShiftThenDouble(0.5, 0.0), *_tail())
    ops, mods = _run(ref, cand, _x())
    assert ops["mods.0@0::mul#0"]["status"] == "mismatch"  # 2x vs 2x + 1, as captured
    assert ops["mods.0@0::add_#0"]["status"] == "equal"  # 2x + 1 on both sides
    assert mods["checker_mods.0"]["status"] == "equal"  # the hook saw 2x + 1 on both sides
    assert mods["checker_mods.1_input_0"]["status"] == "equal"
    if _can_borrow(ops_bytes, snap_bytes):
        assert borrows


@pytest.mark.parametrize(("ops_bytes", "snap_bytes"), BUDGETS)
def test_write_after_op_and_hook_never_lies(monkeypatch, borrows, ops_bytes, snap_bytes):
    # reference: a's output is 2x, then b zeroes it in place; candidate: a's output is 0, the
    # value the reference's buffer holds after b's write. Equal would be a lie.
    _budgets(monkeypatch, ops_bytes, snap_bytes)
    ref = Chain(Scale(2.0), ReadThenZero(), *_tail())
    cand = Chain(Scale(0.0), ReadThenZero(), *_tail())
    ops, mods = _run(ref, cand, _x())
    assert ops["mods.0@0::mul#0"]["status"] == "mismatch"  # 2x vs 0
    assert mods["checker_mods.0"]["status"] == "mismatch"
    assert mods["checker_mods.1_input_0"]["status"] == "mismatch"  # b's input, before b's write
    assert ops["mods.1@0::add#0"]["status"] == "mismatch"  # 2x + 1 vs 1
    assert ops["mods.1@0::add#1"]["status"] == "mismatch"  # (2x + 1) + 0 vs 1 + 0
    if _can_borrow(ops_bytes, snap_bytes):
        assert borrows


class Leak(nn.Module):
    """``2x``, keeping a numpy view of its output's buffer (taken before the module hook)."""

    def forward(self, x):
        y = x * 2
        self.view = y.numpy()
        return y


class Poke(nn.Module):
    """Zeroes the previous module's output through that numpy view: torch sees no write."""

    def __init__(self, leak: Leak | None):
        super().__init__()
        self.leak = [leak]  # not a submodule

    def forward(self, x):
        if self.leak[0] is not None:
            self.leak[0].view[:] = 0
        return x + 0


@pytest.mark.parametrize(("ops_bytes", "snap_bytes"), BUDGETS)
def test_raw_write_after_the_hook_is_an_error_not_equal(
    monkeypatch, borrows, ops_bytes, snap_bytes
):
    # the reference's a outputs 2x, then its buffer is zeroed through a numpy view taken
    # before the hook; the candidate's a outputs 0. The snapshot (and the op store's file,
    # which the snapshot may borrow) would then hold 0: the row must not say equal.
    _budgets(monkeypatch, ops_bytes, snap_bytes)
    leak = Leak()
    ref = Chain(leak, Poke(leak), *_tail())
    cand = Chain(Scale(0.0), Poke(None), *_tail())
    _, mods = _run(ref, cand, _x())
    row = mods["checker_mods.0"]
    # spilled before the write: the file holds 2x (mismatch); after it: the snapshot no longer
    # hashes as when taken (error). Never equal.
    assert row["status"] in ("mismatch", "error"), row
    if row["status"] == "error":
        assert "snapshot changed after it was captured" in row["message"]


def test_content_hash_in_place_same_digest_and_leaves_copy_on_write_shared():
    import xxhash

    from parity_tracker.compare.hashing import content_hash, content_hash_in_place

    values = (np.arange(N, dtype=np.float32) * 0.25 - 3.0).reshape(64, -1)
    t = torch.tensor(values)
    snap = torch._lazy_clone(t)
    address = torch._C._data_address(snap)
    # the documented byte stream: header "{dtype}|{shape}|", then the C-order bytes
    expected = xxhash.xxh3_64(b"float32|(64, 512)|" + values.tobytes()).hexdigest()
    assert content_hash_in_place(snap) == expected
    assert torch._C._is_cow_tensor(snap) and torch._C._data_address(snap) == address
    ints = torch.arange(7, dtype=torch.int64)
    assert (
        content_hash_in_place(ints)
        == xxhash.xxh3_64(b"int64|(7,)|" + np.arange(7, dtype=np.int64).tobytes()).hexdigest()
    )
    # what it cannot read in place goes through content_hash (same digest by definition)
    for other in (t.T, t.to(torch.bfloat16), torch.empty(0, 3), t.requires_grad_()):
        assert content_hash_in_place(other) == content_hash(other)


def test_spills_share_one_file_freed_span_by_span(tmp_path):
    import gc

    from parity_tracker.capture.store import SpillDir

    values = np.arange(N, dtype=np.float32) * 0.5 - 7.0
    spill = SpillDir(tmp_path)
    x = torch.tensor(values)
    view = x.view(64, -1)[2:5, ::2]  # a strided view: written as its storage span
    ints = torch.arange(1000, dtype=torch.int64)
    recs = [spill.append(x), spill.append(view), spill.append(ints), spill.append(x[:0])]
    (pack,) = list(spill.path.iterdir())  # one file, however many records
    assert {r.path for r in recs} == {pack}
    x.mul_(0)  # the records hold the bytes of the time of writing
    assert np.array_equal(recs[0].load().numpy(), values)
    assert np.array_equal(recs[1].load().numpy(), values.reshape(64, -1)[2:5, ::2])
    assert np.array_equal(recs[2].load().numpy(), np.arange(1000))
    assert tuple(recs[3].load().shape) == (0,)
    loaded = recs[0].load()
    del recs[0]
    gc.collect()
    assert np.array_equal(loaded.numpy(), values)  # a loaded view outlives its record
    assert np.array_equal(recs[1].load().numpy(), np.arange(1000))
    del recs[:]
    gc.collect()
    assert not pack.exists()  # the file goes with its last record
    assert np.array_equal(loaded.numpy(), values)  # ... and with its file
    again = spill.append(ints)  # a new file for the next spill
    assert again.path != pack and np.array_equal(again.load().numpy(), np.arange(1000))
    spill.close()


def test_a_cut_or_removed_pack_file_is_an_error_never_other_bytes(tmp_path):
    from parity_tracker.capture.store import SpillDir

    spill = SpillDir(tmp_path)
    ints = torch.arange(1 << 12, dtype=torch.int64)  # 32 KiB
    first = spill.append(ints)
    with open(first.path, "r+b") as fh:
        fh.truncate(16)  # cut by someone else ...
    second = spill.append(ints)  # ... then written past the cut: a hole would read zeros
    with pytest.raises(OSError, match="removed or cut"):
        first.load()
    assert second.path != first.path  # a fresh file after the damaged one
    assert np.array_equal(second.load().numpy(), np.arange(1 << 12))
    second.path.unlink()  # removed: an error too, though the open file still has the bytes
    with pytest.raises(OSError, match="removed or cut"):
        second.load()
    spill.close()
