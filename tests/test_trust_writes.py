"""Issue 13, item 1: writes that bypass the version counter never yield a stale "equal".

Expected values are worked out by hand: the candidate writes ``kv + 1`` instead of ``kv`` into
one row of its cache, so that row differs by exactly 1.0 from then on.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture import Snapshotter
from parity_tracker.compare.pairing import PairComparer
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker

STEPS = 3


def _write_data(buf, t, v):
    buf.data[t] = v


def _write_numpy(buf, t, v):
    buf.numpy()[t] = v.numpy()


def _write_dlpack(buf, t, v):
    torch.from_dlpack(torch.utils.dlpack.to_dlpack(buf))[t] = v


class KVCache(nn.Module):
    """A preallocated buffer written in place at each decode step; returns the same buffer."""

    def __init__(self, write, bump_at: int | None) -> None:
        super().__init__()
        self.buf = torch.zeros(STEPS, 4)  # a plain attribute: not a registered buffer
        self.write, self.bump_at, self.t = write, bump_at, 0

    def forward(self, kv: torch.Tensor) -> torch.Tensor:
        self.write(self.buf, self.t, kv + 1 if self.t == self.bump_at else kv)
        self.t += 1
        return self.buf


class Decoder(nn.Module):
    def __init__(self, write, bump_at: int | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(4, 4)
        self.cache = KVCache(write, bump_at)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cache(self.proj(x)).sum(0)


def _drive(model, rec):
    for step in range(STEPS):
        rec(step)
        model(torch.full((4,), float(step)))


def _cache_rows(result):
    return {r["step"]: r for r in result.modules.to_pylist() if r["tag"] == "checker_cache"}


@pytest.mark.parametrize("write", [_write_data, _write_numpy, _write_dlpack])
@pytest.mark.parametrize("mode", ["equal", "allclose"])
def test_cache_written_without_version_bump_is_compared_per_step(write, mode):
    ref, cand = Decoder(write, None), Decoder(write, 1)
    result = run_parity(ref, cand, drive=_drive, mode=mode, dump_mode=DumpMode.NOT)
    rows = _cache_rows(result)
    assert rows[0]["status"] == "equal"
    for step in (1, 2):
        assert rows[step]["status"] == "mismatch", rows[step]
        assert rows[step]["max_abs_diff"] == 1.0  # row 1 holds kv + 1 vs kv from step 1 on
    first = result.record.first_divergence
    assert (first.tag, first.step) == ("checker_cache", 1)
    assert result.record.passed is False


@pytest.mark.parametrize("eager", [None, "equal"])
def test_checker_paths_agree_on_the_cache(eager):
    checker = TensorChecker(verbose=False, eager_mode=eager)
    ref, cand = Decoder(_write_data, None), Decoder(_write_data, 1)
    with (
        module_register_tensor_checker(ref, checker, side=0),
        module_register_tensor_checker(cand, checker, side=1),
        torch.no_grad(),
    ):
        for model in (ref, cand):
            for step in range(STEPS):
                checker.step = step
                model(torch.full((4,), float(step)))
        out = checker.check("equal", verbose=False)
    rows = {(r.tag, r.step): r for r in out.results}
    assert [rows[("checker_cache", s)].status for s in range(STEPS)] == [
        "equal",
        "mismatch",
        "mismatch",
    ]
    assert rows[("checker_cache", 2)].comparison.max_abs_diff == 1.0
    assert (out.first_divergence.tag, out.first_divergence.step) == ("checker_cache", 1)


@pytest.mark.parametrize("write", [_write_data, _write_numpy, _write_dlpack])
def test_snapshot_not_reused_after_unversioned_write(write):
    snap = Snapshotter()
    t = torch.zeros(2, 3)
    a = snap.take(t)
    assert snap.take(t) is a  # unchanged: shared
    version = t._version
    write(t, 1, torch.ones(3))
    assert t._version == version  # the write really bypassed the counter
    b = snap.take(t)
    assert b is not a
    np.testing.assert_array_equal(a.numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(b.numpy(), [[0, 0, 0], [1, 1, 1]])


def test_snapshot_not_reused_after_data_swap():
    snap = Snapshotter()
    t = torch.zeros(3)
    a = snap.take(t)
    t.data = torch.ones(5)  # new storage and shape, same object
    b = snap.take(t)
    assert b is not a and b.tolist() == [1.0] * 5


def test_snapshot_of_a_tensor_with_gaps_is_always_a_new_copy():
    snap = Snapshotter()
    t = torch.zeros(3, 4)[:, :2]  # its bytes are not one dense span: never re-read, copied
    assert snap.take(t) is not snap.take(t)


def test_channels_last_snapshot_is_shared_and_rechecked():
    snap = Snapshotter()
    t = torch.zeros(1, 2, 3, 3).to(memory_format=torch.channels_last)
    a = snap.take(t)
    assert snap.take(t) is a
    t.numpy()[0, 1, 2, 2] = 7.0  # numpy follows the strides: element (0, 1, 2, 2)
    b = snap.take(t)
    assert b is not a and b[0, 1, 2, 2].item() == 7.0 and a.abs().sum().item() == 0.0


def test_pair_verdict_not_reused_after_unversioned_write():
    pairs = PairComparer()
    ref, cand = torch.zeros(4), torch.zeros(4)
    tol = Tolerances()
    assert pairs.compare("t", ref, cand, "equal", tol).status == "equal"
    cand.numpy()[2] = 3.0  # no version bump
    comp = pairs.compare("t", ref, cand, "equal", tol)
    assert comp.status == "mismatch" and comp.max_abs_diff == 3.0


def test_pair_verdict_reused_for_owned_snapshots():
    snap = Snapshotter()
    calls = []
    pairs = PairComparer(owned=snap.owns, on_compared=lambda *a: calls.append(a[0]))
    ref, cand = snap.take(torch.ones(4)), snap.take(torch.ones(4))
    first = pairs.compare("a", ref, cand, "equal", Tolerances())
    assert pairs.compare("b", ref, cand, "equal", Tolerances()) is first  # no second compare
    assert calls == ["a", "b"]  # the callback still hears of both tags


def test_storage_digest_sees_every_byte_of_dense_layouts():
    from parity_tracker.compare.hashing import storage_digest

    for t in (torch.zeros(4, 6), torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last)):
        before = storage_digest(t)
        t.numpy()[(0,) * t.dim()] = 1.0  # the first element: a write the version never sees
        assert storage_digest(t) != before
    assert storage_digest(torch.zeros(4, 6)[:, :3]) is None  # gaps: not read, never trusted
    assert storage_digest(torch.zeros(3, 1).expand(3, 4)) is None  # broadcast view
