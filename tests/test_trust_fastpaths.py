"""Issue 19 rule "no figure is bought with a result that can differ": attacks on the fast paths.

Each test is an input that made a fast path compare other values than those captured (found by
the w5trust adversarial pass); expected values are worked out by hand or with numpy float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import parity_tracker.capture.snapshot as snapshot
from parity_tracker.capture import Snapshotter
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode

cow = pytest.mark.skipif(not snapshot._COW, reason="torch has no _lazy_clone")


@cow
@pytest.mark.parametrize("second_clone", ["user", "other_checker"])
def test_cow_snapshot_not_reused_after_uncounted_write_and_another_lazy_clone(
    monkeypatch, second_clone
):
    """A ``.data`` write bumps no version; a later lazy clone makes the source COW again."""
    monkeypatch.setattr(snapshot, "COW_MIN_BYTES", 0)
    snap = Snapshotter()
    t = torch.zeros(4)
    a = snap.take(t)
    t.data[0] = 5.0  # the source gets its own buffer; the snapshot keeps zeros
    # the user's own lazy clone, or a second checker capturing the same tensor
    keep = torch._lazy_clone(t) if second_clone == "user" else Snapshotter().take(t)
    b = snap.take(t)
    assert b.tolist() == [5.0, 0.0, 0.0, 0.0]  # the values t holds now, not the stale copy
    assert a.tolist() == [0.0] * 4 and keep.tolist() == [5.0, 0.0, 0.0, 0.0]


@cow
def test_cow_snapshot_reused_after_a_read_that_copied_the_source(monkeypatch):
    """A read through numpy gives a COW source its own buffer with the same bytes: the earlier
    snapshot is still the source's value and is reused (an op-level run's module snapshots of
    one activation once held a second buffer per block: measurement 5 grew with depth)."""
    monkeypatch.setattr(snapshot, "COW_MIN_BYTES", 0)
    snap = Snapshotter()
    t = torch.arange(4.0)
    a = snap.take(t)
    assert float(t.numpy().sum()) == 6.0  # numpy() un-shares t: same bytes, its own buffer
    keep = torch._lazy_clone(t)  # COW again, so only the bytes can tell
    assert snap.take(t) is a
    t.data[1] = 9.0  # an uncounted write after the read: never the stale copy
    b = snap.take(t)
    assert b is not a and b.tolist() == [0.0, 9.0, 2.0, 3.0] and a.tolist() == [0.0, 1.0, 2.0, 3.0]
    del keep


def _linear(weight: torch.Tensor, update: str | None) -> nn.Linear:
    m = nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        m.weight.copy_(weight)
    m.update = update
    return m


def _decode(m: nn.Module, rec) -> None:
    """Two steps; between them the reference's weight is updated in place (a decode loop)."""
    for step in range(2):
        rec(step)
        m(torch.ones(1, 4))
        if step == 0 and m.update == "no_grad":
            with torch.no_grad():
                m.weight.add_(1.0)
        elif step == 0 and m.update == "data":
            m.weight.data.add_(1.0)
        elif step == 0 and m.update == "numpy":
            m.weight.detach().numpy()[:] += 1.0


@pytest.mark.parametrize("update", ["no_grad", "data", "numpy"])
@pytest.mark.parametrize("mode", ["equal", "allclose"])
def test_weight_updated_between_decode_steps_compared_as_captured(update, mode):
    """Reference weight w at step 0 (then w + 1); candidate weight w + 1 from the start.

    Holding the weight by reference compared the reference's end value (w + 1) with the
    candidate's and said ``equal``; at capture time they differ by (w + 1) − w.
    """
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(3))
    result = run_parity(
        _linear(w, update),
        _linear(w + 1.0, None),
        drive=_decode,
        mode=mode,
        dump_mode=DumpMode.NOT,
    )
    rows = [r for r in result.modules.to_pylist() if r["tag"] == "checker_weight"]
    assert len(rows) == 1 and rows[0]["step"] == 0
    w32 = w.numpy().astype(np.float32)
    expected = np.abs((w32 + np.float32(1.0)).astype(np.float64) - w32.astype(np.float64)).max()
    assert rows[0]["status"] == "mismatch", rows[0]
    assert rows[0]["max_abs_diff"] == pytest.approx(float(expected), rel=0, abs=0)


class _ViewWeight(nn.Module):
    """A weight that is a view into a flat buffer (not held copy-on-write)."""

    def __init__(self, weight: torch.Tensor, update: bool) -> None:
        super().__init__()
        flat = torch.zeros(32)
        flat[16:].copy_(weight.reshape(-1))
        self.weight = nn.Parameter(flat[16:].view(4, 4))
        self.update = "no_grad" if update else None

    def forward(self, x):
        return x @ self.weight.t()


def test_weight_view_written_in_place_after_capture_is_an_error():
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(4))
    result = run_parity(
        _ViewWeight(w, True), _ViewWeight(w + 1.0, False), drive=_decode, mode="equal",
        dump_mode=DumpMode.NOT,
    )  # fmt: skip
    row = next(r for r in result.modules.to_pylist() if r["tag"] == "checker_weight")
    assert row["status"] == "error", row
    assert "modified in place after it was captured" in row["message"]


N_COW = 1 << 15  # 128 KiB of float32: module snapshots are copy-on-write (COW_MIN_BYTES)


class _Sub(nn.Module):
    def __init__(self, first: float) -> None:
        super().__init__()
        offset = torch.zeros(N_COW)
        offset[0] = first
        self.register_buffer("offset", offset)

    def forward(self, x):
        return torch.sub(x, self.offset)


class _Bump(nn.Module):
    """Writes its input after the previous module's output was captured."""

    def __init__(self, how: str | None) -> None:
        super().__init__()
        self.how = how

    def forward(self, y):
        if self.how == "in_place":
            y[0] += 1.0
        elif self.how == "numpy":
            y.numpy()[0] += 1.0
        elif self.how == "foreach":  # a written Tensor(a!)[] argument
            torch._foreach_add_([y], 1.0)
        return torch.mul(y, 2.0)


class _SubBump(nn.Module):
    def __init__(self, first: float, how: str | None) -> None:
        super().__init__()
        self.src, self.bump = _Sub(first), _Bump(how)

    def forward(self, x):
        return self.bump(self.src(x))


def _op_row(how: str) -> tuple[dict, float]:
    """Reference: sub gives x, then its output is written to x[0] + 1; candidate: x[0] + 1."""
    x = torch.randn(N_COW, generator=torch.Generator().manual_seed(5))
    result = run_parity(
        _SubBump(0.0, how), _SubBump(-1.0, None), inputs=(x,), mode="equal",
        dump_mode=DumpMode.NOT, capture_ops=True,
    )  # fmt: skip
    row = next(r for r in result.ops.to_pylist() if r["tag"] == "src@0::sub#0")
    x0 = np.float32(x[0].item())
    return row, abs(float(np.float32(x0 - np.float32(-1.0))) - float(x0))


@cow
def test_op_output_written_in_place_after_a_cow_module_snapshot_keeps_its_value():
    """The module snapshot's lazy clone made the sub output copy-on-write; the op store's
    address read (``storage.data_ptr()``) moved it to a new buffer, so the in-place write was
    not seen and the op row compared the written value: ``equal``."""
    row, expected = _op_row("in_place")
    assert row["status"] == "mismatch", row
    assert row["max_abs_diff"] == expected


def test_op_output_written_by_a_foreach_op_keeps_its_value():
    """``_foreach_add_`` writes a list argument; the op store copied nothing before it (the
    write target was the list), so the held sub output became x[0] + 1 and the row said
    ``equal``. Its value when sub ran is x[0] − 0 against the candidate's x[0] − (−1)."""
    row, expected = _op_row("foreach")
    assert row["status"] == "mismatch", row
    assert row["max_abs_diff"] == expected


@cow
def test_op_output_written_through_numpy_after_capture_never_equal():
    """Op captures are references; a write through ``.numpy()`` after the op bypasses dispatch
    and rewrote the held output, so the row compared x[0] + 1 with x[0] + 1: ``equal``."""
    row, _ = _op_row("numpy")
    assert row["status"] != "equal", row


class _SubWrite(nn.Module):
    """``sub`` then, in the same module call, its output written through numpy (or not)."""

    def __init__(self, first: float, write: bool, transposed: bool) -> None:
        super().__init__()
        offset = torch.zeros(N_COW)
        offset[0] = first
        self.register_buffer("offset", offset.view(256, 128) if transposed else offset)
        self.write, self.transposed = write, transposed

    def forward(self, x):
        if self.transposed:  # sub keeps the inputs' strides: a dense, non-contiguous output
            y = torch.sub(x.view(256, 128).t(), self.offset.t())
        else:
            y = torch.sub(x, self.offset)
        if self.write:
            y.numpy()[(0,) * y.dim()] += 1.0  # y[0] / y[0, 0]: the first element in memory
        return torch.mul(y, 2.0)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_op_output_rewritten_to_the_other_sides_value_is_an_error(side, transposed):
    """One side's sub gives x − (−1) at [0], the other's x − 0 and then writes +1 through
    numpy inside the same module call: the held outputs read x[0] + 1 on both sides, but the
    ops produced values differing by 1 at [0]. Main said ``equal``; the bytes changed after the
    op, so the row is an ``error`` naming the side (and mul, computed after the write on both
    sides, stays ``equal``: (x[0] + 1) · 2 both). ``transposed``: the output is dense but not
    contiguous (held with a storage-order digest)."""
    x = torch.randn(N_COW, generator=torch.Generator().manual_seed(6))
    plain, written = _SubWrite(-1.0, False, transposed), _SubWrite(0.0, True, transposed)
    ref, cand = (written, plain) if side == "reference" else (plain, written)
    result = run_parity(
        ref, cand, inputs=(x,), mode="equal", dump_mode=DumpMode.NOT, capture_ops=True
    )
    rows = {r["tag"]: r for r in result.ops.to_pylist()}
    sub = rows["model@0::sub#0"]
    assert sub["status"] == "error", sub
    assert f"the {side}'s op output changed after the op ran" in sub["message"]
    assert rows["model@0::mul#0"]["status"] == "equal"


class _Step(nn.Module):
    def forward(self, x):
        return x + 1.0


class _RemoveSpills(nn.Module):
    """Deletes (or cuts) every spilled snapshot file under ``root`` mid-forward."""

    def __init__(self, root, how: str) -> None:
        super().__init__()
        self.root, self.how = root, how

    def forward(self, x):
        for f in self.root.rglob("*.bin"):
            if self.how == "delete":
                f.unlink()
            else:
                with open(f, "r+b") as fh:
                    fh.truncate(16)
        return x * 1.0


class _Spilling(nn.Module):
    def __init__(self, root, how: str | None) -> None:
        super().__init__()
        self.a, self.b = _Step(), _Step()
        self.cut = _RemoveSpills(root, how) if how else nn.Identity()

    def forward(self, x):
        return self.cut(self.b(self.a(x)))


@pytest.mark.parametrize("how", ["delete", "truncate"])
def test_spill_files_lost_mid_run_are_errors_not_a_crash(tmp_path, monkeypatch, how):
    """Op-level runs hold module snapshots within 8 MiB; 12 MiB activations spill at once."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the run's spill root goes here
    x = torch.zeros(3 << 20)  # 12 MiB of float32
    result = run_parity(
        _Spilling(tmp_path, how), _Spilling(tmp_path, None), inputs=(x,), mode="equal",
        dump_mode=DumpMode.NOT, capture_ops=True,
    )  # fmt: skip
    rows = {r["tag"]: r for r in result.modules.to_pylist()}
    assert rows["checker_a"]["status"] == "error", rows["checker_a"]
    assert "could not be read back" in rows["checker_a"]["message"]
    assert result.record.passed is False
