"""Issue 19, item 3: copy-on-write module snapshots never hold other values than they captured.

A snapshot of a plain contiguous CPU tensor is a ``torch._lazy_clone`` plus the content hash of
the source when taken. Expected values are worked out by hand (zeros, ones, one element set).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import parity_tracker.capture.snapshot as snapshot
from parity_tracker.capture import Snapshotter
from parity_tracker.capture.store import Spilled
from parity_tracker.compare.pairing import PairComparer
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode

pytestmark = pytest.mark.skipif(not snapshot._COW, reason="torch has no _lazy_clone")


@pytest.fixture(autouse=True)
def cow_for_small_tensors(monkeypatch):
    monkeypatch.setattr(snapshot, "COW_MIN_BYTES", 0)


def _writes():
    def inplace(t):
        t.add_(1)

    def data(t):
        t.data[1] = 1.0

    def numpy_after(t):
        t.numpy()[1] = 1.0

    def dlpack_after(t):
        torch.from_dlpack(torch.utils.dlpack.to_dlpack(t))[1] = 1.0

    return [inplace, data, numpy_after, dlpack_after]


@pytest.mark.parametrize("write", _writes())
def test_cow_snapshot_keeps_the_values_of_capture_time(write):
    snap = Snapshotter()
    t = torch.zeros(4)
    a = snap.take(t)
    assert torch._C._is_cow_tensor(a)  # no bytes copied at capture
    write(t)
    assert t.numpy()[1] == 1.0  # the source did change
    np.testing.assert_array_equal(a.numpy(), np.zeros(4))
    assert snap.intact(a)
    b = snap.take(t)  # the changed source gets a new snapshot
    assert b is not a and b.numpy()[1] == 1.0


def test_cow_snapshot_shared_while_unchanged_and_not_after_a_data_write():
    snap = Snapshotter()
    t = torch.zeros(4)
    a = snap.take(t)
    assert snap.take(t) is a  # output of one module, input of the next: one snapshot
    t.data[0] = 2.0  # no version bump; the write gives t its own storage
    b = snap.take(t)
    assert b is not a and b.tolist() == [2.0, 0.0, 0.0, 0.0] and a.tolist() == [0.0] * 4


def test_views_and_partial_storages_are_cloned_not_shared():
    snap = Snapshotter()
    big = torch.zeros(8)
    assert not torch._C._is_cow_tensor(snap.take(big[2:6]))  # a view pins no buffer
    assert not torch._C._is_cow_tensor(snap.take(torch.zeros(2, 3).t()))
    assert not torch._C._is_cow_tensor(big)


def test_write_through_an_earlier_numpy_view_is_an_error_never_a_verdict():
    snap = Snapshotter()
    t = torch.zeros(4)
    view = t.numpy()  # taken BEFORE the capture: copy-on-write cannot see writes through it
    a = snap.take(t)
    view[2] = 5.0
    assert a.tolist() == [0.0, 0.0, 5.0, 0.0]  # the snapshot changed with it...
    assert not snap.intact(a)
    comp = PairComparer().compare("t", a, torch.tensor([0.0, 0.0, 5.0, 0.0]), "equal", Tolerances())
    assert comp.status == "equal"  # ...so a plain comparison would call it equal,
    checked = snap.verified("t", a, torch.zeros(4), comp)
    assert checked.status == "error" and "changed after it was captured" in checked.message


class _Cache(nn.Module):
    """Writes step k's value into a numpy view made at construction; returns the buffer."""

    def __init__(self, bump):
        super().__init__()
        self.buf = torch.zeros(4)
        self.view = self.buf.numpy()
        self.bump, self.t = bump, 0

    def forward(self, x):
        self.view[self.t] = x[0].item() + (1.0 if self.t == self.bump else 0.0)
        self.t += 1
        return self.buf


class _Model(nn.Module):
    def __init__(self, bump):
        super().__init__()
        self.cache = _Cache(bump)

    def forward(self, x):
        return self.cache(x) * 1.0


def _drive(model, rec):
    for step in range(3):
        rec(step)
        model(torch.full((4,), float(step + 1)))


@pytest.mark.parametrize("mode", ["equal", "allclose"])
def test_run_with_a_cache_written_through_an_old_view_never_reports_equal(mode):
    result = run_parity(_Model(None), _Model(1), drive=_drive, mode=mode, dump_mode=DumpMode.NOT)
    rows = {(r["tag"], r["step"]): r for r in result.modules.to_pylist()}
    # the reference's buffer was rewritten after steps 0 and 1 were captured: not compared
    for step in (0, 1):
        row = rows[("checker_cache", step)]
        assert row["status"] == "error", row
    # the candidate adds 1.0 at step 1: the model output differs there by exactly 1.0
    out = rows[("checker_model", 1)]
    assert out["status"] == "mismatch" and out["max_abs_diff"] == 1.0
    assert result.record.passed is False


def test_altered_cow_snapshot_is_not_spilled_as_if_intact(tmp_path):
    snap = Snapshotter()
    store = snapshot.SnapshotStore(0, tmp_path)  # budget 0: every snapshot spills at once
    store.intact = snap.intact

    class Cap:
        value = None

    t = torch.zeros(4)
    view = t.numpy()
    cap = Cap()
    cap.value = a = snap.take(t)
    view[0] = 3.0
    store.admit(a, cap)
    assert cap.value is a  # kept in memory: the comparison's check reports it
    assert not snap.intact(a)
    intact_cap = Cap()
    intact_cap.value = b = snap.take(torch.ones(4))
    store.admit(b, intact_cap)
    assert isinstance(intact_cap.value, Spilled)
    assert intact_cap.value.load().tolist() == [1.0] * 4
    store.clear()


def test_channels_last_verdict_not_reused_after_unversioned_write():
    pairs = PairComparer()
    ref = torch.zeros(1, 2, 3, 3).to(memory_format=torch.channels_last)
    cand = torch.zeros(1, 2, 3, 3).to(memory_format=torch.channels_last)
    assert pairs.compare("t", ref, cand, "equal", Tolerances()).status == "equal"
    cand.numpy()[0, 1, 2, 2] = 4.0  # no version bump
    comp = pairs.compare("t", ref, cand, "equal", Tolerances())
    assert comp.status == "mismatch" and comp.max_abs_diff == 4.0
