"""Adversarial tests of issue 19 wave 7 (helper w7break): small snapshots held as their bytes.

In a module-level eager run whose small pairs are compared in bulk, a small tensor (≤ 4 KiB) is
held from its capture as a copy of its bytes (``compare.batch.HeldBytes``), small whole-storage
parameters likewise, and a re-captured activation reuses an existing copy only when its bytes
match; ``capture.heap_trim`` calls ``malloc_trim`` while captures come and go. Every verdict here
is checked against values copied by the test's own hooks at the moment the checker captures
(inputs in a forward pre-hook, outputs in a forward hook), compared with numpy: never against
the code's own output.
"""

from __future__ import annotations

import ctypes
import math
import random

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture import heap_trim
from parity_tracker.capture.heap_trim import HeapTrimmer
from parity_tracker.compare.batch import BULK_MAX_BYTES, HeldBytes
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

# ---------------------------------------------------------------------------------------------
# harness: the checker's rows, and the truth taken by our own hooks at capture time


def _truth_hooks(model: nn.Module, store: dict[str, torch.Tensor]) -> list:
    """Copy every module's first input and its output when the checker captures them."""
    handles = []
    for name, mod in model.named_modules():
        tag = "checker_" + (name or "model")

        def pre(_m, args, tag=tag):
            store[tag + "_input_0"] = args[0].detach().clone()

        def post(_m, _args, out, tag=tag):
            store[tag] = out.detach().clone()

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    return handles


def _expected(a: torch.Tensor, b: torch.Tensor) -> tuple[str, float | None]:
    """Equal-mode status and max abs diff of two captured values, from numpy alone."""
    if tuple(a.shape) != tuple(b.shape):
        return "shape_mismatch", None
    if a.dtype == torch.bool or b.dtype == torch.bool:
        same = np.array_equal(a.numpy(), b.numpy())
        return ("equal", 0.0) if same and a.dtype == b.dtype else ("mismatch", None)
    wide = torch.complex128 if a.is_complex() or b.is_complex() else torch.float64
    an, bn = a.to(wide).numpy(), b.to(wide).numpy()
    if a.dtype == b.dtype and np.array_equal(an, bn, equal_nan=True):
        return "equal", 0.0
    diff = np.abs(an - bn)
    finite = diff[~np.isnan(diff)]
    return "mismatch", float(finite.max()) if finite.size else None


def _run_pair(ref, cand, x, mode="equal", checker=None, **kw):
    """Hook both models on one eager checker and on our truth hooks; run ref then cand."""
    truth_r: dict[str, torch.Tensor] = {}
    truth_c: dict[str, torch.Tensor] = {}
    hooks = _truth_hooks(ref, truth_r) + _truth_hooks(cand, truth_c)
    c = checker or TensorChecker(verbose=False, eager_mode=mode, **kw)
    try:
        with (
            module_register_tensor_checker(ref, c),
            module_register_tensor_checker(cand, c),
            torch.no_grad(),
        ):
            ref(x.clone())
            cand(x.clone())
    finally:
        for h in hooks:
            h.remove()
    rows = {r["tag"]: r for r in c.check(mode).to_rows()}
    return rows, truth_r, truth_c


def _assert_rows_match_truth(rows, truth_r, truth_c, mode="equal"):
    assert set(truth_r) <= set(rows), sorted(set(truth_r) - set(rows))  # nothing dropped
    for tag, a in truth_r.items():
        status, diff = _expected(a, truth_c[tag])
        got = rows[tag]["status"]
        if mode == "allclose" and got == "close":  # close: not bitwise equal, within tolerance
            got = "mismatch"
        assert got == status, (tag, got, status, rows[tag].get("message"))
        if status == "mismatch" and diff is not None and a.dtype == truth_c[tag].dtype:
            assert math.isclose(rows[tag]["max_abs_diff"], diff, rel_tol=1e-12), tag


class _Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class _Chain(nn.Module):
    def __init__(self, *mods: nn.Module) -> None:
        super().__init__()
        self.st = nn.ModuleList(mods)

    def forward(self, x):
        for m in self.st:
            x = m(x)
        return x


def _ctypes_add(t: torch.Tensor, k: float) -> torch.Tensor:
    """``t += k`` through a raw pointer: no version bump, no torch call on ``t``."""
    src = (t + k).contiguous()
    ctypes.memmove(t.data_ptr(), src.data_ptr(), t.nbytes)
    return t


# ---------------------------------------------------------------------------------------------
# activations rewritten after their capture by a later module


_LATER_WRITES = {
    "add_": lambda y, k: y.add_(k),
    "numpy": lambda y, k: (y.numpy().__setitem__(Ellipsis, y.numpy() + k), y)[1],
    "ctypes": _ctypes_add,
    "set_": lambda y, k: y.set_((y + k).contiguous()),
    "resize_": lambda y, k: y.resize_(y.numel() // 2).add_(k),
}


@pytest.mark.parametrize("write", sorted(_LATER_WRITES))
@pytest.mark.parametrize("mode", ["equal", "allclose"])
def test_output_rewritten_in_place_by_the_next_module(write, mode):
    """``a`` returns 2x; ``b`` rewrites that very tensor (+1 ref, +2 cand) and returns it.

    At capture: ``a``'s output equal (2x both sides), ``b``'s input equal, ``b``'s output and
    everything after differ by 1.
    """
    fn = _LATER_WRITES[write]

    def model(k):
        return _Chain(_Fn(lambda v: v * 2), _Fn(lambda y: fn(y, k)), _Fn(lambda y: y + 0))

    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    rows, tr, tc = _run_pair(model(1.0), model(2.0), x, mode)
    _assert_rows_match_truth(rows, tr, tc, mode)
    assert rows["checker_st.0"]["status"] == "equal"
    assert rows["checker_st.1"]["status"] != "equal"


def test_write_through_a_view_of_a_larger_buffer():
    """A module's output is ``buf[:8]``; the parent then adds k to the buffer in place."""

    class M(nn.Module):
        def __init__(self, k: float) -> None:
            super().__init__()
            self.register_buffer("buf", torch.zeros(256), persistent=False)
            self.k, self.a, self.b = k, _Fn(lambda v: v), _Fn(lambda v: v * 1)

        def forward(self, x):
            self.buf.zero_()
            self.buf[:8] = x[0, :8]
            v = self.a(self.buf[:8])
            self.buf[:8] += self.k
            return self.b(self.buf[:8]) + v

    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(4))
    rows, tr, tc = _run_pair(M(1.0), M(2.0), x)
    _assert_rows_match_truth(rows, tr, tc)
    assert rows["checker_a"]["status"] == "equal"  # x[0] on both sides when captured
    assert rows["checker_b"]["max_abs_diff"] == pytest.approx(1.0, abs=1e-6)


def test_module_mutating_its_own_input_before_returning_it():
    """``mul_`` then ``add_`` on the input object: inputs captured before, outputs after."""

    def model(k):
        return _Chain(_Fn(lambda v: v * 1), _Fn(lambda v: v.mul_(k)), _Fn(lambda v: v.add_(1)))

    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(5))
    rows, tr, tc = _run_pair(model(2.0), model(3.0), x)
    _assert_rows_match_truth(rows, tr, tc)
    assert rows["checker_st.1_input_0"]["status"] == "equal"
    assert rows["checker_st.1"]["status"] == "mismatch"


# ---------------------------------------------------------------------------------------------
# dtypes, shapes, sizes and layouts


def _make(dtype: torch.dtype, shape: tuple, seed: int) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3
    if dtype == torch.complex64:
        return torch.complex(x, -x)
    if dtype == torch.bool:
        return x > 0
    return x.to(dtype)


_DTYPES = [torch.bool, torch.int8, torch.uint8, torch.float16, torch.bfloat16, torch.complex64]
_SHAPES = [(), (0,), (3, 0), (7,), (32, 32)]


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("shape", _SHAPES, ids=str)
@pytest.mark.parametrize("differs", [False, True])
def test_dtypes_and_shapes(dtype, shape, differs):
    x = _make(dtype, shape, 0)
    other = _make(dtype, shape, 1) if differs else x.clone()
    rows, tr, tc = _run_pair(
        _Chain(_Fn(lambda v: v.clone())), _Chain(_Fn(lambda v: other.clone())), x
    )
    _assert_rows_match_truth(rows, tr, tc)


_LAYOUTS = {
    "transposed": lambda v: v.t(),
    "expanded": lambda v: v[:1].expand(16, 16),
    "channels_last": lambda v: v.reshape(1, 4, 8, 8).contiguous(memory_format=torch.channels_last),
    "neg_bit": lambda v: v._neg_view(),
    "conj_bit": lambda v: torch.complex(v, v).conj(),
    "strided": lambda v: v[::3, ::2],
    "stride0_4096B": lambda v: v[:1, :1].expand(1024, 1),
    "stride0_4100B": lambda v: v[:1, :1].expand(1025, 1),
}


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
@pytest.mark.parametrize("differs", [False, True])
def test_views_and_bits(layout, differs):
    f = _LAYOUTS[layout]
    base = torch.randn(16, 16, generator=torch.Generator().manual_seed(6))
    shift = 1.0 if differs else 0.0
    rows, tr, tc = _run_pair(_Chain(_Fn(lambda v: f(v))), _Chain(_Fn(lambda v: f(v + shift))), base)
    _assert_rows_match_truth(rows, tr, tc)


@pytest.mark.parametrize("numel", [1023, 1024, 1025])  # 4092, 4096 (the bound), 4100 bytes
def test_sizes_around_the_bound_with_a_later_overwrite(numel):
    """Equal at capture; the next module overwrites the reference's output with NaN."""

    def model(poison):
        def later(y):
            if poison:
                y.numpy()[...] = np.nan
            return y + 0

        return _Chain(_Fn(lambda v: v * 1), _Fn(later))

    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    c = TensorChecker(verbose=False, eager_mode="equal")
    ref = model(True)
    held: dict[str, object] = {}
    ref.st[1].register_forward_pre_hook(
        lambda *_: held.update({g.tag: g.captures[0].value for g in c._groups.values()})
    )
    rows, tr, tc = _run_pair(ref, model(False), x, checker=c)
    _assert_rows_match_truth(rows, tr, tc)
    assert rows["checker_st.0"]["status"] == "equal"
    assert rows["checker_st.1"]["status"] == "mismatch"  # NaN on the reference only
    assert rows["checker_st.1"]["ref_nan"] == numel
    small = numel * 4 <= BULK_MAX_BYTES
    assert isinstance(held["checker_st.0"], HeldBytes) is small  # which path was attacked


@pytest.mark.parametrize("mode", ["equal", "allclose"])
def test_nan_payloads_and_signed_zeros(mode):
    """NaN vs NaN with another payload, -0.0 vs 0.0: equal in both modes (numpy's view)."""
    a = torch.tensor([float("nan"), 0.0, 1.0, float("inf")])
    b = torch.tensor([float("nan"), -0.0, 1.0, float("inf")])
    b.view(torch.int32)[0] = 0x7FC00001  # another quiet NaN
    assert a.numpy().tobytes() != b.numpy().tobytes()
    ref, cand = _Chain(_Fn(lambda v: v + 0)), _Chain(_Fn(lambda v: b.clone()))
    rows, tr, tc = _run_pair(ref, cand, a, mode)
    _assert_rows_match_truth(rows, tr, tc, mode)
    assert (rows["checker_st.0"]["ref_nan"], rows["checker_st.0"]["cand_inf"]) == (1, 1)


# ---------------------------------------------------------------------------------------------
# parameters and buffers


def test_tied_parameter_updated_by_the_forward_between_its_two_uses():
    """``a`` and ``b`` share one weight; the reference adds 1 to it after ``a`` ran."""
    w = nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(7)))

    class M(nn.Module):
        def __init__(self, bump: bool) -> None:
            super().__init__()
            self.a, self.b, self.bump = nn.Linear(4, 4), nn.Linear(4, 4), bump
            self.a.weight = self.b.weight = w
            nn.init.zeros_(self.a.bias)
            nn.init.zeros_(self.b.bias)

        def forward(self, x):
            y = self.a(x)
            if self.bump:
                with torch.no_grad():
                    self.a.weight.add_(1.0)
            return self.b(y)

    w0 = w.detach().clone()
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(8))
    rows, _, _ = _run_pair(M(True), M(False), x)
    # ref: a.weight = w0, b.weight = w0 + 1; cand runs after the bump: w0 + 1 for both
    assert rows["checker_a.weight"]["status"] == "mismatch"
    assert rows["checker_a.weight"]["max_abs_diff"] == pytest.approx(1.0, abs=1e-6)
    assert rows["checker_b.weight"]["status"] == "equal"
    assert torch.equal(w.detach(), w0 + 1.0)


def test_parameter_written_through_a_numpy_view_taken_before_the_capture():
    """A raw numpy view of the reference's weight, taken before the run, is written between the
    two sides. At capture both weights were equal: ``equal`` (main@41c8b5f said ``mismatch``,
    its copy-on-write pin saw the later write; the bytes copy does not)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 4))
    torch.manual_seed(0)
    cand = nn.Sequential(nn.Linear(4, 4))
    assert torch.equal(ref[0].weight, cand[0].weight)
    view = ref[0].weight.detach().numpy()
    c = TensorChecker(verbose=False, eager_mode="equal")
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(9))
    with (
        module_register_tensor_checker(ref, c),
        module_register_tensor_checker(cand, c),
        torch.no_grad(),
    ):
        ref(x)
        view[...] = 5.0
        cand(x)
    rows = {r["tag"]: r for r in c.check("equal").to_rows()}
    assert rows["checker_0.weight"]["status"] == "equal"
    assert rows["checker_0.weight"]["max_abs_diff"] == 0.0
    assert (ref[0].weight == 5.0).all()  # the write did land


def test_parameters_of_a_flat_buffer_changed_after_capture_are_errors_not_verdicts():
    """Weights that are views of one flat buffer stay held by reference: a counted write after
    the reference's capture gives ``error`` (never a verdict on the new values)."""
    flat = torch.randn(40, generator=torch.Generator().manual_seed(10))

    def model():
        m = nn.Linear(4, 4)
        m.weight = nn.Parameter(flat[:16].view(4, 4))
        m.bias = nn.Parameter(flat[16:20])
        return m

    ref, cand = model(), model()
    c = TensorChecker(verbose=False, eager_mode="equal")
    with (
        module_register_tensor_checker(ref, c),
        module_register_tensor_checker(cand, c),
        torch.no_grad(),
    ):
        ref(torch.ones(1, 4))
        flat[0] += 1.0
        cand(torch.ones(1, 4))
    rows = {r["tag"]: r for r in c.check("equal").to_rows()}
    assert rows["checker_weight"]["status"] == "error"
    assert rows["checker_bias"]["status"] == "error"


def test_batchnorm_running_stats_updated_by_each_forward_in_train_mode():
    """Running stats are captured before the first call updates them (pre-hook): equal, while
    the candidate's momentum makes the second call's output differ."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    torch.manual_seed(0)
    cand = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=0.5))
    ref.train()
    cand.train()
    mean0 = ref[1].running_mean.clone()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(11))
    c = TensorChecker(verbose=False, eager_mode="equal")
    with (
        pytest.warns(UserWarning, match="training mode"),
        module_register_tensor_checker(ref, c),
        module_register_tensor_checker(cand, c),
        torch.no_grad(),
    ):
        ref(x)
        ref(x)
        cand(x)
        cand(x)
    rows = {r["tag"]: r for r in c.check("equal").to_rows()}
    assert rows["checker_1.running_mean"]["status"] == "equal"
    assert torch.equal(mean0, torch.zeros(4))
    assert not torch.equal(ref[1].running_mean, cand[1].running_mean)  # they did diverge


# ---------------------------------------------------------------------------------------------
# runs: spilling, several steps, exceptions, several checkers, candidate first, trimming


class _Many(nn.Module):
    """One module per (dtype, shape), repeated: enough held bytes to spill at 140 000 B."""

    def __init__(self, shift_every: int) -> None:
        super().__init__()
        self.specs = []
        self.ms = nn.ModuleList()
        i = 0
        for _ in range(16):
            for dt in (torch.bool, torch.int8, torch.float16, torch.complex64, torch.float64):
                for sh in ((), (0,), (5,), (64, 8)):
                    seed = i + (1000 if shift_every and i % shift_every == 0 else 0)
                    self.ms.append(_Fn(lambda _x, dt=dt, sh=sh, s=seed: _make(dt, sh, s)))
                    self.specs.append((dt, sh, seed))
                    i += 1

    def forward(self, x):
        for m in self.ms:
            m(x)
        return x


@pytest.mark.parametrize("budget", [None, 140_000])
@pytest.mark.parametrize("mode", ["equal", "allclose"])
def test_held_bytes_of_every_dtype_spilled_and_read_back(budget, mode):
    kw = {} if budget is None else {"max_resident_bytes": budget}
    c = TensorChecker(verbose=False, eager_mode=mode, **kw)
    ref, cand = _Many(0), _Many(3)
    with (
        module_register_tensor_checker(ref, c),
        module_register_tensor_checker(cand, c),
        torch.no_grad(),
    ):
        ref(torch.zeros(1))
        kinds = {type(g.captures[0].value).__name__ for g in c._groups.values()}
        cand(torch.zeros(1))
    assert "HeldBytes" in kinds
    if budget is not None:
        assert "Spilled" in kinds and c._store.spilled_count > 0
    rows = {r["tag"]: r for r in c.check(mode).to_rows()}
    for i, ((dt, sh, s_ref), (_, _, s_cand)) in enumerate(zip(ref.specs, cand.specs, strict=True)):
        status, _ = _expected(_make(dt, sh, s_ref), _make(dt, sh, s_cand))
        got = rows[f"checker_ms.{i}"]["status"]
        assert (got == "equal") == (status == "equal"), (i, dt, sh, got)


@pytest.mark.parametrize("capture_ops", [False, True])
def test_run_parity_state_buffer_updated_in_place_over_steps(capture_ops):
    """A cell returns its state buffer (the same object every step) after ``add_``; the
    candidate's bias gets +1 after step 1. Expected by hand: steps 0, 1 equal; step 2 differs
    by exactly 1 in the linear output and in the state (its mean over the batch of +1)."""

    class Cell(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.register_buffer("state", torch.zeros(8))

        def forward(self, x):
            self.state.add_(self.lin(x).detach().mean(0))
            return self.state

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell, self.head = Cell(), nn.Identity()

        def forward(self, x):
            return self.head(self.cell(x))

    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(12))

    def drive(model, rec):
        for step in range(3):
            with rec(step):
                model(x)
            if step == 1 and getattr(model, "bump", False):
                with torch.no_grad():
                    model.cell.lin.bias.add_(1.0)

    torch.manual_seed(0)
    ref = Net()
    torch.manual_seed(0)
    cand = Net()
    cand.bump = True
    res = run_parity(ref, cand, drive=drive, mode="equal", capture_ops=capture_ops)
    rows = {(r["tag"], r["step"]): r for r in res.modules.to_pylist()}
    for tag in ("checker_cell", "checker_cell.lin", "checker_head", "checker_model"):
        assert [rows[(tag, s)]["status"] for s in range(3)] == ["equal", "equal", "mismatch"]
        assert rows[(tag, 2)]["max_abs_diff"] == pytest.approx(1.0, abs=1e-6)
    assert rows[("checker_cell.state", 0)]["status"] == "equal"


def test_forward_raising_midway_keeps_what_was_compared():
    class Boom(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    ref = _Chain(_Fn(lambda v: v * 2), _Fn(lambda v: v + 0.0))
    cand = _Chain(_Fn(lambda v: v * 2), _Fn(lambda v: v + 1.0), Boom())
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(13))
    c = TensorChecker(verbose=False, eager_mode="equal")
    with (
        module_register_tensor_checker(ref, c),
        module_register_tensor_checker(cand, c),
        torch.no_grad(),
    ):
        ref(x)
        with pytest.raises(RuntimeError, match="boom"):
            cand(x)
    rows = {r["tag"]: r for r in c.check("equal").to_rows()}
    assert rows["checker_st.0"]["status"] == "equal"
    assert rows["checker_st.1"]["status"] == "mismatch"
    assert rows["checker_st.1"]["max_abs_diff"] == pytest.approx(1.0, abs=1e-6)
    assert rows["checker_model"]["status"] == "missing_candidate"


def test_two_checkers_on_the_same_models_and_candidate_first():
    def model(k):
        return _Chain(_Fn(lambda v: v * 2), _Fn(lambda y: y.add_(k)), _Fn(lambda y: y * 1))

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(14))
    ref, cand = model(1.0), model(2.0)
    tr: dict = {}
    tc: dict = {}
    hooks = _truth_hooks(ref, tr) + _truth_hooks(cand, tc)
    c1 = TensorChecker(verbose=False, eager_mode="equal")
    c2 = TensorChecker(verbose=False, eager_mode="allclose")
    with (
        module_register_tensor_checker(ref, c1, side=0),
        module_register_tensor_checker(cand, c1, side=1),
        module_register_tensor_checker(ref, c2, side=0),
        module_register_tensor_checker(cand, c2, side=1),
        torch.no_grad(),
    ):
        cand(x.clone())  # the candidate first: its small tensors are the ones held as bytes
        ref(x.clone())
    for h in hooks:
        h.remove()
    for c, mode in ((c1, "equal"), (c2, "allclose")):
        rows = {r["tag"]: r for r in c.check(mode).to_rows()}
        _assert_rows_match_truth(rows, tr, tc, mode)


def test_one_sided_modules_keep_their_capture_time_values():
    """The reference has an extra module that rewrites its input in place; the candidate does
    the same write inline. Both sides' ``a`` outputs were equal when captured."""

    class R(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.extra = _Fn(lambda v: v * 2), _Fn(lambda v: v.add_(3))

        def forward(self, x):
            y = self.a(x)
            self.extra(y)
            return y

    class C(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = _Fn(lambda v: v * 2)

        def forward(self, x):
            return self.a(x).add_(3)

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(15))
    c = TensorChecker(verbose=False, eager_mode="equal")
    ref, cand = R(), C()
    with (
        module_register_tensor_checker(ref, c),
        module_register_tensor_checker(cand, c),
        torch.no_grad(),
    ):
        ref(x)
        extra = next(g for g in c._groups.values() if g.tag == "checker_extra_input_0")
        assert isinstance(extra.captures[0].value, HeldBytes)
        cand(x)
    rows = {r["tag"]: r for r in c.check("equal").to_rows()}
    assert rows["checker_a"]["status"] == "equal"
    assert rows["checker_model"]["status"] == "equal"
    assert rows["checker_extra"]["status"] == "missing_candidate"
    # the one-sided group's value is a tensor of capture-time values (2x, before add_)
    assert torch.equal(extra.captures[0].value, x * 2)


_KINDS = ["scale", "inplace", "numpy", "ctypes", "set", "view", "T", "clone", "poke", "resize"]


class _Stage(nn.Module):
    def __init__(self, kind: str, k: int, kept: list) -> None:
        super().__init__()
        self.kind, self.k, self.kept = kind, k, kept

    def forward(self, x):
        k, kind = self.k, self.kind
        if kind == "scale":
            y = x * k
        elif kind == "inplace":
            y = x.add_(k)
        elif kind == "numpy":
            x.numpy()[...] += np.asarray(k).astype(x.numpy().dtype)
            y = x
        elif kind == "ctypes":
            y = _ctypes_add(x, k) if x.is_contiguous() else x.add_(k)
        elif kind == "set":
            y = x.set_((x + k).contiguous())
        elif kind == "view":
            y = x.reshape(-1)[::2]
        elif kind == "T":
            y = x.reshape(x.shape[0], -1).t()
        elif kind == "clone":
            y = x.clone()
        elif kind == "poke":  # rewrite an earlier stage's output, already captured
            if self.kept:
                self.kept[0].mul_(k)
            y = x + 0
        else:  # resize
            y = x.resize_(max(1, x.numel() // 2))
        self.kept.append(y)
        return y


def _random_chains(rnd: random.Random) -> tuple[nn.Module, nn.Module]:
    """A reference chain of 1–6 random stages and its candidate (each stage's k bumped with
    probability 0.3)."""
    kinds = [rnd.choice(_KINDS) for _ in range(rnd.randint(1, 6))]
    k_ref = [rnd.choice([1, 2, 3]) for _ in kinds]
    k_cand = [k if rnd.random() < 0.7 else k + 1 for k in k_ref]
    kept_r: list = []
    kept_c: list = []
    ref = _Chain(*[_Stage(kd, k, kept_r) for kd, k in zip(kinds, k_ref, strict=True)])
    cand = _Chain(*[_Stage(kd, k, kept_c) for kd, k in zip(kinds, k_cand, strict=True)])
    return ref, cand


@pytest.mark.parametrize("seed", range(40))
def test_random_chains_of_in_place_writes(seed):
    """Random chains of 1–6 stages (in-place writes counted or not, ``set_``, ``resize_``,
    views, writes into earlier outputs), float16/32/64, int8/32, sizes across 4 KiB."""
    rnd = random.Random(seed)
    dtype = rnd.choice([torch.float32, torch.float16, torch.float64, torch.int32, torch.int8])
    n = rnd.choice([1, 2, 7, 512, 1023, 1024, 1025, 2048, 4096, 4097])
    shape = (2, n // 2) if n % 2 == 0 and rnd.random() < 0.5 else (n,)
    ref, cand = _random_chains(rnd)
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 4).to(dtype)
    mode = "equal" if seed % 2 else "allclose"
    rows, tr, tc = _run_pair(ref, cand, x, mode)
    _assert_rows_match_truth(rows, tr, tc, mode)


def _first_truth_hooks(model: nn.Module, store: dict[str, torch.Tensor]) -> list:
    """:func:`_truth_hooks` keeping the first call's values (``run_parity`` re-runs a failing
    pair for its repro after the check)."""
    handles = []
    for name, mod in model.named_modules():
        tag = "checker_" + (name or "model")

        def pre(_m, args, tag=tag):
            store.setdefault(tag + "_input_0", args[0].detach().clone())

        def post(_m, _args, out, tag=tag):
            store.setdefault(tag, out.detach().clone())

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    return handles


@pytest.mark.parametrize("seed", range(12))
def test_random_chains_through_run_parity(seed, in_tmp_cwd):
    """The random chains above through ``run_parity`` (op-level capture every third seed)."""
    rnd = random.Random(1000 + seed)
    dtype = rnd.choice([torch.float32, torch.float16, torch.float64, torch.int32])
    n = rnd.choice([2, 7, 512, 1024, 1025, 4096])
    ref, cand = _random_chains(rnd)
    x = (torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 4).to(dtype)
    tr: dict = {}
    tc: dict = {}
    _first_truth_hooks(ref, tr)
    _first_truth_hooks(cand, tc)
    mode = "equal" if seed % 2 else "allclose"
    res = run_parity(ref, cand, (x,), mode=mode, capture_ops=seed % 3 == 0)
    rows = {r["tag"]: r for r in res.modules.to_pylist()}
    _assert_rows_match_truth(rows, tr, tc, mode)


def test_trimming_at_every_admission_changes_no_verdict(monkeypatch):
    """The process trimmer replaced by one that calls glibc's malloc_trim at every admission
    (its resident-set reading always grown): the rows are those of a run with trimming off."""
    trims = []

    def trim(pad):
        trims.append(pad)
        fn = heap_trim._libc_trim()
        return fn(pad) if fn is not None else 0

    rising = iter(range(1 << 30, 1 << 62, 1 << 30))
    monkeypatch.delenv(heap_trim.ENV, raising=False)
    monkeypatch.setattr(
        heap_trim, "trimmer", HeapTrimmer(every=1, trim=trim, resident=lambda: next(rising))
    )

    def model(k):
        return _Chain(
            _Fn(lambda v: v * 2), _Fn(lambda y: y.add_(k)), _Fn(lambda y: y.repeat(40, 1))
        )

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(16))
    rows_on, tr, tc = _run_pair(model(1.0), model(2.0), x)
    assert trims and set(trims) == {0}
    _assert_rows_match_truth(rows_on, tr, tc)
    monkeypatch.setenv(heap_trim.ENV, "0")
    n = len(trims)
    rows_off, _, _ = _run_pair(model(1.0), model(2.0), x)
    assert len(trims) == n  # turned off: never called
    keys = ("status", "max_abs_diff", "ref_hash", "cand_hash")
    assert {t: [r[k] for k in keys] for t, r in rows_on.items()} == {
        t: [r[k] for k in keys] for t, r in rows_off.items()
    }


def test_trimmer_high_mark_is_the_largest_after_a_trim(monkeypatch):
    """Hand-worked: every=10. Looks at 10, 20, 30, 40 B admitted read rss 50 (>0+10: trim;
    after 30), 35 (<=40), 45 (>40: trim; after 20 -> high stays 30), 40 (<=40): 2 trims."""
    monkeypatch.delenv(heap_trim.ENV, raising=False)
    calls: list[int] = []
    seq = iter([50, 30, 35, 45, 20, 40])
    t = HeapTrimmer(every=10, trim=calls.append, resident=lambda: next(seq))
    for _ in range(4):
        t.admitted(10)
    assert calls == [0, 0] and t.trims == 2


def test_reuse_table_of_held_bytes_does_not_grow_with_the_captures_of_a_long_drive():
    """A 300-step loop over 10 small modules: 3,000 small reference captures, each released once
    its pair is compared. A reuse table keyed by source should hold about one entry per live
    source (here: none at the end), not one per capture ever made."""
    model = _Chain(*[_Fn(lambda v: v * 1.0001) for _ in range(10)])
    twin = _Chain(*[_Fn(lambda v: v * 1.0001) for _ in range(10)])
    c = TensorChecker(verbose=False, eager_mode="equal")
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(17))
    with (
        module_register_tensor_checker(model, c),
        module_register_tensor_checker(twin, c),
        torch.no_grad(),
    ):
        for step in range(300):
            c.step = step
            model(x)
            twin(x)
    rows = c.check("equal").to_rows()
    assert len(rows) == 300 * 22 and all(r["status"] == "equal" for r in rows)
    dead = [r for r in c._snap._bytes_seen.values() if r() is None]
    assert len(dead) <= 64
