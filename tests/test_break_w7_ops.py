"""Adversarial tests of issue 19 wave 7 (w7ops): op output pairs settled from op-time digests.

In an op-level run an aligned pair of op outputs is settled ``equal`` from the xxh3 digests
taken when the ops ran (``localize.settle``), a spilled reference only when it was sealed (its
bytes hashed to the digest right before the spill write, ``capture.op_store._seal``). Every
verdict here is checked against values the test copies itself at op time: the model's forward
runs a second time, alone, under the test's own ``TorchDispatchMode`` (``_Truth``), which clones
every op output the moment the op returns; those copies are compared with numpy. Writes that
bypass dispatch (numpy, ctypes, DLPack, storage resize) are made after the op ran, in both runs.
"""

from __future__ import annotations

import ctypes
import random
import re
import tempfile

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from parity_tracker.ops import OpSession


@pytest.fixture(autouse=True)
def _tmp_spills(tmp_path, monkeypatch):
    """Spill folders (``tempfile.gettempdir()``) and anything written to the working directory
    land in this test's ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)


# ---------------------------------------------------------------------------------------------
# harness


class _Truth(TorchDispatchMode):
    """Clone every tensor output of every op when it returns, keyed ``(op name, k)``."""

    def __init__(self) -> None:
        super().__init__()
        self.outs: dict[tuple[str, int], list] = {}
        self.counts: dict[str, int] = {}
        self.by_ptr: dict[int, tuple[str, int]] = {}  # data address -> last op writing it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        k = self.counts.get(name, 0)
        self.counts[name] = k + 1
        flat = out if isinstance(out, (tuple, list)) else (out,)
        self.outs[(name, k)] = [
            t.detach().clone() if isinstance(t, torch.Tensor) else None for t in flat
        ]
        for t in flat if not func.is_view else ():
            if isinstance(t, torch.Tensor) and t.numel():
                self.by_ptr[t.data_ptr()] = (name, k)
        return out


#: the truth run in progress, and the ops whose outputs its forward rewrote bypassing dispatch
_ACTIVE: list[_Truth] = []
_HIT: set[tuple[str, int]] = set()


def _bypass(kind: str, t: torch.Tensor) -> None:
    """Rewrite ``t`` through ``_WRITES[kind]``; in a truth run, note the op that made it."""
    if _ACTIVE:
        _HIT.add(_ACTIVE[-1].by_ptr[t.data_ptr()])
    _WRITES[kind](t)


class Fn(nn.Module):
    def __init__(self, fn, side: int) -> None:
        super().__init__()
        self.fn, self.side = fn, side

    def forward(self, *xs):
        return self.fn(self.side, *xs)


def _inputs(xs):
    return tuple(x.clone() for x in xs)


def _truth(fn, xs, side, grad_mode):
    mode, inputs = _Truth(), _inputs(xs)
    _HIT.clear()
    _ACTIVE.append(mode)
    try:
        with grad_mode(), mode:
            Fn(fn, side)(*inputs)
    finally:
        _ACTIVE.pop()
    mode.outs["_hit"] = set(_HIT)
    return mode.outs


def _run(fn, xs, budget, grad_mode=torch.no_grad, mode="equal", tolerances=None):
    s = OpSession(mode=mode, max_resident_bytes=budget, tolerances=tolerances)
    try:
        for side in (0, 1):
            m, inputs = Fn(fn, side), _inputs(xs)
            with grad_mode(), s.recording(side, model=m):
                m(*inputs)
        return s.rows()
    finally:
        s.close()


_TAG = re.compile(r"^model@0::(?P<op>[\w.]+)#(?P<k>\d+)(?::(?P<i>\d+))?$")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """compare_tensors' ``equal``: one dtype and shape, numerically equal, NaN matching NaN."""
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    if a.dtype == torch.bool:
        return bool(np.array_equal(a.numpy(), b.numpy()))
    wide = torch.complex128 if a.is_complex() else torch.float64
    return bool(np.array_equal(a.to(wide).numpy(), b.to(wide).numpy(), equal_nan=True))


def check(fn, xs, budget=1 << 30, written=(), grad_mode=torch.no_grad, min_rows=1):
    """Run ``fn`` on both sides and check every op row against the op-time truth.

    ``written``: ops (``(name, k)``) whose output the forward rewrites after the op through
    something that bypasses dispatch: their rows may be ``error`` (the tool cannot know the
    op-time bytes any more), never a verdict that contradicts the truth.
    Returns the rows by tag.
    """
    truth = [_truth(fn, xs, side, grad_mode) for side in (0, 1)]
    written = set(written) | truth[0].pop("_hit") | truth[1].pop("_hit")
    rows = _run(fn, xs, budget, grad_mode)
    assert len(rows) >= min_rows
    out = {}
    for r in rows:
        m = _TAG.match(r["tag"])
        assert m, r["tag"]
        key, i = (m["op"], int(m["k"])), int(m["i"] or 0)
        if r["status"] in ("missing_reference", "missing_candidate"):
            side = 0 if r["status"] == "missing_reference" else 1
            there = truth[1 - side].get(key)
            other = truth[side].get(key)
            assert there is not None, (r["tag"], r["status"])
            # unaligned: no such op on the other side, one of another shape, or the sides ran
            # this op a different number of times
            runs = [sum(1 for k in t if k[0] == key[0]) for t in truth]
            assert other is None or other[i].shape != there[i].shape or runs[0] != runs[1], (
                r["tag"],
                r["status"],
            )
            continue
        a, b = truth[0][key][i], truth[1][key][i]
        expected = "equal" if _same(a, b) else "mismatch"
        got = r["status"]
        if got == "error" and key in written:
            continue
        if expected == "mismatch":
            assert got in ("mismatch", "shape_mismatch", "dtype_mismatch"), (r["tag"], got, r)
        else:
            assert got == "equal", (r["tag"], got, r.get("message"))
        out[r["tag"]] = r
    return out


BUDGETS = [0, 1 << 30]  # everything spilled at once / everything resident


# ---------------------------------------------------------------------------------------------
# dtypes and layouts: the candidate differs in one element or not at all

_DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64,
    torch.int8, torch.int32, torch.bool,
]  # fmt: skip
_LAYOUTS = ["contig", "t", "cl1", "cl2", "gap", "expand", "zero_d", "empty"]


def _source(dtype, layout):
    g = torch.Generator().manual_seed(7)
    shape = {"cl1": (1, 3, 4, 5), "cl2": (2, 3, 4, 5), "zero_d": (), "empty": (0, 4)}.get(
        layout, (6, 10)
    )
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 4
    if dtype == torch.bool:
        return x > 0
    if dtype.is_complex:
        return (x + 1j * x.flip(-1) if x.dim() else x + 0j).to(dtype)
    return x.to(dtype)


def _shaped(x, layout):
    if layout == "t":
        return x.t()
    if layout in ("cl1", "cl2"):
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "gap":
        return x[:, ::2]
    if layout == "expand":
        return x[:1].expand(5, -1)
    return x


def _unary(x):
    if x.dtype == torch.bool:
        return torch.logical_not(x)
    if x.is_floating_point() or x.is_complex():
        return x * 3  # keeps x's strides (dense permuted layouts stay permuted)
    return x * 3


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("differs", [False, True])
@pytest.mark.parametrize("layout", _LAYOUTS)
@pytest.mark.parametrize("dtype", _DTYPES)
def test_dtypes_and_layouts(dtype, layout, differs, budget):
    def fn(side, x):
        x = _shaped(x, layout)
        if side and differs and x.numel():
            x = x.clone()  # the same layout, one element changed
            flat = x.view(-1) if x.is_contiguous() else x.as_strided((1,), (1,))
            flat[0] = ~flat[0] if x.dtype == torch.bool else flat[0] + 1
            if layout == "cl1" or layout == "cl2":
                x = x.contiguous(memory_format=torch.channels_last)
        y = _unary(x)
        return _unary(y)

    rows = check(fn, [_source(dtype, layout)], budget=budget)
    assert rows


# ---------------------------------------------------------------------------------------------
# writes after the op ran, that bypass dispatch (or go through an alias)


def _ctypes_add(t: torch.Tensor, k: float) -> None:
    """Add ``k`` to the first float32 element of ``t``'s storage through a raw pointer."""
    p = ctypes.cast(t.data_ptr(), ctypes.POINTER(ctypes.c_float))
    p[0] = p[0] + k


_WRITES = {
    "numpy": lambda y: y.numpy().reshape(-1).__setitem__(0, y.numpy().reshape(-1)[0] + 1),
    "ctypes": lambda y: _ctypes_add(y, 1.0),
    "dlpack": lambda y: torch.from_dlpack(y).view(-1)[:1].add_(1),
    "dlpack_slice": lambda y: torch.from_dlpack(y.view(-1)[1:]).add_(1),
    "from_numpy": lambda y: torch.from_numpy(y.numpy()).add_(1),
    "alias_view": lambda y: y.view(-1).add_(1),
    "narrow": lambda y: y.narrow(0, 1, 1).mul_(0),
    "as_strided": lambda y: y.as_strided((2,), (3,), 1).add_(1),
    "set_": lambda y: y.set_(torch.zeros(3)),
    "resize_": lambda y: y.resize_(2, 3),  # shrinks: no uninitialized element
    "foreach": lambda y: torch._foreach_add_([y], 1.0),
    "data": lambda y: y.data.add_(1),
    "restore": lambda y: (y.numpy().__iadd__(1), y.numpy().__isub__(1)),  # ABA: same bytes
}


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("sides", ["both", "cand", "ref"])
@pytest.mark.parametrize("write", sorted(_WRITES))
def test_output_written_after_the_op(write, sides, budget):
    """``y = x * 2`` is captured, then written (by one side or both), then read by ``add``.

    Truth: ``mul`` is equal at op time on both sides whatever the write; ``add`` differs
    exactly when one side wrote (except the restoring write)."""

    def fn(side, x):
        y = x * 2
        if sides == "both" or (sides == "cand") == bool(side):
            _WRITES[write](y)
        return y + 1

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    check(fn, [x], budget=budget, written={("mul", 0)})


def test_restoring_write_leaves_the_op_time_bytes():
    """ABA: the output is rewritten then its exact bytes copied back before it is compared: the
    bytes at compare time ARE the op-time bytes, so both sides are ``equal`` (truth: numpy)."""

    def fn(side, x):
        y = x * 2
        saved = y.numpy().copy()
        y.numpy()[:] = 5.0
        z = y + 1  # reads the rewritten bytes: 6 everywhere on both sides
        y.numpy()[:] = saved
        return z

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    for budget in BUDGETS:
        rows = check(fn, [x], budget=budget)
        assert [rows[t]["status"] for t in sorted(rows)] == ["equal", "equal"]


# ---------------------------------------------------------------------------------------------
# settled vs compared: signed zeros, NaN payloads (compare_tensors: -0.0 == 0.0, NaN ~ NaN)

_NAN_A = np.array([0x7FC00001], dtype=np.uint32).view(np.float32)[0]
_NAN_B = np.array([0x7FC00002], dtype=np.uint32).view(np.float32)[0]


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("layout", ["contig", "t"])
@pytest.mark.parametrize("pair", ["same", "signed_zero", "nan_payload"])
def test_signed_zeros_and_nan_payloads_settled_or_compared_alike(pair, layout, budget):
    """The candidate's output differs from the reference's only in its bits (or not at all):
    ``equal`` in every case, max abs diff 0 and the NaN count of numpy's ``isnan``."""
    base = np.array([[0.0, 1.5, _NAN_A], [2.0, -3.0, 0.25]], dtype=np.float32)
    cand = base.copy()
    if pair == "signed_zero":
        cand[0, 0] = -0.0
    elif pair == "nan_payload":
        cand[0, 2] = _NAN_B

    def fn(side, r, c):
        src = c if side else r
        src = src.t() if layout == "t" else src
        return torch.clone(src) * 1  # ``clone`` keeps the layout; ``mul`` by 1 keeps the bits

    xs = [torch.from_numpy(base.copy()), torch.from_numpy(cand)]
    rows = check(fn, xs, budget=budget)
    for r in rows.values():
        assert r["status"] == "equal"
        assert r["max_abs_diff"] in (0.0, None)
        assert r["ref_nan"] == r["cand_nan"] == int(np.isnan(base).sum())


# ---------------------------------------------------------------------------------------------
# multi-output ops, one output of which differs


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("op", ["topk", "sort", "max", "foreach", "aminmax"])
def test_multi_output_ops_with_one_output_changed(op, budget):
    def fn(side, x):
        if side:
            x = x.clone()
            x[0, 1] += 100.0  # moves one value (and its index) in every reduction below
        if op == "topk":
            return x.topk(2, dim=1)
        if op == "sort":
            return torch.sort(x.t(), dim=0)
        if op == "max":
            return x.max(dim=0)
        if op == "aminmax":
            return torch.aminmax(x, dim=1)
        return torch._foreach_mul([x, x.t(), x[:1]], 2.0)

    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(3))
    rows = check(fn, [x], budget=budget)
    assert any(r["status"] == "mismatch" for r in rows.values())


# ---------------------------------------------------------------------------------------------
# a buffer reused across steps (writes through dispatch: before_write copies the holders)


@pytest.mark.parametrize("budget", BUDGETS)
def test_buffer_reused_across_steps(budget):
    def fn(side, x, bump):
        buf = torch.zeros(3, 4)
        outs = []
        for step in range(4):
            buf.copy_(x * (step + 1))
            buf.view(-1)[5] += bump[side, step]  # the candidate differs in step 2 only
            outs.append(buf.t() * 1)  # a dense permuted output of the reused buffer
            outs.append(buf + 0)
        return outs

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 3
    bump = torch.zeros(2, 4)
    bump[1, 2] = 1.0
    rows = check(fn, [x, bump], budget=budget)
    bad = sorted(t for t, r in rows.items() if r["status"] != "equal")
    assert bad and all(r["status"] in ("equal", "mismatch") for r in rows.values())


# ---------------------------------------------------------------------------------------------
# the same storage bytes under other strides or dtypes: never settled as equal


def _perm_pair(side, a):
    """Both sides: a (2, 3, 4) dense permuted output whose STORAGE holds the same 24 bytes
    (``arange``); the strides differ, so the logical contents differ."""
    first = a.reshape(2, 4, 3).permute(0, 2, 1)  # strides (12, 1, 3)
    src = first if side == 0 else a.reshape(4, 2, 3).permute(1, 2, 0)  # strides (3, 1, 6)
    return src * 1  # mul keeps the dense permuted layout


@pytest.mark.parametrize("budget", BUDGETS)
def test_same_storage_bytes_other_strides(budget):
    a = torch.arange(24, dtype=torch.float32)
    rows = check(_perm_pair, [a], budget=budget)
    assert rows["model@0::mul#0"]["status"] == "mismatch"


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("layout", ["contig", "t"])
def test_same_bytes_other_dtype(budget, layout):
    """float32 vs int32 of identical bytes (``view(dtype)`` is a view, so each side copies):
    a dtype mismatch, never ``equal``."""

    def fn(side, x):
        y = x.view(torch.int32) if side else x
        y = y.t() if layout == "t" else y
        return torch.clone(y)

    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    truth = [_truth(fn, [x], s, torch.no_grad) for s in (0, 1)]
    assert truth[0][("clone", 0)][0].dtype != truth[1][("clone", 0)][0].dtype
    rows = {r["tag"]: r for r in _run(fn, [x], budget)}
    assert rows["model@0::clone#0"]["status"] not in ("equal", "allclose")


# ---------------------------------------------------------------------------------------------
# settling is exercised (the tests above would pass without it too)


def test_settle_runs_for_spilled_references_and_permuted_pairs(monkeypatch):
    """Spy on ``localize.settle.settled``: with everything spilled, a contiguous and a dense
    permuted output pair are settled (a record returned), and their status is the truth's."""
    from parity_tracker.localize import op_compare

    got = []
    real = op_compare._settled

    def spy(*a, **k):
        out = real(*a, **k)
        got.append(out is not None)
        return out

    monkeypatch.setattr(op_compare, "_settled", spy)

    def fn(side, x):
        return (x * 2).t() * 3  # mul#0 contiguous, mul#1 dense permuted

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    rows = check(fn, [x], budget=0)
    assert got == [True, True] and {r["status"] for r in rows.values()} == {"equal"}
    got.clear()
    check(fn, [x], budget=1 << 30)  # resident: the contiguous pair is compared, not settled
    assert got == [False, True]


# ---------------------------------------------------------------------------------------------
# findings (pre-existing: main 944f26f, before w7ops, gives the same rows)


@pytest.mark.parametrize("budget", BUDGETS)
def test_ops_under_inference_mode(budget):
    """Was a w7break2 finding: ``OpRecorder.describe`` read ``t._version`` ("Inference tensors
    do not track version counter"): every op row dropped for one 'op_capture' error row."""

    def fn(side, x):
        return (x * 2).t() + 1

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    rows = check(fn, [x], budget=budget, grad_mode=torch.inference_mode)
    assert sorted(rows) == ["model@0::add#0", "model@0::mul#0"]


@pytest.mark.parametrize("alias", ["dlpack", "from_numpy"])
def test_dispatched_write_through_an_alias_of_a_slice(alias):
    """Was a w7break2 finding: an in-place op on a DLPack/from_numpy alias of a SLICE of a held
    output was not seen by ``OpStore.before_write`` (keyed by the alias storage's own address):
    the row was 'error' although both sides' outputs were identical at op time."""

    def fn(side, x):
        y = x * 2
        part = y.view(-1)[1:]
        other = torch.from_dlpack(part) if alias == "dlpack" else torch.from_numpy(part.numpy())
        other.add_(1)  # an aten op: the recorder sees it, but not that it writes y
        return y + 1

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    rows = check(fn, [x], budget=1 << 30)
    assert rows["model@0::mul#0"]["status"] == "equal"


@pytest.mark.parametrize("write", ["numpy", "ctypes"])
def test_output_rewritten_after_the_op_is_not_a_kernel_root_cause(write):
    """Was a w7break2 finding: an 'error' row was classified root cause case A ("the kernel
    differs"): ``is_root_cause`` took every failing status, error included, as a divergence."""

    def fn(side, x):
        y = x * 2
        z = y + 1
        if side:  # the candidate rewrites its (identical) mul output after add read it
            _WRITES[write](y)
        return z

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    rows = check(fn, [x], budget=1 << 30, written={("mul", 0)})
    mul = _run(fn, [x], 1 << 30)[0]
    assert mul["tag"] == "model@0::mul#0"
    # truth: both sides' mul outputs were bitwise equal at op time (checked above): no kernel
    # difference to report
    assert not (mul["root_cause"] and mul["cause"] == "A"), mul["message"]
    assert rows["model@0::add#0"]["status"] == "equal"


# ---------------------------------------------------------------------------------------------
# fuzz: random chains of ops, random post-capture writes, both budgets

_CHAIN_OPS = {
    "mul": lambda y: y * 1.5,
    "perm": lambda y: y.t() * 1,  # dense permuted output
    "sin": torch.sin,
    "cl": lambda y: y.reshape(1, 2, 3, 4).contiguous(memory_format=torch.channels_last) + 0,
    "cumsum": lambda y: torch.cumsum(y.reshape(-1), 0),
    "topk": lambda y: y.reshape(-1).topk(24).values,
    "half": lambda y: y.half().float(),
    "neg0": lambda y: y * 0,  # -0.0 where y < 0
}
_BYPASS = ("numpy", "ctypes")
_DISPATCHED = ("alias_view", "foreach", "data", "narrow")


def _chain(seed):
    rng = random.Random(seed)
    steps = [rng.choice(sorted(_CHAIN_OPS)) for _ in range(rng.randint(3, 8))]
    writes = {}  # step -> (kind, which sides)
    for s in range(len(steps)):
        if rng.random() < 0.4:
            kind = rng.choice(_BYPASS + _DISPATCHED)  # dispatched: on both sides (same ops)
            writes[s] = (kind, rng.choice([(0,), (1,), (0, 1)]) if kind in _BYPASS else (0, 1))
    diff_at = rng.randrange(len(steps)) if rng.random() < 0.6 else None
    return steps, writes, diff_at


def _chain_fn(steps, writes, diff_at):
    def fn(side, x, delta):
        y = x
        outs = []
        for s, name in enumerate(steps):
            y = _CHAIN_OPS[name](y).reshape(24) + delta[side, s]  # the same ops on both sides
            outs.append(y)
            if s in writes and side in writes[s][1]:
                kind = writes[s][0]
                target = outs[max(0, s - 1)]  # the previous output (already read) or this one
                if kind in _BYPASS:
                    _bypass(kind, target)
                else:
                    _WRITES[kind](target)
        return outs

    return fn


def _run_chain(seed, budget):
    steps, writes, diff_at = _chain(seed)
    delta = torch.zeros(2, len(steps))
    if diff_at is not None:
        delta[1, diff_at] = 0.5
    x = torch.randn(24, generator=torch.Generator().manual_seed(seed))
    return check(_chain_fn(steps, writes, diff_at), [x, delta], budget=budget)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("seed", range(25))
def test_random_chains(seed, budget):
    _run_chain(seed, budget)


@pytest.mark.slow
@pytest.mark.parametrize("budget", [0, 200, 1 << 30])
@pytest.mark.parametrize("seed", range(25, 225))
def test_random_chains_many(seed, budget):
    _run_chain(seed, budget)


# ---------------------------------------------------------------------------------------------
# run_parity: module snapshots (copy-on-write, >= 64 KiB) next to the op store


@pytest.mark.parametrize("budget", [0, None])
@pytest.mark.parametrize("when", ["before_read", "after_read"])
def test_run_parity_candidate_rewrites_a_snapshotted_permuted_output(when, budget, monkeypatch):
    """``a`` returns a 128 KiB dense permuted output (snapshotted copy-on-write, held by the op
    store with a storage digest); inside ``b`` the candidate adds 5 to its element [0, 0]
    through numpy, before or after ``b`` reads it. Hand-worked truth: a's op and a's module
    output are equal at op time (never a mismatch); when the write comes first, b's ``add``
    and ``sin``, b's output and the model's output differ, ``add`` by exactly 5 (0 + 5)."""
    import parity_tracker.ops as ops_mod
    from parity_tracker.run import run_parity
    from parity_tracker.tensor_checker import DumpMode

    if budget is not None:
        monkeypatch.setattr(ops_mod, "DEFAULT_MAX_RESIDENT_BYTES", budget)

    class A(nn.Module):
        def forward(self, x):
            return x.reshape(128, 256).t() * 2

    class B(nn.Module):
        def __init__(self, write: bool) -> None:
            super().__init__()
            self.write = write

        def forward(self, y):
            if self.write and when == "before_read":
                y.numpy()[0, 0] += 5
            z = y + 0.0
            if self.write and when == "after_read":
                y.numpy()[0, 0] += 5
            return z.sin()

    class M(nn.Module):
        def __init__(self, write: bool) -> None:
            super().__init__()
            self.a, self.b = A(), B(write)

        def forward(self, x):
            return self.b(self.a(x))

    x = torch.arange(1 << 15, dtype=torch.float32) / (1 << 15)
    res = run_parity(M(False), M(True), (x,), mode="equal", capture_ops=True,
                     dump_mode=DumpMode.NOT)  # fmt: skip
    ops = {r["tag"]: r for r in res.ops.to_pylist()}
    mods = {r["tag"]: r for r in res.modules.to_pylist()}
    differs = when == "before_read"
    assert ops["a@0::mul#0"]["status"] in ("equal", "error")
    assert mods["checker_a"]["status"] == "equal"
    for tag in ("b@0::add#0", "b@0::sin#0"):
        assert ops[tag]["status"] == ("mismatch" if differs else "equal"), ops[tag]
    for tag in ("checker_b", "checker_model"):
        assert mods[tag]["status"] == ("mismatch" if differs else "equal"), mods[tag]
    if differs:
        assert ops["b@0::add#0"]["max_abs_diff"] == 5.0


@pytest.mark.parametrize("tolerances", [None, {"*mul#1*": (0.5, 0.25), "*": (1e-3, 1e-4)}])
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("mode", ["equal", "allclose"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.complex64, torch.bool])
def test_settled_rows_are_the_rows_a_comparison_gives(dtype, mode, budget, tolerances, monkeypatch):
    """Every field of a settled row (all spilled; dense permuted pairs too) equals the row the
    full comparison gives the same pair (``_settled`` patched to settle nothing)."""
    from parity_tracker.localize import op_compare

    def fn(side, x):
        y = _unary(x)  # contiguous
        return _unary(y.t()), _unary(y)[:, :3]  # dense permuted; contiguous

    x = _source(dtype, "contig")
    if dtype.is_floating_point:
        x[0, 0], x[1, 1] = float("nan"), float("inf")
    settled = _run(fn, [x], budget, mode=mode, tolerances=tolerances)
    monkeypatch.setattr(op_compare, "_settled", lambda *a, **k: None)
    compared = _run(fn, [x], budget, mode=mode, tolerances=tolerances)
    assert len(settled) == len(compared) >= 3
    for a, b in zip(settled, compared, strict=True):
        assert a == b or {k: (a[k], b[k]) for k in a if a[k] != b[k]} == {}
    if mode == "allclose" and tolerances and dtype == torch.float32:  # the override, by hand
        by_tag = {r["tag"]: (r["rtol"], r["atol"]) for r in settled}
        assert by_tag["model@0::mul#1"] == (0.5, 0.25)
        assert by_tag["model@0::mul#0"] == by_tag["model@0::mul#2"] == (1e-3, 1e-4)


@pytest.mark.parametrize("budget", BUDGETS)
def test_ops_under_autograd_with_inputs_requiring_grad(budget):
    """Outputs that require grad (held detached): the truth's rows, all equal."""

    def fn(side, x):
        x = x.clone().requires_grad_()
        return ((x * 2).t() * 3).sum()

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    rows = check(fn, [x], budget=budget, grad_mode=torch.enable_grad)
    assert {r["status"] for r in rows.values()} == {"equal"} and len(rows) == 4


@pytest.mark.parametrize("budget", BUDGETS)
def test_sort_into_out_buffers_vs_fresh_outputs(budget):
    """The reference sorts into preallocated ``out=`` buffers, the candidate into fresh ones:
    values and indices equal (truth), the reference's ``empty`` one-sided."""

    def fn(side, x):
        if side:
            v, i = torch.sort(x, dim=1)
        else:
            v, i = torch.empty(3, 4), torch.empty(3, 4, dtype=torch.long)
            torch.sort(x, dim=1, out=(v, i))
        return v * 1, i * 1

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    rows = _run(fn, [x], budget)
    got = {r["tag"]: r["status"] for r in rows}
    assert got["model@0::sort#0"] == got["model@0::sort#0:1"] == "equal"
    assert got["model@0::mul#0"] == got["model@0::mul#1"] == "equal"
    assert got["model@0::empty#0"] == "missing_candidate"


# ---------------------------------------------------------------------------------------------
# hashing.c_order and content_hash on random strided views, against numpy


def _random_view(rng: random.Random, base: torch.Tensor) -> torch.Tensor:
    """A random as_strided view of ``base`` (size-1 dims, stride 0, overlaps, gaps, permuted)."""
    dims = rng.randint(2, 5)
    sizes = [rng.choice([1, 1, 2, 3, 4]) for _ in range(dims)]
    strides = [rng.choice([0, 1, 2, 3, 4, 6, 12, 24]) for _ in range(dims)]
    if rng.random() < 0.5:  # a dense permuted layout
        order = list(range(dims))
        rng.shuffle(order)
        acc = 1
        for d in reversed(order):
            strides[d], acc = acc, acc * sizes[d]
    span = 1 + sum((n - 1) * st for n, st in zip(sizes, strides, strict=True))
    offset = rng.randint(0, base.numel() - span)
    return base.as_strided(sizes, strides, offset)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.complex64])
def test_c_order_and_content_hash_on_random_views(dtype):
    import xxhash

    from parity_tracker.compare.hashing import c_order, content_hash

    rng = random.Random(5)
    base = (torch.arange(400, dtype=torch.float64) * 1.25 - 100).to(dtype)
    bits = base.view(torch.uint8).numpy().reshape(400, -1)  # each element's bytes
    for _ in range(300):
        v = _random_view(rng, base)
        flat_idx = np.ascontiguousarray(
            np.lib.stride_tricks.as_strided(
                np.arange(400, dtype=np.int64)[v.storage_offset() :],
                tuple(v.shape),
                tuple(s * 8 for s in v.stride()),
            )
        ).reshape(-1)
        expected = bits[flat_idx].reshape(-1)  # the C-order bytes, by numpy
        got = c_order(v)
        assert tuple(got.shape) == tuple(v.shape) and got.is_contiguous()
        flat = torch.as_strided(got, (got.numel(),), (1,))  # contiguous: consecutive elements
        assert np.array_equal(flat.view(torch.uint8).numpy(), expected), v.stride()
        header = f"{str(dtype).removeprefix('torch.')}|{tuple(v.shape)}|".encode()
        assert content_hash(v) == xxhash.xxh3_64(header + expected.tobytes()).hexdigest()
