"""Adversarial cases for wave 10 (w10brk; main 77d5827): the fused small-capture path, the
``auto`` budget run's fall-back to allclose, the heap trimmer armed at the peak and the
in-place readers of the histogram, the dump writer and the ONNX feed.

Every expected status / count / value is computed here, on private copies taken before any
hook runs (``clone()``; numpy), never from the code under test. Each seed-facade case runs on
three checkers (the fused eager path, the deferred path, and an eager checker whose resident
budget is too small to hold a bulk pair) that must agree with the independent expectation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture.snapshot import COW_MIN_BYTES
from parity_tracker.compare.batch import BULK_MAX_BYTES
from parity_tracker.run import run_parity
from parity_tracker.statuses import is_passing
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker

ENV = {"commit": "w10brk"}


# ---------------------------------------------------------------- independent expectations
def _want(ref: torch.Tensor, cand: torch.Tensor, mode: str = "equal") -> tuple[str, int | None]:
    """Status and mismatch count of two private copies (numpy, NaN == NaN); ``allclose``:
    torch.testing's float32 default (rtol 1.3e-6, atol 1e-5), written out."""
    if tuple(ref.shape) != tuple(cand.shape):
        return "shape_mismatch", None
    a = ref.detach().resolve_conj().resolve_neg().clone().contiguous()
    b = cand.detach().resolve_conj().resolve_neg().clone().contiguous()
    if a.dtype != b.dtype:
        return "mismatch", None  # a dtype mismatch: never equal (count not asserted)
    if a.dtype in (torch.bfloat16, torch.float16) or not a.dtype.is_floating_point:
        a, b = (a.double(), b.double()) if not a.dtype.is_complex else (a, b)
    if a.dtype == torch.complex32:  # no numpy form: widened
        a, b = a.to(torch.complex64), b.to(torch.complex64)
    if a.dtype in (torch.uint16, torch.uint32):
        a, b = a.to(torch.int64), b.to(torch.int64)
    if a.dtype.is_floating_point and a.dtype.itemsize == 1:  # float8: by value, widened
        a, b = a.double(), b.double()
    x, y = a.numpy(), b.numpy()
    same = (x == y) | (np.isnan(x) & np.isnan(y)) if x.dtype.kind in "fc" else x == y
    bad = int(np.size(same) - np.count_nonzero(same))
    if mode == "allclose" and bad and x.dtype == np.float32:
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        ok = same | (np.abs(x64 - y64) <= 1e-5 + 1.3e-6 * np.abs(y64))
        far = int(np.size(ok) - np.count_nonzero(ok))
        return ("close" if far == 0 else "mismatch"), far
    return ("equal" if bad == 0 else "mismatch"), bad


_CONFIGS = {
    "fused": dict(eager_mode="equal"),
    "deferred": dict(eager_mode=None),
    "no_bulk_room": dict(eager_mode="equal", max_resident_bytes=2 * BULK_MAX_BYTES * 16 - 1),
    "spill_all": dict(eager_mode="equal", max_resident_bytes=0),
}


def _seq(tag, ref_make, cand_make, mutate_after_ref=None, cand_first=False):
    """A case: register ``ref`` (side 0) then ``cand`` (side 1) (or the other way round),
    ``mutate_after_ref(ref, cand)`` run between the two; returns (steps, expected)."""

    def build():
        ref = ref_make()
        cand = cand_make(ref)
        first, second = ((1, cand), (0, ref)) if cand_first else ((0, ref), (1, cand))
        private_first = first[1].detach().clone()
        steps = [("reg", tag, first[1], first[0])]
        if mutate_after_ref is not None:
            steps.append(("call", mutate_after_ref, ref, cand))
        steps.append(("reg", tag, second[1], second[0]))
        return steps, private_first, first[0]

    return build


def _play(checker, build):
    steps, private_first, first_side = build()
    second_private = None
    for s in steps:
        if s[0] == "reg":
            _, tag, t, side = s
            if side != first_side:
                second_private = t.detach().clone()
            checker.register_tensor(tag, t, side=side)
        else:
            s[1](s[2], s[3])
    if first_side == 0:
        return _want(private_first, second_private)
    return _want(second_private, private_first)


def _numpy_write(ref, cand):
    ref.numpy()[0] = 99  # a write torch never counts


def _as_strided_write(ref, cand):
    ref._base_holder[::2].add_(10)


def _strided_pair():
    base = torch.arange(8.0)
    v = base.as_strided((4,), (2,))
    v._base_holder = base  # the test keeps its base to write through another view
    return v


def _complex():
    return torch.complex(torch.arange(4.0), torch.ones(4))


_CASES = {
    "inplace_add_after_ref": (lambda: torch.arange(6.0), lambda r: r, lambda r, c: r.add_(1)),
    "data_write_after_ref": (lambda: torch.arange(4.0), lambda r: r, lambda r, c: r.data.mul_(2)),
    "numpy_write_after_ref": (lambda: torch.arange(4.0), lambda r: r, _numpy_write),
    "set_after_ref": (
        lambda: torch.arange(4.0),
        lambda r: r,
        lambda r, c: r.set_(torch.arange(4.0) + 7),
    ),
    "resize_after_ref": (lambda: torch.arange(4.0), lambda r: r, lambda r, c: r.resize_(2, 2)),
    "resize_same_numel_1d": (lambda: torch.arange(4.0), lambda r: r, lambda r, c: r.resize_(4, 1)),
    "as_strided_shared_storage": (_strided_pair, lambda r: r, _as_strided_write),
    "shape_only_differs": (
        lambda: torch.arange(6.0).reshape(2, 3),
        lambda r: r.reshape(3, 2),
        None,
    ),
    "flat_vs_2d": (lambda: torch.arange(6.0).reshape(2, 3), lambda r: r.reshape(6), None),
    "0d_vs_1": (lambda: torch.tensor(1.0), lambda r: r.reshape(1), None),
    "empty_0x3_vs_3x0": (lambda: torch.zeros(0, 3), lambda r: torch.zeros(3, 0), None),
    "empty_equal": (lambda: torch.zeros(0, 3), lambda r: torch.zeros(0, 3), None),
    "0d_equal": (lambda: torch.tensor(2.5), lambda r: torch.tensor(2.5), None),
    "0d_differs": (lambda: torch.tensor(2.5), lambda r: torch.tensor(2.25), None),
    "complex_conj_view": (_complex, lambda r: r.conj(), None),
    "complex_conj_vs_resolved": (lambda: _complex().conj(), lambda r: r.resolve_conj(), None),
    "complex_neg_view": (_complex, lambda r: torch._neg_view(r), None),
    "real_neg_view": (lambda: torch.arange(1.0, 5.0), lambda r: torch._neg_view(r), None),
    "real_neg_view_ref": (
        lambda: torch._neg_view(torch.arange(1.0, 5.0)),
        lambda r: torch.arange(1.0, 5.0),
        None,
    ),
    "neg_view_equal": (
        lambda: torch._neg_view(torch.arange(1.0, 5.0)),
        lambda r: -torch.arange(1.0, 5.0),
        None,
    ),
    "stride0_expand": (
        lambda: torch.tensor(1.0).expand(4),
        lambda r: torch.tensor([1.0, 1, 1, 2]),
        None,
    ),
    "stride0_equal": (lambda: torch.tensor(1.0).expand(2, 3), lambda r: torch.ones(2, 3), None),
    "transposed_live": (
        lambda: torch.arange(12.0).reshape(3, 4),
        lambda r: torch.arange(12.0).reshape(4, 3).t(),
        None,
    ),
    "transposed_equal": (
        lambda: torch.arange(12.0).reshape(3, 4),
        lambda r: r.t().contiguous().t(),
        None,
    ),
    "offset_view": (lambda: torch.arange(10.0)[3:7], lambda r: torch.arange(10.0)[4:8], None),
    "size1_odd_strides": (
        lambda: torch.arange(8.0).as_strided((1, 3, 1), (99, 2, 7), 1),
        lambda r: torch.tensor([[[1.0], [3.0], [6.0]]]),
        None,
    ),
    "bf16_last_bit": (
        lambda: torch.ones(8, dtype=torch.bfloat16),
        lambda r: torch.ones(8, dtype=torch.bfloat16).index_fill(0, torch.tensor([7]), 1.0078125),
        None,
    ),
    "fp16_vs_bf16_bits": (
        lambda: torch.ones(3, dtype=torch.bfloat16),
        lambda r: torch.ones(3, dtype=torch.float16),
        None,
    ),
    "float8": (
        lambda: torch.ones(3).to(torch.float8_e4m3fn),
        lambda r: (torch.ones(3) * 1.125).to(torch.float8_e4m3fn),
        None,
    ),
    "int64_vs_int32": (lambda: torch.arange(3), lambda r: torch.arange(3, dtype=torch.int32), None),
    "int_one_off": (
        lambda: torch.arange(7),
        lambda r: torch.arange(7).index_fill(0, torch.tensor([6]), 0),
        None,
    ),
    "bool_flip": (
        lambda: torch.ones(5, dtype=torch.bool),
        lambda r: torch.tensor([1, 1, 0, 1, 1]).bool(),
        None,
    ),
    "neg_zero": (lambda: torch.zeros(3), lambda r: -torch.zeros(3), None),
    "nan_same": (lambda: torch.full((3,), math.nan), lambda r: torch.full((3,), math.nan), None),
    "nan_vs_num": (lambda: torch.full((3,), math.nan), lambda r: torch.zeros(3), None),
    "at_bound_last_differs": (
        lambda: torch.zeros(BULK_MAX_BYTES // 4),
        lambda r: torch.zeros(BULK_MAX_BYTES // 4).index_fill(
            0, torch.tensor([BULK_MAX_BYTES // 4 - 1]), 1.0
        ),
        None,
    ),
    "over_bound_last_differs": (
        lambda: torch.zeros(BULK_MAX_BYTES // 4 + 1),
        lambda r: torch.zeros(BULK_MAX_BYTES // 4 + 1).index_fill(
            0, torch.tensor([BULK_MAX_BYTES // 4]), 1.0
        ),
        None,
    ),
    "at_bound_bytes_bf16": (
        lambda: torch.zeros(BULK_MAX_BYTES // 2, dtype=torch.bfloat16),
        lambda r: torch.zeros(BULK_MAX_BYTES // 2, dtype=torch.bfloat16).index_fill(
            0, torch.tensor([0]), 1.0
        ),
        None,
    ),
    "complex32": (
        lambda: torch.ones(4, dtype=torch.complex32),
        lambda r: torch.ones(4, dtype=torch.complex32).index_fill(0, torch.tensor([3]), 2.0),
        None,
    ),
    "uint16": (
        lambda: torch.arange(5).to(torch.uint16),
        lambda r: torch.tensor([65535, 1, 2, 3, 4]).to(torch.uint16),
        None,
    ),
    "uint32_equal": (
        lambda: torch.arange(5).to(torch.uint32),
        lambda r: torch.arange(5).to(torch.uint32),
        None,
    ),
    "channels_last_4d": (
        lambda: torch.arange(24.0).reshape(1, 2, 3, 4),
        lambda r: (
            torch.arange(24.0)
            .reshape(1, 2, 3, 4)
            .contiguous(memory_format=torch.channels_last)
            .index_fill(3, torch.tensor([0]), 0.0)
        ),
        None,
    ),
    "nan_payloads_f32": (
        lambda: torch.tensor([0x7FC00000, 0x3F800000], dtype=torch.int32).view(torch.float32),
        lambda r: torch.tensor([0x7FC00001, 0x3F800000], dtype=torch.int32).view(torch.float32),
        None,
    ),
    "nan_sign_bf16": (
        lambda: torch.tensor([0x7FC0, 0x3F80], dtype=torch.int16).view(torch.bfloat16),
        lambda r: torch.tensor([-64, 0x3F80], dtype=torch.int16).view(torch.bfloat16),  # 0xFFC0
        None,
    ),
    "inf_vs_nan_f16": (
        lambda: torch.tensor([math.inf, 1.0], dtype=torch.float16),
        lambda r: torch.tensor([math.nan, 1.0], dtype=torch.float16),
        None,
    ),
    "parameter_live": (
        lambda: torch.arange(4.0),
        lambda r: nn.Parameter(torch.arange(4.0) + 1),
        None,
    ),
}


@pytest.mark.parametrize("cand_first", [False, True], ids=["ref_first", "cand_first"])
@pytest.mark.parametrize("config", sorted(_CONFIGS))
@pytest.mark.parametrize("case", sorted(_CASES))
def test_seed_facade_register_tensor_verdicts(case, config, cand_first):
    ref_make, cand_make, mutate = _CASES[case]
    checker = TensorChecker(verbose=False, **_CONFIGS[config])
    want = _play(checker, _seq("t", ref_make, cand_make, mutate, cand_first))
    (row,) = checker.check("equal").to_rows()
    assert row["status"] == want[0], (case, row)
    if want[1] is not None:
        assert row["mismatch_count"] == want[1], (case, row)


# ---------------------------------------------------------------- hooked models
class Ident(nn.Module):
    def forward(self, x):
        return x


class AddInplace(nn.Module):
    def __init__(self, v: float = 1.0) -> None:
        super().__init__()
        self.v = v

    def forward(self, x):
        return x.add_(self.v)


class Add(AddInplace):
    def forward(self, x):
        return x + self.v


class MulDataInplace(nn.Module):
    """Writes its input through ``.data`` (a write autograd's version counter sees)."""

    def forward(self, x):
        x.data.mul_(2)
        return x


class NumpyWrite(nn.Module):
    """Writes its input through a numpy view (a write torch never counts)."""

    def forward(self, x):
        x.numpy()[0] = 100.0
        return x


class SetInplace(nn.Module):
    def forward(self, x):
        return x.set_(x.detach().clone() * 3)


class Chain(nn.Module):
    def __init__(self, *mods) -> None:
        super().__init__()
        self.m = nn.ModuleList(mods)

    def forward(self, x):
        for m in self.m:
            x = m(x)
        return x


def _private_capture(model, run):
    """{(module name, kind, step): private clone} of every module's input 0 and output, by this
    test's own hooks (pre-hook: input before the forward; hook: output after it)."""
    got: dict = {}
    step = [0]
    hs = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList):
            continue
        key = name or "model"

        def pre(m, args, key=key):
            if args and isinstance(args[0], torch.Tensor):
                got[(key, "input", step[0])] = args[0].detach().clone()

        def post(m, args, out, key=key):
            if isinstance(out, torch.Tensor):
                got[(key, "output", step[0])] = out.detach().clone()

        hs += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    try:
        with torch.no_grad():
            run(model, step)
    finally:
        for h in hs:
            h.remove()
    return got


def _assert_rows(rows, ref_got, cand_got, mode="equal"):
    seen = 0
    for r in rows:
        if r["kind"] not in ("input", "output") or not r["tag"].endswith(("_input_0", r["tag"])):
            continue
        if r["kind"] == "input" and not r["tag"].endswith("_input_0"):
            continue
        key = (r["module"], r["kind"], r["step"])
        if key not in ref_got:
            continue
        want = _want(ref_got[key], cand_got[key], mode)
        assert r["status"] == want[0], (key, r["status"], r["mismatch_count"], want)
        if want[1] is not None:
            assert r["mismatch_count"] == want[1], (key, r, want)
        seen += 1
    return seen


_CHAINS = {
    "identity_then_inplace_vs_outofplace": (
        lambda: Chain(Ident(), AddInplace()),
        lambda: Chain(Add(), Ident()),
    ),
    "same_object_many_tags": (
        lambda: Chain(Ident(), AddInplace(2.0), Ident(), AddInplace(-2.0), Ident()),
        lambda: Chain(Ident(), Ident(), Ident(), Ident(), Ident()),
    ),
    "data_write_in_forward": (
        lambda: Chain(Ident(), MulDataInplace(), Ident()),
        lambda: Chain(Ident(), Ident(), Ident()),
    ),
    "numpy_write_in_forward": (
        lambda: Chain(Ident(), NumpyWrite(), Ident()),
        lambda: Chain(Ident(), Ident(), Ident()),
    ),
    "set_in_forward": (
        lambda: Chain(Ident(), SetInplace(), Ident()),
        lambda: Chain(Ident(), Ident(), Ident()),
    ),
    "cand_mutates_ref_does_not": (
        lambda: Chain(Ident(), Add(0.0), Ident()),
        lambda: Chain(Ident(), AddInplace(0.5), Ident()),
    ),
}


def _one_step(model, step, x):
    model(x.clone())


@pytest.mark.parametrize("n", [6, BULK_MAX_BYTES // 4, BULK_MAX_BYTES // 4 + 3])
@pytest.mark.parametrize("mode", ["equal", "allclose"])
@pytest.mark.parametrize("case", sorted(_CHAINS))
def test_run_parity_chains_with_inplace_writes(case, mode, n):
    make_ref, make_cand = _CHAINS[case]
    x = torch.linspace(-3, 3, n)
    ref_got = _private_capture(make_ref(), lambda m, s: _one_step(m, s, x))
    cand_got = _private_capture(make_cand(), lambda m, s: _one_step(m, s, x))
    res = run_parity(make_ref(), make_cand(), (x.clone(),), mode=mode, environment=ENV,
                     dump_mode=DumpMode.NOT)  # fmt: skip
    rows = res.modules.to_pylist()
    assert _assert_rows(rows, ref_got, cand_got, mode) >= 4


@pytest.mark.parametrize("config", sorted(_CONFIGS))
@pytest.mark.parametrize("case", sorted(_CHAINS))
def test_seed_facade_chains_multi_step(case, config):
    make_ref, make_cand = _CHAINS[case]
    xs = [torch.linspace(-3, 3, 6) * (k + 1) for k in range(3)]

    def drive(m, step):
        for k, x in enumerate(xs):
            step[0] = k
            m(x.clone())

    ref_got = _private_capture(make_ref(), drive)
    cand_got = _private_capture(make_cand(), drive)
    checker = TensorChecker(verbose=False, **_CONFIGS[config])
    ref, cand = make_ref(), make_cand()
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        for k, x in enumerate(xs):
            checker.step = k
            ref(x.clone())
            cand(x.clone())
        rows = checker.check("equal").to_rows()
    assert _assert_rows(rows, ref_got, cand_got) >= 12


class KV(nn.Module):
    """A decode step: writes ``x`` into row ``pos`` of its cache in place and returns the
    cache itself (the same small tensor object at every step)."""

    def __init__(self, bad_step: int | None = None) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 3))
        self.pos = 0
        self.bad_step = bad_step

    def forward(self, x):
        v = x * 1.5 if self.pos == self.bad_step else x
        self.cache[self.pos] = v
        self.pos += 1
        return self.cache


class Decoder(nn.Module):
    def __init__(self, bad_step=None) -> None:
        super().__init__()
        self.kv = KV(bad_step)
        self.post = Ident()

    def forward(self, x):
        return self.post(self.kv(x))


class Decoder2(Decoder):
    """Two tokens a step: the cache is captured, written and captured again in one step
    (``kv`` and ``kv@1``), and ``post`` reads it after both writes."""

    def forward(self, x):
        self.kv(x)
        return self.post(self.kv(x + 0.5))


def _calls_capture(model, xs):
    """{(module, call, step): output clone} by this test's own hooks."""
    got, calls = {}, {}
    step = [0]

    def post(m, a, out, key):
        k = calls.get((key, step[0]), 0)
        calls[(key, step[0])] = k + 1
        got[(key, k, step[0])] = out.detach().clone()

    hs = [mod.register_forward_hook(lambda m, a, o, key=n: post(m, a, o, key))
          for n, mod in model.named_modules() if n]  # fmt: skip
    with torch.no_grad():
        for s_, x in enumerate(xs):
            step[0] = s_
            model(x)
    for h in hs:
        h.remove()
    return got


@pytest.mark.parametrize("bad_step", [None, 0, 1])
@pytest.mark.parametrize("config", sorted(_CONFIGS))
def test_kv_cache_two_writes_a_step(config, bad_step):
    xs = [torch.arange(3.0) + 10 * k for k in range(2)]
    ref_got = _calls_capture(Decoder2(), xs)
    cand_got = _calls_capture(Decoder2(bad_step), xs)
    checker = TensorChecker(verbose=False, **_CONFIGS[config])
    ref, cand = Decoder2(), Decoder2(bad_step)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        for k, x in enumerate(xs):
            checker.step = k
            ref(x)
            cand(x)
        rows = [r for r in checker.check("equal").to_rows() if r["kind"] == "output"]
    seen = 0
    for r in rows:
        if r["module"] not in ("kv", "post"):
            continue
        call = 1 if "@1" in r["tag"] else 0
        key = (r["module"], call, r["step"])
        want = _want(ref_got[key], cand_got[key])
        assert (r["status"], r["mismatch_count"]) == want, (r["tag"], r["step"], want)
        seen += 1
    assert seen == 2 * 3  # kv, kv@1, post at 2 steps


@pytest.mark.parametrize("bad_step", [None, 0, 2])
@pytest.mark.parametrize("config", sorted(_CONFIGS))
def test_kv_cache_decode_loop_captured_mutated_recaptured(config, bad_step):
    xs = [torch.arange(3.0) + 10 * k for k in range(4)]

    def drive(m, step):
        for k, x in enumerate(xs):
            step[0] = k
            m(x)

    ref_got = _private_capture(Decoder(), drive)
    cand_got = _private_capture(Decoder(bad_step), drive)
    checker = TensorChecker(verbose=False, **_CONFIGS[config])
    ref, cand = Decoder(), Decoder(bad_step)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        for k, x in enumerate(xs):
            checker.step = k
            ref(x)
            cand(x)
        rows = checker.check("equal").to_rows()
    assert (
        _assert_rows(rows, ref_got, cand_got) == 4 * 6
    )  # model, kv, post: input and output, 4 steps
    if bad_step is not None:
        bad = [r for r in rows if r["status"] != "equal"]
        assert bad, "a differing cache row must show"


# ---------------------------------------------------------------- parameters
class Scale(nn.Module):
    def __init__(self, n: int, v: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((n,), v))

    def forward(self, x):
        return x * self.weight


_PARAM_WRITES = {
    "data_fill": lambda w, v: w.data.fill_(v),
    "no_grad_fill": lambda w, v: _no_grad(w.fill_, v),
    "numpy_fill": lambda w, v: w.detach().numpy().fill(v),
    "set_": lambda w, v: _no_grad(w.set_, torch.full(w.shape, v)),
    "data_assign": lambda w, v: setattr(w, "data", torch.full(w.shape, v)),
}


def _no_grad(f, *a):
    with torch.no_grad():
        return f(*a)


@pytest.mark.parametrize("n", [4, BULK_MAX_BYTES // 4, BULK_MAX_BYTES // 4 + 1, 5000])
@pytest.mark.parametrize("write", sorted(_PARAM_WRITES))
@pytest.mark.parametrize("config", sorted(_CONFIGS))
@pytest.mark.parametrize("who", ["ref_after_its_capture", "cand_after_its_capture"])
def test_parameter_written_after_its_capture_keeps_its_captured_values(who, config, write, n):
    """The reference's weight (1.0) is captured, then written to the candidate's value (2.0)
    before the candidate runs (or the candidate's after its capture, to the reference's):
    the weights as captured differ at every element, so the weight row is a mismatch of n."""
    checker = TensorChecker(verbose=False, **_CONFIGS[config])
    ref, cand = Scale(n, 1.0), Scale(n, 2.0)
    x = torch.ones(n)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(x)
        if who == "ref_after_its_capture":
            _PARAM_WRITES[write](ref.weight, 2.0)
        cand(x)
        if who == "cand_after_its_capture":
            _PARAM_WRITES[write](cand.weight, 1.0)
        rows = {r["kind"]: r for r in checker.check("equal").to_rows() if r["module"] == "model"}
    w = [r for r in checker.check("equal").to_rows() if r["kind"] not in ("input", "output")]
    assert len(w) == 1, w
    assert (w[0]["status"], w[0]["mismatch_count"]) == ("mismatch", n), w[0]
    assert rows["output"]["status"] == "mismatch" and rows["output"]["mismatch_count"] == n


# ---------------------------------------------------------------- auto's fall-back to allclose
class Late(nn.Module):
    """``a`` and ``b`` run; ``c`` upcasts to a hard-coded float32 before its Linear: a bf16
    twin raises there, after two modules have been captured (``big``: only for inputs of more
    than 3 rows, so a drive's step 0 runs and step 1 raises)."""

    def __init__(self, big_only: bool = False) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)
        self.big_only = big_only

    def forward(self, x):
        h = self.b(self.a(x))
        if not self.big_only or x.shape[0] > 3:
            h = h.float()
        return self.c(h)


class LateEngine(Late):
    """The engine: casts back to its own weights' dtype (it runs at bf16)."""

    def __init__(self, big_only: bool = False, bug: float = 0.0, raises: bool = False):
        super().__init__(big_only)
        self.bug, self.raises = bug, raises

    def forward(self, x):
        h = self.b(self.a(x.to(self.a.weight.dtype))) + self.bug
        if self.raises:
            raise RuntimeError("the candidate failed too")
        return self.c(h.to(self.c.weight.dtype))


def _pair(big_only=False, **kw):
    torch.manual_seed(41)
    ref = Late(big_only).eval()
    cand = LateEngine(big_only, **kw).eval()
    cand.load_state_dict(ref.state_dict())
    return ref, cand.bfloat16()


_DROP = {"run_id", "duration_s", "wall_s", "seconds"}


def _clean(rows):
    return sorted(
        (tuple(sorted((k, repr(v)) for k, v in r.items() if k not in _DROP and "time" not in k))
         for r in rows),
    )  # fmt: skip


def _fallback_and_plain(capture_ops=False, drive=None, inputs=None, **kw):
    ref, cand = _pair(**kw)
    common = dict(environment=ENV, settings={"quantization": "bf16"}, dump_mode=DumpMode.NOT,
                  capture_ops=capture_ops)  # fmt: skip
    args = dict(drive=drive) if drive else dict(inputs=inputs)
    auto = run_parity(ref, cand, mode="auto", **args, **common)
    ref2, cand2 = _pair(**kw)
    plain = run_parity(ref2, cand2, mode="allclose", **args, **common)
    return auto, plain


def _x():
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("capture_ops", [False, True])
def test_auto_late_twin_failure_leaves_no_trace(capture_ops):
    auto, plain = _fallback_and_plain(capture_ops, inputs=(_x(),), bug=0.25)
    s = auto.summary
    assert s["mode"] == "allclose" and s["status"] == "completed", s.get("error")
    if not capture_ops:  # (op-level runs never try the budget: capture_ops is refused first)
        assert "the twin could not run (RuntimeError: " in s["mode_reason"]
    assert "compared by allclose instead" in s["mode_reason"]
    assert "reference_side" not in s["settings"] and s["settings"]["mode"] == "allclose"
    rows = auto.modules.to_pylist()
    keys = [(r["tag"], r["step"]) for r in rows]
    assert len(keys) == len(set(keys)), "a row of the discarded twin attempt leaked"
    assert _clean(rows) == _clean(plain.modules.to_pylist())
    assert _clean(auto.ops.to_pylist()) == _clean(plain.ops.to_pylist())
    if capture_ops:
        assert auto.ops.num_rows > 0
    # independent: the output's max |Δ| of the user's reference vs the candidate (numpy)
    ref, cand = _pair(bug=0.25)
    with torch.no_grad():
        want = float(np.abs(ref(_x()).double().numpy() - cand(_x()).double().numpy()).max())
    out = [r for r in rows if r["module"] in ("", "model") and r["kind"] == "output"]
    assert out and out[0]["max_abs_diff"] == pytest.approx(want, rel=1e-12, abs=0)
    for k in ("passed", "status", "counts", "worst"):
        if k in s:
            assert s[k] == plain.summary[k], k


def test_auto_twin_failure_at_step_1_of_a_drive():
    xs = [torch.randn(2, 4, generator=torch.Generator().manual_seed(5)), _x()]

    def drive(model, rec):
        dtype = next(model.parameters()).dtype
        for i, x in enumerate(xs):
            rec(i)
            model(x.to(dtype) if dtype == torch.bfloat16 else x)

    auto, plain = _fallback_and_plain(drive=drive, big_only=True, bug=0.25)
    s = auto.summary
    assert s["mode"] == "allclose" and s["status"] == "completed", (
        s["mode_reason"],
        s.get("error"),
    )
    rows = auto.modules.to_pylist()
    assert {r["step"] for r in rows} == {0, 1}
    keys = [(r["tag"], r["step"]) for r in rows]
    assert len(keys) == len(set(keys))
    assert _clean(rows) == _clean(plain.modules.to_pylist())


def test_auto_twin_failure_then_the_candidate_fails_too():
    auto, _ = _fallback_and_plain(inputs=(_x(),), raises=True)
    s = auto.summary
    assert s["mode"] == "allclose" and s["status"] == "failed"
    assert s["error"]["side"] == "candidate" and "failed too" in s["error"]["message"]
    assert "the twin could not run" in s["mode_reason"]


def test_explicit_budget_keeps_the_twin_failure():
    ref, cand = _pair()
    res = run_parity(ref, cand, (_x(),), mode="budget", environment=ENV,
                     settings={"quantization": "bf16"}, dump_mode=DumpMode.NOT)  # fmt: skip
    s = res.summary
    assert s["status"] == "failed" and s["error"]["side"] == "reference", s
    assert s["mode"] == "budget"


class Interrupt(Late):
    def forward(self, x):
        if next(self.parameters()).dtype == torch.bfloat16:
            self.b(self.a(x))
            raise KeyboardInterrupt
        return super().forward(x)


def test_auto_twin_keyboard_interrupt_is_not_a_fallback():
    torch.manual_seed(41)
    ref = Interrupt().eval()
    cand = LateEngine().eval()
    cand.load_state_dict(ref.state_dict())
    cand.bfloat16()
    res = run_parity(ref, cand, (_x(),), mode="auto", environment=ENV,
                     settings={"quantization": "bf16"}, dump_mode=DumpMode.NOT)  # fmt: skip
    s = res.summary
    assert s["status"] == "killed" and s["mode"] != "allclose", (s["status"], s["mode_reason"])
    assert "the twin could not run" not in s["mode_reason"]


def test_auto_fallback_dump_holds_only_the_kept_run(tmp_path):
    import json

    dirs = {}
    for mode in ("auto", "allclose"):
        ref, cand = _pair(bug=0.25)
        os_dir = tmp_path / mode
        res = run_parity(ref, cand, (_x(),), mode=mode, environment=ENV,
                         settings={"quantization": "bf16"}, dump_mode=DumpMode.ALL,
                         dump_path=os_dir)  # fmt: skip
        dirs[mode] = res
    a, p = dirs["auto"], dirs["allclose"]
    assert a.summary["mode"] == "allclose"
    fa = sorted(x.name for x in a.dump_dir.rglob("*.npy"))
    fp = sorted(x.name for x in p.dump_dir.rglob("*.npy"))
    assert fa == fp and fa
    for f in a.dump_dir.rglob("*.npy"):
        g = next(p.dump_dir.rglob(f.name))
        np.testing.assert_array_equal(np.load(f), np.load(g))
    for f in a.dump_dir.rglob("*.json"):
        json.loads(f.read_text(), parse_constant=lambda c: pytest.fail(c))


def test_auto_fallback_reason_drops_the_twin_notes():
    """Fixed here (run/run.py): the fall-back's ``mode_reason`` kept "error budget against a
    float64 golden ...; reference_side: twin (the reference at bfloat16; its own forward not
    run)" although the run compared by allclose against the user's reference, which ran
    (``reason.removesuffix(BUDGET_NOTE)`` missed: the twin note came after it)."""
    auto, _ = _fallback_and_plain(inputs=(_x(),), bug=0.25)
    reason = auto.summary["mode_reason"]
    assert "reference_side" not in reason and "its own forward not run" not in reason, reason
    assert "error budget against a float64 golden" not in reason, reason
    assert reason.startswith("quantization=bf16") and reason.endswith(
        "compared by allclose instead"
    )


# ---------------------------------------------------------------- heap trimmer armed at the peak
def test_trimmer_armed_at_the_peak_hand_worked(monkeypatch):
    """every=10, peak 100 at arm(): reads 105 (<= 110: none), 115 (> 110: trim; after: 90),
    112 (> max(90, 100) + 10: trim; after: 100) → 2 trims; a later arm() with an unknown
    peak (-1) keeps the floor (reads 105: none)."""
    from parity_tracker.capture import heap_trim
    from parity_tracker.capture.heap_trim import HeapTrimmer

    monkeypatch.delenv(heap_trim.ENV, raising=False)
    calls: list[int] = []
    seq = iter([105, 115, 90, 112, 100, 105])
    peaks = iter([100, -1])
    t = HeapTrimmer(every=10, trim=calls.append, resident=lambda: next(seq),
                    peak=lambda: next(peaks))  # fmt: skip
    t.arm()
    for _ in range(3):
        t.admitted(10)
    assert t.trims == 2 and len(calls) == 2
    t.arm()
    t.admitted(10)
    assert t.trims == 2


@pytest.mark.parametrize("case", sorted(_CHAINS))
def test_trimming_at_every_admission_changes_no_fused_verdict(case, monkeypatch):
    from parity_tracker.capture import heap_trim
    from parity_tracker.capture.heap_trim import HeapTrimmer

    trims = []
    rising = iter(range(1 << 40, 1 << 62, 1 << 30))
    monkeypatch.delenv(heap_trim.ENV, raising=False)
    monkeypatch.setattr(heap_trim, "trimmer", HeapTrimmer(
        every=1, trim=lambda pad: trims.append(pad) or 0, resident=lambda: next(rising),
        peak=lambda: 0))  # fmt: skip
    make_ref, make_cand = _CHAINS[case]
    x = torch.linspace(-3, 3, 6)
    ref_got = _private_capture(make_ref(), lambda m, s: _one_step(m, s, x))
    cand_got = _private_capture(make_cand(), lambda m, s: _one_step(m, s, x))
    res = run_parity(make_ref(), make_cand(), (x.clone(),), mode="equal", environment=ENV,
                     dump_mode=DumpMode.NOT)  # fmt: skip
    assert _assert_rows(res.modules.to_pylist(), ref_got, cand_got) >= 4
    assert trims


# ---------------------------------------------------------------- in-place readers
def _odd_tensors():
    g = torch.Generator().manual_seed(9)
    base = torch.randn(6, 8, generator=g, dtype=torch.float64)
    z = torch.complex(base, base.flip(0))
    return {
        "transposed_f64": base.t(),
        "step_f32": base.float()[::2, 1::3],
        "neg_view_f64": torch._neg_view(base),
        "neg_view_f32_T": torch._neg_view(base.float()).t(),
        "conj_c128": z.conj(),
        "conj_c64_T": z.to(torch.complex64).conj().t(),
        "0d_f64": base[2, 3],
        "bf16_T": base.bfloat16().t(),
        "f16": base.half(),
        "int32_T": (base * 10).int().t(),
        "stride0": base[1, :3].expand(4, 3),
        "empty": base[:0],
    }


@pytest.mark.parametrize("name", sorted(_odd_tensors()))
def test_histogram_reads_values_in_place_and_leaves_storage_resizable(name):
    from parity_tracker.run.histogram import _float64

    t = _odd_tensors()[name]
    private = t.detach().resolve_conj().resolve_neg().clone()
    want = (private.abs() if private.is_complex() else private).double().contiguous().numpy()
    got = _float64(t)
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    del got
    if t._base is None and t.untyped_storage().nbytes():
        assert t.untyped_storage().resizable()


@pytest.mark.parametrize("name", sorted(_odd_tensors()))
def test_dump_to_numpy_values_and_widening(name):
    from parity_tracker.files.dump import to_numpy

    t = _odd_tensors()[name]
    private = t.detach().resolve_conj().resolve_neg().clone().contiguous()
    wide = {torch.bfloat16: torch.float32}.get(private.dtype, private.dtype)
    want = private.to(wide).numpy()
    array, info, _ = to_numpy(t)
    assert info["dtype"] == str(t.dtype).removeprefix("torch.")
    assert info["shape"] == list(t.shape)
    assert array.dtype == want.dtype and array.shape == want.shape, (array.dtype, want.dtype)
    np.testing.assert_array_equal(array, want)


@pytest.mark.parametrize("name", sorted(_odd_tensors()))
def test_onnx_feed_values(name):
    pytest.importorskip("onnx")
    from parity_tracker.adapters.onnx import _numpy

    t = _odd_tensors()[name]
    if t.dtype == torch.bfloat16:
        pytest.skip("numpy has no bfloat16")
    want = t.detach().resolve_conj().resolve_neg().clone().contiguous().numpy()
    got = _numpy(t)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.int64])
def test_users_tensor_stays_resizable_after_histogram_dump_and_feed(dtype):
    from parity_tracker.files.dump import to_numpy
    from parity_tracker.run.histogram import _float64

    t = torch.arange(12, dtype=torch.float64).to(dtype).reshape(3, 4)
    want = t.double().clone().numpy()
    np.testing.assert_array_equal(_float64(t), want)
    a, _, _ = to_numpy(t)
    np.testing.assert_array_equal(a.astype(np.float64), want)
    del a
    if dtype != torch.bfloat16:
        pytest.importorskip("onnx")
        from parity_tracker.adapters.onnx import _numpy

        f = _numpy(t)
        np.testing.assert_array_equal(f.astype(np.float64), want)
        del f
    import gc

    gc.collect()
    assert t.untyped_storage().resizable()
    t.resize_(5, 5)  # the model may still grow it
    assert tuple(t.shape) == (5, 5)


# ---------------------------------------------------------------- dedupe of re-captured pairs
@pytest.mark.parametrize("n", [1, 6])
@pytest.mark.parametrize("config", sorted(_CONFIGS))
def test_one_object_under_two_tags_with_per_tag_tolerances(config, n):
    """One reference object and one candidate object, each under tags ``a`` then ``b`` (a
    module's output, the next one's input): the pair under ``b`` repeats ``a``'s bytes; ``a``
    has a loose tolerance, ``b`` the default. Δ = 0.5 everywhere: ``a`` close, ``b`` mismatch."""
    mode = "allclose"
    kw = dict(_CONFIGS[config])
    if kw["eager_mode"]:
        kw["eager_mode"] = mode
    checker = TensorChecker(verbose=False, tolerances={"a": (0.0, 1.0)}, **kw)
    ref, cand = torch.full((n,), 2.0), torch.full((n,), 2.5)
    for tag in ("a", "b"):
        checker.register_tensor(tag, ref, side=0)
    for tag in ("a", "b"):
        checker.register_tensor(tag, cand, side=1)
    rows = {r["tag"]: r for r in checker.check(mode).to_rows()}
    assert (rows["a"]["status"], rows["a"]["mismatch_count"]) == ("close", 0)
    assert (rows["b"]["status"], rows["b"]["mismatch_count"]) == ("mismatch", n)


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.uint8, torch.float32])
@pytest.mark.parametrize("config", sorted(_CONFIGS))
def test_one_byte_and_empty_pairs_under_many_tags(config, dtype):
    """CPython shares one ``bytes`` object per 1-byte value and one empty ``bytes``: the
    dedupe keyed by ``id`` of the reference bytes must still compare each tag's own pair."""
    checker = TensorChecker(verbose=False, **_CONFIGS[config])
    one = torch.ones(1, dtype=dtype)
    zero = torch.zeros(1, dtype=dtype)
    cases = {  # tag: (ref, cand)
        "same1": (one.clone(), one.clone()),
        "diff1": (one.clone(), zero.clone()),
        "diff1_shape": (one.clone(), one.clone().reshape(1, 1)),
        "same1_again": (one.clone(), one.clone()),
        "empty": (torch.zeros(0, dtype=dtype), torch.zeros(0, dtype=dtype)),
        "empty_shape": (torch.zeros(0, dtype=dtype), torch.zeros(0, 1, dtype=dtype)),
        "diff1_again": (one.clone(), zero.clone()),
    }
    for tag, (r, _) in cases.items():
        checker.register_tensor(tag, r, side=0)
    for tag, (_, c) in cases.items():
        checker.register_tensor(tag, c, side=1)
    rows = {r["tag"]: r for r in checker.check("equal").to_rows()}
    for tag, (r, c) in cases.items():
        assert rows[tag]["status"] == _want(r, c)[0], (tag, rows[tag])


@pytest.mark.parametrize("order", ["bad_last", "bad_first"])
@pytest.mark.parametrize("config", sorted(_CONFIGS))
def test_three_sides_one_candidate_differs(config, order):
    """One reference and two candidates under one tag, one candidate 1 element off: one row,
    never passing (deferred: the mismatch of 1; eager: an error naming the limit)."""
    checker = TensorChecker(verbose=False, **_CONFIGS[config])
    r = torch.arange(6.0)
    good, bad = r.clone(), r.clone()
    bad[5] = -1
    cands = [good, bad] if order == "bad_last" else [bad, good]
    checker.register_tensor("t", r, side=0)
    checker.register_tensor("t", cands[0], side=1)
    checker.register_tensor("t", cands[1], side=2)
    (row,) = checker.check("equal").to_rows()
    if _CONFIGS[config]["eager_mode"] is None:
        assert (row["status"], row["mismatch_count"]) == ("mismatch", 1), row
    else:  # the first candidate's verdict, or the error of the refused second one
        assert row["status"] in ("error", "mismatch"), row


# ---------------------------------------------------------------- flushes mid-round
@pytest.mark.parametrize(
    "resident", [None, 16 * 2 * BULK_MAX_BYTES, 16 * 2 * BULK_MAX_BYTES * 3 + 1, 1 << 20]
)
def test_many_small_pairs_with_flushes_keep_every_verdict(resident):
    """2,100 small pairs (past PENDING_PAIRS = 2048) in one step, sizes cycling over the bulk
    bound, every 7th candidate 1 element off and every 11th reference written in place after
    its capture (before the candidate's): each row's status and count as numpy says."""
    kw = {} if resident is None else {"max_resident_bytes": resident}
    checker = TensorChecker(verbose=False, eager_mode="equal", **kw)
    sizes = [1, 7, BULK_MAX_BYTES // 4, BULK_MAX_BYTES // 4 + 1, 300]
    want = {}
    g = torch.Generator().manual_seed(12)
    for k in range(2100):
        n = sizes[k % len(sizes)]
        r = torch.randn(n, generator=g)
        c = r.clone()
        if k % 7 == 0:
            c[n // 2] += 1
        tag = f"t{k}"
        private_r = r.clone()
        checker.register_tensor(tag, r, side=0)
        if k % 11 == 0:
            r.add_(1)  # after its capture: the captured values stay private_r
        checker.register_tensor(tag, c, side=1)
        want[tag] = _want(private_r, c)
    rows = {r["tag"]: r for r in checker.check("equal").to_rows()}
    assert len(rows) == 2100
    for tag, (status, count) in want.items():
        assert (rows[tag]["status"], rows[tag]["mismatch_count"]) == (status, count), tag


# ---------------------------------------------------------------- op-level and a drive
@pytest.mark.parametrize("case", sorted(_CHAINS))
def test_run_parity_op_level_module_rows_with_inplace_writes(case):
    make_ref, make_cand = _CHAINS[case]
    x = torch.linspace(-3, 3, 6)
    ref_got = _private_capture(make_ref(), lambda m, s: _one_step(m, s, x))
    cand_got = _private_capture(make_cand(), lambda m, s: _one_step(m, s, x))
    res = run_parity(make_ref(), make_cand(), (x.clone(),), mode="equal", environment=ENV,
                     dump_mode=DumpMode.NOT, capture_ops=True)  # fmt: skip
    assert _assert_rows(res.modules.to_pylist(), ref_got, cand_got) >= 4


@pytest.mark.parametrize("mode", ["equal", "allclose", "auto"])
@pytest.mark.parametrize("bad_step", [None, 1, 3])
def test_run_parity_kv_decode_drive(mode, bad_step):
    xs = [torch.arange(3.0) + 10 * k for k in range(4)]

    def drive_private(m, step):
        for k, x in enumerate(xs):
            step[0] = k
            m(x)

    def drive(m, rec):
        for k, x in enumerate(xs):
            rec(k)
            m(x)

    ref_got = _private_capture(Decoder(), drive_private)
    cand_got = _private_capture(Decoder(bad_step), drive_private)
    res = run_parity(Decoder(), Decoder(bad_step), drive=drive, mode=mode, environment=ENV,
                     dump_mode=DumpMode.NOT)  # fmt: skip
    m = "equal" if mode == "equal" else "allclose"
    assert _assert_rows(res.modules.to_pylist(), ref_got, cand_got, m) == 24
    assert res.summary["passed"] == (bad_step is None)


class Counting(Late):
    """Counts its calls in an int64 buffer (written in place) and adds the count to ``a``'s
    output: a twin sharing that buffer with the user's reference would leave it written."""

    def __init__(self, big_only: bool = False) -> None:
        super().__init__(big_only)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.table = torch.zeros(3)  # a plain attribute tensor (not a buffer), written too

    def forward(self, x):
        self.calls += 1
        self.table.add_(1)
        h = self.b(self.a(x) + self.calls + self.table.sum())
        return self.c(h.float())


class CountingEngine(Counting):
    def forward(self, x):
        self.calls += 1
        self.table.add_(1)
        h = self.b(self.a(x.to(self.a.weight.dtype)) + self.calls + self.table.sum())
        return self.c(h.to(self.c.weight.dtype))


def _counting_pair():
    torch.manual_seed(43)
    ref = Counting().eval()
    cand = CountingEngine().eval()
    cand.load_state_dict(ref.state_dict())
    return ref, cand.bfloat16()


def test_auto_fallback_after_a_twin_that_wrote_state():
    """The discarded twin attempt ran ``forward`` up to ``c``: whatever state it wrote must be
    the twin's own; the kept run's rows are those of a plain allclose run of fresh models."""
    ref, cand = _counting_pair()
    auto = run_parity(ref, cand, (_x(),), mode="auto", environment=ENV,
                      settings={"quantization": "bf16"}, dump_mode=DumpMode.NOT)  # fmt: skip
    assert auto.summary["mode"] == "allclose", auto.summary["mode_reason"]
    assert "the twin could not run" in auto.summary["mode_reason"]
    ref2, cand2 = _counting_pair()
    plain = run_parity(ref2, cand2, (_x(),), mode="allclose", environment=ENV,
                       settings={"quantization": "bf16"}, dump_mode=DumpMode.NOT)  # fmt: skip
    assert _clean(auto.modules.to_pylist()) == _clean(plain.modules.to_pylist())
    assert int(ref.calls) == int(ref2.calls) == 1
    assert torch.equal(ref.table, ref2.table)


@pytest.mark.parametrize("backing", ["from_numpy", "numpy_of_tensor"])
@pytest.mark.parametrize("n", [4, BULK_MAX_BYTES // 4, 5000, 1 << 18])
@pytest.mark.parametrize("config", sorted(_CONFIGS))
@pytest.mark.parametrize("kind", ["parameter", "input"])
def test_write_through_a_numpy_view_made_before_the_capture(kind, config, n, backing):
    """The reference's weight (or input) is a ``torch.from_numpy`` tensor; after its capture
    the caller writes the numpy array (a write torch never sees) to the candidate's values:
    the captured values differ at every element (weight) or at every element (input)."""
    checker = TensorChecker(verbose=False, **_CONFIGS[config])
    if backing == "from_numpy":
        arr = np.ones(n, dtype=np.float32)
        backed = torch.from_numpy(arr)
    else:  # a torch tensor whose numpy view is taken before the capture
        backed = torch.ones(n)
        arr = backed.numpy()
    ref, cand = Scale(n, 1.0), Scale(n, 2.0)
    x_ref = torch.ones(n)
    if kind == "parameter":
        ref.weight = nn.Parameter(backed)
    else:
        x_ref = backed
    x_cand = torch.full((n,), 2.0) if kind == "input" else torch.ones(n)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(x_ref)
        arr.fill(2.0)
        cand(x_cand)
        rows = checker.check("equal").to_rows()
    want_kind = "input" if kind == "input" else None
    hit = [
        r
        for r in rows
        if (r["kind"] == want_kind if want_kind else r["kind"] not in ("input", "output"))
    ]
    ok = [("mismatch", n), ("error", None)] if kind == "input" else [("mismatch", n)]
    if kind == "parameter" and n * 4 >= COW_MIN_BYTES:  # w11trust: hashed at capture, not copied
        ok = [("mismatch", n), ("error", None)]
        assert all(
            "changed after it was captured" in r["message"] for r in hit if r["status"] == "error"
        )
    assert hit and all((r["status"], r["mismatch_count"]) in ok for r in hit), hit  # never equal


def test_numpy_backed_parameter_written_after_capture_deferred():
    """The strict form of the bug above (a silent pass before w11trust: ``pin`` held the
    weight as a lazy clone sharing the numpy array's buffer): deferred checker, 4-element
    weight, now cloned at capture."""
    checker = TensorChecker(verbose=False)
    arr = np.ones(4, dtype=np.float32)
    ref, cand = Scale(4, 1.0), Scale(4, 2.0)
    ref.weight = nn.Parameter(torch.from_numpy(arr))
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(torch.ones(4))
        arr.fill(2.0)
        cand(torch.ones(4))
        (w,) = [r for r in checker.check("equal").to_rows() if r["kind"] == "param"]
    assert (w["status"], w["mismatch_count"]) == ("mismatch", 4)


class AddVec(nn.Module):
    def __init__(self, d) -> None:
        super().__init__()
        self.d = d

    def forward(self, x):
        return x + self.d


class ZeroInplace(nn.Module):
    def forward(self, x):
        return x.zero_()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_worst_histogram_holds_the_values_of_capture_time(dtype):
    """The candidate's worst tensor (``a``'s output, |Δ| = 0, 1e-3, 1, 100) is zeroed in place
    by the next module: the summary's histogram is of the captured values (hand-worked: numel
    4, one zero, three non-zero differences from 1e-3 to 100)."""
    x = torch.tensor([0.5, -1.0, 2.0, 3.0], dtype=dtype)
    d = torch.tensor([0.0, 1e-3, 1.0, 100.0], dtype=dtype)
    ref = Chain(Ident(), Ident())
    cand = Chain(AddVec(d), ZeroInplace())
    res = run_parity(ref, cand, (x,), mode="equal", environment=ENV, dump_mode=DumpMode.NOT)
    h = res.summary["worst_tensor_histogram"]
    assert h is not None and h["numel"] == 4 and h["nonfinite"] == 0, h
    assert h["zero_count"] == 1 and sum(h["counts"]) == 3, h
    got_lo, got_hi = h["edges"][0], h["edges"][-1]
    want_lo = float((x + d)[1].double() - x[1].double())  # 1e-3 as the dtype rounds it
    assert got_lo == pytest.approx(abs(want_lo), rel=1e-12) and got_hi == pytest.approx(100.0)
    assert x.untyped_storage().resizable()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64, torch.complex64])
def test_dump_holds_capture_time_values_widened(dtype, tmp_path):
    """A dumped candidate tensor zeroed in place after its capture: the ``.npy`` holds the
    values of capture time (bf16 widened to float32), the reference's too."""
    import json

    x = torch.tensor([0.5, -1.0, 2.0, 3.0]).to(dtype)
    d = torch.tensor([0.0, 0.25, 1.0, 64.0]).to(dtype)
    ref = Chain(Ident(), Ident())
    cand = Chain(AddVec(d), ZeroInplace())
    want_c = (x + d).to(torch.float32 if dtype == torch.bfloat16 else dtype).numpy()
    want_r = x.to(torch.float32 if dtype == torch.bfloat16 else dtype).numpy().copy()
    res = run_parity(ref, cand, (x.clone(),), mode="equal", environment=ENV,
                     dump_mode=DumpMode.ALL, dump_path=tmp_path)  # fmt: skip
    index = json.loads((res.dump_dir / "index.json").read_text(), parse_constant=pytest.fail)
    entries = index["files"]
    by = {(e["tag"], e["side"]): e for e in entries if e.get("step", 0) == 0}
    tag = next(t for (t, s) in by if t.endswith("m.0"))
    c = np.load(res.dump_dir / by[(tag, 1)]["file"])
    r = np.load(res.dump_dir / by[(tag, 0)]["file"])
    assert c.dtype == want_c.dtype and r.dtype == want_r.dtype
    np.testing.assert_array_equal(c, want_c)
    np.testing.assert_array_equal(r, want_r)


class Raising(nn.Module):
    """A caller's twin whose second module raises (after ``a`` was captured)."""

    def __init__(self, src: nn.Module) -> None:
        super().__init__()
        self.a = copy_module(src.a).bfloat16()
        self.b = nn.ReLU()
        self.c = copy_module(src.c).bfloat16()

    def forward(self, x):
        self.b(self.a(x.to(torch.bfloat16)))
        raise ValueError("caller's twin: unsupported\nsecond line")


def copy_module(m):
    import copy

    return copy.deepcopy(m)


def test_auto_with_a_callers_twin_that_raises_late():
    ref, cand = _pair(bug=0.25)
    res = run_parity(ref, cand, (_x(),), mode="auto", environment=ENV, twin=Raising(ref),
                     settings={"quantization": "bf16"}, dump_mode=DumpMode.NOT)  # fmt: skip
    s = res.summary
    ref2, cand2 = _pair(bug=0.25)
    plain = run_parity(ref2, cand2, (_x(),), mode="allclose", environment=ENV,
                       settings={"quantization": "bf16"}, dump_mode=DumpMode.NOT)  # fmt: skip
    assert s["mode"] == "allclose" and s["status"] == "completed", s["mode_reason"]
    assert "(ValueError: caller's twin: unsupported)" in s["mode_reason"]
    assert "second line" not in s["mode_reason"]
    assert _clean(res.modules.to_pylist()) == _clean(plain.modules.to_pylist())


@pytest.mark.parametrize("cand_first", [False, True], ids=["ref_first", "cand_first"])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_allclose_verdicts_agree_across_paths(case, cand_first):
    """``allclose``: the fused eager path, the deferred path and the per-pair eager paths give
    one row (status, count, max |Δ|); where numpy says equal, it is ``equal``."""
    ref_make, cand_make, mutate = _CASES[case]
    got = {}
    for name, cfg in _CONFIGS.items():
        kw = dict(cfg)
        if kw["eager_mode"]:
            kw["eager_mode"] = "allclose"
        checker = TensorChecker(verbose=False, **kw)
        want = _play(checker, _seq("t", ref_make, cand_make, mutate, cand_first))
        (row,) = checker.check("allclose").to_rows()
        got[name] = (row["status"], row["mismatch_count"], repr(row["max_abs_diff"]))
        if want[0] in ("equal", "shape_mismatch"):
            assert row["status"] == want[0], (name, row)
    assert len(set(got.values())) == 1, got


@pytest.mark.parametrize("change", ["resize_", "as_strided_", "set_same_bytes", "t_"])
@pytest.mark.parametrize("config", sorted(_CONFIGS))
def test_same_object_recaptured_under_a_second_tag_after_a_shape_change(config, change):
    """One reference object under tags ``A`` then ``B``, its shape changed in between with
    its bytes as they were: ``B``'s reference has the new shape (the candidate of ``B`` has
    the old one: shape_mismatch); ``A``'s pair is equal."""
    checker = TensorChecker(verbose=False, **_CONFIGS[config])
    t = torch.arange(6.0).reshape(2, 3)
    old = t.clone()
    checker.register_tensor("A", t, side=0)
    if change == "resize_":
        t.resize_(3, 2)
    elif change == "as_strided_":
        t.as_strided_((3, 2), (2, 1))
    elif change == "set_same_bytes":
        t.set_(t.untyped_storage(), 0, (6,), (1,))
    else:
        t.t_()
    new_shape = tuple(t.shape)
    assert new_shape != tuple(old.shape)
    checker.register_tensor("B", t, side=0)
    checker.register_tensor("A", old.clone(), side=1)
    checker.register_tensor("B", old.clone(), side=1)
    rows = {r["tag"]: r for r in checker.check("equal").to_rows()}
    assert rows["A"]["status"] == "equal", rows["A"]
    assert rows["B"]["status"] == "shape_mismatch", rows["B"]
    assert tuple(rows["B"]["ref_shape"]) == new_shape


@pytest.mark.parametrize("config", sorted(_CONFIGS))
def test_same_object_recaptured_after_a_dtype_change_through_data(config):
    """``t.data = t.data.view(torch.int32)``: the same object, the same bytes, a new dtype;
    ``B``'s float32 candidate never equals its int32 reference."""
    checker = TensorChecker(verbose=False, **_CONFIGS[config])
    t = torch.arange(6.0)
    old = t.clone()
    checker.register_tensor("A", t, side=0)
    t.data = t.data.view(torch.int32)
    checker.register_tensor("B", t, side=0)
    checker.register_tensor("A", old.clone(), side=1)
    checker.register_tensor("B", old.clone(), side=1)
    rows = {r["tag"]: r for r in checker.check("equal").to_rows()}
    assert rows["A"]["status"] == "equal", rows["A"]
    assert not is_passing(rows["B"]["status"]), rows["B"]
