"""Issue 19: small snapshots of a bulk-compared eager run are held as their bytes (``HeldBytes``).

In a module-level eager run whose small pairs are compared in bulk, the first side's small tensor
is held as its bytes (``Snapshotter.take`` with ``bytes_max``) instead of a clone, and its pair
reuses those bytes. Every reader must still get the values of capture time: the pair (held in
bulk, or compared alone when the other side cannot be held), one-sided groups and dumps at the
check, spilled snapshots. Expected values are worked out by hand or with numpy, independently of
the code under test.
"""

from __future__ import annotations

import ctypes
import gc
import math

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture import Snapshotter
from parity_tracker.compare.batch import BULK_MAX_BYTES, HeldBytes
from parity_tracker.files.dump import load_dump
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker


def _ctypes_write(t: torch.Tensor, values: torch.Tensor) -> None:
    """Overwrite ``t``'s bytes through a raw pointer (no version bump, no torch call)."""
    src = values.to(t.dtype).contiguous()
    ctypes.memmove(t.data_ptr(), src.data_ptr(), t.numel() * t.element_size())


def _writes():
    def counted(t, v):
        t.copy_(v)

    def numpy_view(t, v):
        t.numpy()[...] = v.numpy()

    return [counted, numpy_view, _ctypes_write]


class _Scale(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


class _Writer(nn.Module):
    """``leaf`` scales its input; its output is then overwritten with ``after(x)`` in place."""

    def __init__(self, scale: float, write=None, after=None) -> None:
        super().__init__()
        self.leaf = _Scale(scale)
        self.write, self.after = write, after

    def forward(self, x):
        y = self.leaf(x)  # captured here, as the leaf's output
        if self.write is not None:
            self.write(y, self.after(x))
        return y + 0.0


def _eager_pair(ref, cand, x, mode="equal", **kw):
    """Run ``ref`` then ``cand`` on ``x`` under one eager checker; (checker, held values)."""
    checker = TensorChecker(verbose=False, eager_mode=mode, **kw)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(x)
        held = {g.tag: g.captures[0].value for g in checker._groups.values()}
        cand(x)
    return checker, held


def _x() -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("write", _writes())
@pytest.mark.parametrize("mode", ["equal", "allclose"])
def test_reference_written_after_capture_is_compared_with_its_capture_time_values(write, mode):
    """Ref 2x, cand 3x; the ref's output is then overwritten with 3x: still a mismatch of x."""
    x = _x()
    ref = _Writer(2.0, write, lambda v: v * 3.0)
    checker, held = _eager_pair(ref, _Writer(3.0), x, mode)
    assert isinstance(held["checker_leaf"], HeldBytes)  # the bytes path was taken
    rows = {r["tag"]: r for r in checker.check(mode).to_rows()}
    x32 = x.numpy()
    two = (x32 * np.float32(2.0)).astype(np.float64)
    three = (x32 * np.float32(3.0)).astype(np.float64)
    assert rows["checker_leaf"]["status"] == "mismatch"
    assert rows["checker_leaf"]["max_abs_diff"] == np.abs(two - three).max()
    # the model's output is computed after the write: 3x on both sides
    assert rows["checker_model"]["status"] == "equal"


@pytest.mark.parametrize("write", _writes())
def test_reference_equal_at_capture_then_overwritten_stays_equal(write):
    """Equal at capture; the ref's output is then overwritten (NaN): its row is still equal."""
    x = _x()
    ref = _Writer(2.0, write, lambda v: torch.full_like(v, float("nan")))
    checker, held = _eager_pair(ref, _Writer(2.0), x)
    assert isinstance(held["checker_leaf"], HeldBytes)
    rows = {r["tag"]: r for r in checker.check("equal").to_rows()}
    leaf = rows["checker_leaf"]
    assert (leaf["status"], leaf["max_abs_diff"], leaf["ref_nan"]) == ("equal", 0.0, 0)
    # after the write the outputs differ: NaN on the reference only
    assert rows["checker_model"]["status"] == "mismatch"
    assert rows["checker_model"]["ref_nan"] == 64


def test_snapshotter_shares_bytes_only_while_they_are_the_same():
    snap = Snapshotter()
    snap.bytes_max = BULK_MAX_BYTES
    t = torch.zeros(4)
    a = snap.take(t)
    assert isinstance(a, HeldBytes) and snap.take(t) is a  # unchanged: one copy
    t.numpy()[1] = 1.0  # no version bump
    b = snap.take(t)
    _ctypes_write(t, torch.tensor([0.0, 0.0, 7.0, 0.0]))
    c = snap.take(t)
    assert a.load().tolist() == [0.0] * 4
    assert b is not a and b.load().tolist() == [0.0, 1.0, 0.0, 0.0]
    assert c is not b and c.load().tolist() == [0.0, 0.0, 7.0, 0.0]
    # same bytes, other dtype or shape: not shared
    d = snap.take(t.view(torch.int32))
    assert d is not c and d.dtype == torch.int32
    assert snap.take(t.view(2, 2)).shape == (2, 2)
    # larger than bytes_max, or bytes_max 0 (the default): a tensor clone, as before
    big = torch.zeros(BULK_MAX_BYTES // 4 + 1)
    assert isinstance(snap.take(big), torch.Tensor)
    snap.bytes_max = 0
    assert isinstance(snap.take(torch.zeros(4)), torch.Tensor)


def test_non_contiguous_reference_is_held_in_c_order():
    snap = Snapshotter()
    snap.bytes_max = BULK_MAX_BYTES
    t = torch.arange(6.0).view(2, 3).t()  # (3, 2), strides (1, 3)
    held = snap.take(t)
    t.numpy()[...] = -1.0
    assert held.load().tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


def test_pair_not_held_in_bulk_is_compared_from_the_bytes():
    """Another dtype or shape on the candidate: compared alone, on the capture-time values."""
    checker = TensorChecker(verbose=False, eager_mode="equal")
    r1, r2, r3 = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.ones(4), torch.ones(4)
    for tag, ref in (("d", r1), ("s", r2), ("same", r3)):
        checker.register_tensor(tag, ref, side=0)
        assert isinstance(checker._groups[(tag, 0)].captures[0].value, HeldBytes)
    for t in (r1, r2, r3):
        t.fill_(9.0)  # after capture
    checker.register_tensor("d", torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=torch.float64), side=1)
    checker.register_tensor("s", torch.ones(2, 2), side=1)
    checker.register_tensor("same", torch.ones(4), side=1)
    rows = {r["tag"]: r for r in checker.check("equal").to_rows()}
    assert (rows["d"]["status"], rows["d"]["max_abs_diff"]) == ("mismatch", 1.0)  # |4 - 5|
    assert rows["s"]["status"] == "shape_mismatch"
    assert rows["same"]["status"] == "equal"


def test_negative_zero_and_nan_held_as_bytes():
    checker = TensorChecker(verbose=False, eager_mode="equal")
    ref = torch.tensor([-0.0, float("nan"), 1.0])
    checker.register_tensor("z", ref, side=0)
    ref.fill_(5.0)
    checker.register_tensor("z", torch.tensor([0.0, float("nan"), 1.0]), side=1)
    (row,) = checker.check("equal").to_rows()
    # -0.0 == 0.0 and NaN at the same place on both sides: equal, one NaN each, no difference
    assert (row["status"], row["max_abs_diff"], row["ref_nan"], row["cand_nan"]) == (
        "equal", 0.0, 1, 1,
    )  # fmt: skip


def test_one_sided_and_missing_candidate_groups_read_capture_time_values(tmp_path):
    checker = TensorChecker(verbose=False, eager_mode="equal")
    only = torch.tensor([1.0, -2.0, 3.0])
    checker.register_tensor("only", only, side=0)
    checker.register_tensor("pair", torch.ones(2), side=0)
    checker.register_tensor("pair", torch.ones(2), side=1)
    only.numpy()[...] = 0.0  # after capture, uncounted
    with pytest.warns(UserWarning, match="already released"):
        result = checker.check("equal", dump_mode=DumpMode.ALL, dump_path=tmp_path)
    rows = {r["tag"]: r for r in result.to_rows()}
    assert rows["only"]["status"] == "missing_candidate"
    assert rows["pair"]["status"] == "equal"
    (folder,) = tmp_path.iterdir()
    dumped = {e["tag"]: t for e, t in load_dump(folder)}
    assert dumped["only"].tolist() == [1.0, -2.0, 3.0]  # the values registered
    assert "pair" not in dumped  # compared and released by the eager path


def test_group_of_three_still_reports_the_released_reference():
    checker = TensorChecker(verbose=False, eager_mode="equal")
    for side in (0, 1, 2):
        checker.register_tensor("t", torch.ones(3), side=side)
    (row,) = checker.check("equal").to_rows()
    assert row["status"] == "error" and "released the reference" in row["message"]


class _Deep(nn.Module):
    """``depth`` tanh blocks; block ``bump`` adds 1e-3 to its first element (a divergence)."""

    def __init__(self, depth: int, bump: int | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Tanh() for _ in range(depth))
        self.bump = bump

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i == self.bump:
                x = x.clone()
                x[0, 0] += 1e-3
        return x


def test_held_bytes_spill_past_the_budget_with_identical_results():
    x = torch.randn(1, BULK_MAX_BYTES // 4, generator=torch.Generator().manual_seed(1))
    runs = {}
    for budget in (160 << 10, math.inf):  # 160 KiB: the bulk bound is 10 KiB, two 4 KiB sides
        checker, held = _eager_pair(_Deep(48), _Deep(48, bump=30), x, max_resident_bytes=budget)
        assert sum(isinstance(v, HeldBytes) for v in held.values()) > 30
        runs[budget] = checker
        if budget != math.inf:
            assert checker.spilled_bytes >= 8 * BULK_MAX_BYTES  # 49 snapshots of 4 KiB, 40 fit
            assert checker.peak_resident_bytes <= budget
    rows = {b: c.check("equal").to_rows() for b, c in runs.items()}
    assert rows[160 << 10] == rows[math.inf]
    by_tag = {r["tag"]: r for r in rows[math.inf]}
    # block 30's output differs from there on; the earlier ones are equal
    assert by_tag["checker_blocks.29"]["status"] == "equal"
    assert by_tag["checker_blocks.31"]["status"] == "mismatch"


def test_resident_bytes_count_each_held_value_once():
    """6 Linear(16, 16) on a (4, 16) input: 7 distinct activations of 256 bytes, 6 weights of
    1,024 bytes and 6 biases of 64 bytes are held, each counted once; none after the pairs."""
    torch.manual_seed(0)
    ref = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)]).eval()
    cand = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)]).eval()
    cand.load_state_dict(ref.state_dict())
    checker = TensorChecker(verbose=False, eager_mode="equal")
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        x = torch.randn(4, 16)
        ref(x)
        assert checker.resident_bytes == 7 * 256 + 6 * (1024 + 64)
        cand(x)
    gc.collect()
    assert checker.resident_bytes == 0
    assert checker.check("equal").passed


class _Lin(nn.Module):
    """``x @ weight.T``; ``extra`` adds a parameter the other side lacks."""

    def __init__(self, weight: torch.Tensor, update: str | None = None, extra: bool = False):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        if extra:
            self.extra = nn.Parameter(torch.tensor([1.0, -2.0]))
        self.update = update

    def forward(self, x):
        out = x @ self.weight.t()
        if self.update == "no_grad":
            with torch.no_grad():
                self.weight.add_(1.0)
        elif self.update == "numpy":
            self.weight.detach().numpy()[...] += 1.0
        elif self.update == "ctypes":
            _ctypes_write(self.weight.detach(), self.weight.detach() + 1.0)
        if hasattr(self, "extra"):
            self.extra.data.fill_(0.0)  # after capture, uncounted
        return out


@pytest.mark.parametrize("update", ["no_grad", "numpy", "ctypes"])
def test_parameter_held_as_bytes_keeps_its_capture_time_values(update, tmp_path):
    """Ref weight w, written to w + 1 after capture; cand weight w + 1: a mismatch of 1."""
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(3))
    x = torch.ones(1, 4)
    checker, held = _eager_pair(_Lin(w, update, extra=True), _Lin(w + 1.0), x)
    assert isinstance(held["checker_weight"], HeldBytes)
    with pytest.warns(UserWarning, match="already released"):
        result = checker.check("equal", dump_mode=DumpMode.ALL, dump_path=tmp_path)
    rows = {r["tag"]: r for r in result.to_rows()}
    w32 = w.numpy()
    expected = np.abs((w32 + np.float32(1.0)).astype(np.float64) - w32.astype(np.float64)).max()
    assert (rows["checker_weight"]["status"], rows["checker_weight"]["max_abs_diff"]) == (
        "mismatch", expected,
    )  # fmt: skip
    assert rows["checker_extra"]["status"] == "missing_candidate"
    (folder,) = tmp_path.iterdir()
    dumped = {e["tag"]: t for e, t in load_dump(folder)}
    assert dumped["checker_extra"].tolist() == [1.0, -2.0]  # its values when captured


@pytest.mark.parametrize(
    "kw",
    [
        {},  # deferred: every snapshot a tensor, as before
        {"eager_mode": "equal", "dump_mode": DumpMode.NOT_EQUAL},  # a dump reads each verdict
        {"eager_mode": "equal", "align": lambda tag, r, c: None},
        {"eager_mode": "equal", "max_resident_bytes": 64 << 10},  # bulk bound under two sides
    ],
)
def test_runs_without_bulk_comparison_hold_tensors(kw):
    checker = TensorChecker(verbose=False, **kw)
    checker.register_tensor("t", torch.ones(3), side=0)
    value = checker._groups[("t", 0)].captures[0].value
    assert isinstance(value, torch.Tensor) and value.tolist() == [1.0, 1.0, 1.0]
