"""Adversarial cases for the in-place tensor reader (w9brk2, wave 9; w9trust's change).

``compare.hashing.array_in_place`` / ``numpy_in_place`` read a user tensor through
``const_data_ptr`` as a strided numpy view that keeps the tensor alive (``_keep``), instead of
``Tensor.numpy()``. Here: odd layouts (overlapping ``as_strided``, ``unfold``, ``diagonal``,
``narrow`` of a transpose, channels-last 3-d, stride-0, size-1 dims with arbitrary strides,
many dims), every dtype numpy knows plus the ones it does not (float8, complex32, quantized),
tensors that are not strided (nested, mkldnn, sparse, meta), keep-alive under ``del``/``gc``
and under ``set_``, ``from_numpy``/DLPack buffers, conjugate/negative bits, and models that
``resize_``/``set_``/``.data =`` a compared tensor after a differing pair.

Every expected value is computed on PRIVATE copies (``clone().contiguous()`` then numpy,
float64/complex128 widening) with numpy, never with the code under test; torch.testing's
default tolerances are written out.
"""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest
import torch
from numpy_expected import Source, expected, use_fold, wide
from torch import nn

from parity_tracker.capture.tags import call_base, module_tag
from parity_tracker.compare.core import compare_tensors
from parity_tracker.compare.hashing import array_in_place, numpy_in_place
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

_NUMPY_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


def _fill(n: int, dtype: torch.dtype, seed: int = 3) -> torch.Tensor:
    """``n`` varied values of ``dtype`` (1-D, contiguous, owned)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 40
    if dtype == torch.bool:
        return x > 0
    if dtype.is_complex:
        return torch.complex(x, x.flip(0)).to(dtype)
    if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return x.abs().to(torch.int64).to(dtype)
    return x.to(dtype)


# views of a 1-D base of 720 elements (each a different layout torch can make)
_VIEWS = {
    "as_strided_overlap": lambda b: b.as_strided((5, 4), (2, 1), 3),  # rows overlap
    "unfold": lambda b: b[:60].unfold(0, 6, 4),  # windows overlap
    "diagonal": lambda b: b[:49].reshape(7, 7).diagonal(),
    "diagonal_offset": lambda b: b[:49].reshape(7, 7).diagonal(2),
    "narrow_of_transpose": lambda b: b[:60].reshape(6, 10).t().narrow(0, 3, 4),
    "channels_last_3d": lambda b: b.reshape(2, 3, 4, 5, 6).contiguous(
        memory_format=torch.channels_last_3d
    )[:, :, 1:],
    "stride0_scalar": lambda b: b[7].expand(4, 5),
    "stride0_row": lambda b: b[3:8].expand(3, 5),
    "size1_odd_strides": lambda b: b.as_strided((1, 5, 1), (999, 2, 7), 1),
    "0d_offset": lambda b: b[11],
    "empty_offset": lambda b: b[5:5].reshape(0, 3),  # (0, 3), storage offset 5
    "many_dims": lambda b: b[:64].reshape((2,) * 6).permute(5, 4, 3, 2, 1, 0),
    "offset_contiguous": lambda b: b[17 : 17 + 40].reshape(5, 8),
    "step_then_T": lambda b: b[:120].reshape(10, 12)[1::3, ::5].t(),
}


def _private(view: torch.Tensor) -> np.ndarray:
    """What ``numpy()`` gives for the same values, on a private C-order copy."""
    return view.clone().contiguous().numpy()


@pytest.mark.parametrize("view", sorted(_VIEWS))
@pytest.mark.parametrize("dtype", _NUMPY_DTYPES, ids=str)
def test_odd_layouts_read_their_values_and_leave_storage_resizable(dtype, view):
    base = _fill(720, dtype)
    t = _VIEWS[view](base)
    got = numpy_in_place(t)
    want = _private(t)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert not got.flags.writeable
    del got
    gc.collect()
    assert base.untyped_storage().resizable()
    base.resize_(1000)  # the model may still grow it


_CMP_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int16,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]
_CMP_VIEWS = [
    "as_strided_overlap",
    "unfold",
    "diagonal_offset",
    "narrow_of_transpose",
    "channels_last_3d",
    "stride0_row",
    "size1_odd_strides",
    "0d_offset",
    "many_dims",
    "step_then_T",
]


def _perturb(base: torch.Tensor, view: str) -> torch.Tensor:
    """A copy of ``base`` whose ``view`` differs in exactly one storage element."""
    cand = base.clone()
    probe = torch.arange(base.numel(), dtype=torch.int64)
    idx = int(_VIEWS[view](probe).reshape(-1)[0])  # a storage slot the view reads
    if cand.dtype == torch.bool:
        cand[idx] = ~cand[idx]
    elif cand.dtype in (torch.uint16, torch.uint32, torch.uint64):  # no torch arithmetic
        wide = cand.to(torch.int64)
        wide[idx] += 3
        cand = wide.to(cand.dtype)
    else:
        cand[idx] = cand[idx] + 3
    return cand


@pytest.mark.parametrize("kind", ["equal", "differ"])
@pytest.mark.parametrize("view", _CMP_VIEWS)
@pytest.mark.parametrize("dtype", _CMP_DTYPES, ids=str)
def test_compare_tensors_on_odd_layouts_matches_numpy(dtype, view, kind):
    base = _fill(720, dtype)
    cand_base = base.clone() if kind == "equal" else _perturb(base, view)
    ref, cand = _VIEWS[view](base), _VIEWS[view](cand_base)
    for mode in ("equal", "allclose"):
        got = compare_tensors(ref, cand, mode=mode)
        status, bad, top = expected(ref, cand, mode)
        assert got.status == status, (mode, got.status, got.message)
        assert (got.mismatch_count or 0) == bad
        if status != "equal" and not dtype.is_complex:
            assert got.max_abs_diff == pytest.approx(top, rel=1e-12, abs=0)
    assert base.untyped_storage().resizable() and cand_base.untyped_storage().resizable()


@pytest.mark.parametrize("view", ["contiguous", "transposed", "offset"])
def test_float32_ulp_and_sqnr_on_views(view):
    """One float32 ULP in [1, 2) is eps = 2**-23; SQNR from numpy float64 sums."""
    g = torch.Generator().manual_seed(9)
    full = (1.0 + torch.rand(40, 30, generator=g, dtype=torch.float64)).to(torch.float32)
    cand_full = torch.nextafter(full, torch.full_like(full, 4.0))
    pick = {"contiguous": lambda t: t, "transposed": lambda t: t.t(), "offset": lambda t: t[3:]}
    ref, cand = pick[view](full), pick[view](cand_full)
    got = compare_tensors(ref, cand, mode="allclose")
    a, b = wide(ref), wide(cand)
    assert got.max_ulp == 1.0
    sqnr = 10 * math.log10(float(np.sum(a * a)) / float(np.sum((b - a) ** 2)))
    assert got.sqnr_db == pytest.approx(sqnr, rel=1e-9)
    assert got.status == "close" and got.mismatch_count == 0


def _float8_dtypes():
    names = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("dtype", [*_float8_dtypes(), torch.complex32], ids=str)
def test_dtypes_numpy_lacks_compare_by_value(dtype, layout):
    """float8 / complex32: numpy has no dtype; the comparison must still be right."""
    x = torch.linspace(-3, 3, 48, dtype=torch.float64).reshape(6, 8)
    if dtype == torch.complex32:
        ref = torch.complex(x, -x).to(torch.complex64).to(dtype)
    else:
        ref = x.to(dtype)
    cand = ref.clone()
    cand.view(torch.uint8 if ref.element_size() == 1 else torch.int32)[2, 3] += 1  # one elem
    if layout == "transposed":
        ref, cand = ref.t(), cand.t()
    got = compare_tensors(ref, cand, mode="equal")
    status, bad, _ = expected(ref.to(torch.complex64 if dtype.is_complex else torch.float64),
                               cand.to(torch.complex64 if dtype.is_complex else torch.float64),
                               "equal")  # fmt: skip
    assert (got.status, got.mismatch_count or 0) == (status, bad)
    same = compare_tensors(ref, ref.clone(), mode="equal")
    assert same.status == "equal"
    with pytest.raises((TypeError, ValueError, RuntimeError)):
        numpy_in_place(ref)  # never garbage: numpy has no such dtype


def test_quantized_compares_dequantized_values():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 8, generator=g).abs()  # in range: nothing clamps
    ref = torch.quantize_per_tensor(x, 0.05, 3, torch.quint8)
    cand = torch.quantize_per_tensor(x + 0.2 * (torch.arange(64).reshape(8, 8) == 10), 0.05, 3,
                                     torch.quint8)  # fmt: skip
    got = compare_tensors(ref, cand, mode="equal")
    status, bad, top = expected(ref, cand, "equal")
    assert (got.status, got.mismatch_count) == (status, bad) and bad >= 1
    assert got.max_abs_diff == pytest.approx(top, rel=1e-6)
    with pytest.raises((TypeError, ValueError)):
        numpy_in_place(ref)  # its stored integers are not its values


def _nested():
    return torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])


def _jagged():
    return torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)


_NOT_STRIDED = {
    "nested": _nested,
    "jagged": _jagged,
    "mkldnn": lambda: torch.randn(4, 4).to_mkldnn(),
    "sparse_coo": lambda: torch.randn(4, 4).to_sparse(),
    "sparse_csr": lambda: torch.randn(4, 4).to_sparse_csr(),
    "meta": lambda: torch.empty(4, 4, device="meta"),
}


@pytest.mark.parametrize("kind", sorted(_NOT_STRIDED))
def test_tensors_without_plain_storage_are_refused_by_the_reader(kind):
    t = _NOT_STRIDED[kind]()
    with pytest.raises(Exception):  # noqa: B017 - any refusal; never an array of garbage
        numpy_in_place(t)


@pytest.mark.parametrize("kind", ["mkldnn", "sparse_coo", "sparse_csr", "meta", "nested"])
def test_compare_of_tensors_without_plain_storage_never_passes_a_difference(kind):
    make = _NOT_STRIDED[kind]
    torch.manual_seed(0)
    ref = make()
    torch.manual_seed(1)  # other values
    cand = make()
    got = compare_tensors(ref, cand, mode="equal")
    if kind == "meta":
        assert got.status == "skipped"
        return
    assert got.status != "equal", got  # a difference is never reported equal
    if got.status == "mismatch" and kind != "nested":
        a, b = ref.to_dense(), cand.to_dense()
        assert got.mismatch_count == int((a != b).sum())


def test_keep_alive_under_del_and_gc():
    def make():
        base = torch.arange(2000, dtype=torch.float64)
        return numpy_in_place(base[10:].reshape(398, 5)[::2].t())

    view = make()
    gc.collect()
    bait = [torch.full((2000,), -1.0, dtype=torch.float64) for _ in range(64)]
    want = np.arange(10, 2000, dtype=np.float64).reshape(398, 5)[::2].T
    np.testing.assert_array_equal(view, want)
    del bait


@pytest.mark.parametrize(
    ("layout", "reader"),
    [
        ("contiguous", numpy_in_place),
        ("contiguous", array_in_place),
        ("transposed", array_in_place),
    ],
    ids=["contiguous-numpy_in_place", "contiguous-array_in_place", "transposed-array_in_place"],
)
def test_keep_alive_survives_set_of_the_tensor(layout, reader):
    """A tensor that owns its storage (no ``_base``: a module's output), read, then ``set_``."""
    owner = np.arange(62, dtype=np.float64)
    alive = weakref.ref(owner)  # freed exactly when torch frees the storage over it
    arr = owner if layout == "contiguous" else owner.reshape(2, 31).T
    want = arr.copy()
    t = torch.from_numpy(arr)  # no ``_base``: only ``t`` holds the storage
    del owner, arr
    view = reader(t)
    t.set_(torch.zeros(3, dtype=torch.float64))  # the model swaps that tensor's storage
    gc.collect()
    assert alive() is not None, "the memory the view reads was freed"
    np.testing.assert_array_equal(view, want)


@pytest.mark.parametrize("src", ["from_numpy", "dlpack"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "column", "offset"])
def test_foreign_buffers(src, layout):
    owner = np.arange(60, dtype=np.float32).reshape(6, 10) * 0.5
    cut = {"contiguous": lambda a: a, "transposed": lambda a: a.T, "column": lambda a: a[:, 3],
           "offset": lambda a: a[2:]}[layout]  # fmt: skip
    arr = cut(owner)
    t = torch.from_numpy(arr) if src == "from_numpy" else torch.from_dlpack(arr)
    np.testing.assert_array_equal(numpy_in_place(t), arr)
    cand = t.contiguous().clone()
    cand.reshape(-1)[0] += 1.0
    got = compare_tensors(t, cand, mode="equal")
    assert (got.status, got.mismatch_count, got.max_abs_diff) == ("mismatch", 1, 1.0)
    owner[0, 0] = 100.0  # a write through numpy (no version bump) is seen by the next read
    if layout != "offset":
        again = compare_tensors(t, cand, mode="equal")
        want = abs(float(cand.reshape(-1)[0]) - 100.0) if layout != "column" else None
        assert again.status == "mismatch"
        if want is not None:
            assert again.max_abs_diff == pytest.approx(want)


@pytest.mark.parametrize("bit", ["conj", "neg", "conj_neg"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_conjugate_and_negative_bits_compare_values(bit, layout):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 7, generator=g, dtype=torch.complex64)
    y = x.clone()
    y[1, 2] += 1 + 2j
    make = {
        "conj": lambda t: t.conj(),
        "neg": lambda t: torch._neg_view(t),
        "conj_neg": lambda t: torch._neg_view(t.conj()),
    }[bit]
    lay = (lambda t: t) if layout == "contiguous" else (lambda t: t.t())
    ref, cand = lay(make(x)), lay(make(y))
    got = compare_tensors(ref, cand, mode="equal")
    a = ref.resolve_conj().resolve_neg().clone().numpy()
    b = cand.resolve_conj().resolve_neg().clone().numpy()
    assert (got.status, got.mismatch_count) == ("mismatch", int((a != b).sum()))
    assert got.max_abs_diff == pytest.approx(float(np.abs(b - a).max()), rel=1e-6)
    # equal values stored differently: x.conj() vs a resolved copy of it
    eq = compare_tensors(make(x), make(x).resolve_conj().resolve_neg(), mode="equal")
    assert eq.status == "equal"


# ----- models that change a compared tensor after a differing pair ---------------------------


class _Mutate(nn.Module):
    """Keeps ``a``'s output and changes it (``how``) at the start of its next forward."""

    def __init__(self, values: torch.Tensor, how: str) -> None:
        super().__init__()
        self.a, self.how = Source(values), how
        self.kept: list[torch.Tensor] = []

    def forward(self, x):
        if self.kept:
            last = self.kept[-1]
            if self.how == "resize_grow":
                last.resize_(last.numel() + 11)
            elif self.how == "resize_shrink":
                last.resize_(0)
            elif self.how == "set_":
                last.set_(torch.full((5,), -9.0, dtype=last.dtype))
            elif self.how == "data":
                last.data = torch.full((5,), -9.0, dtype=last.dtype)
        self.kept.append(self.a(x))
        return x + 1


_HOWS = ["resize_grow", "resize_shrink", "set_", "data"]


@pytest.mark.parametrize("fold", ["numpy", "compiled"])
@pytest.mark.parametrize("how", _HOWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32])
def test_model_changes_a_compared_tensor_after_a_differing_pair(dtype, how, fold, monkeypatch):
    use_fold(fold, monkeypatch)
    n = 64 * 80
    g = torch.Generator().manual_seed(2)
    ref_v = (torch.randn(n, generator=g, dtype=torch.float64) * 30).to(dtype).reshape(64, 80)
    cand_v = ref_v.clone()
    cand_v[3, 4] += 1
    cand_v[60, 70] += 2
    checker = TensorChecker(verbose=False, eager_mode="equal")
    ref, cand = _Mutate(ref_v, how), _Mutate(cand_v, how)
    x = torch.zeros(3)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        for _ in range(3):
            ref(x)
            cand(x)
        rows = {r["tag"]: r for r in checker.check("equal").to_rows()}
    want_status, want_bad, want_top = expected(ref_v, cand_v, "equal")
    assert want_bad == 2
    for k in range(3):
        tag = module_tag("a") if k == 0 else module_tag(call_base("a", k))
        row = rows[tag]
        assert (row["status"], row["mismatch_count"]) == (want_status, want_bad), (tag, row)
        assert row["max_abs_diff"] == pytest.approx(want_top, rel=1e-12)
        assert tuple(row["ref_shape"]) == (64, 80)


_SCRIPT = r"""
import torch, numpy as np
from parity_tracker.compare import fused
from parity_tracker.compare.core import compare_tensors
assert fused.kernel() is None, "PARITY_NO_KERNEL ignored"
g = torch.Generator().manual_seed(5)
for n in (300, 5000, 300000):
    r = torch.randn(n, generator=g)
    c = r.clone(); c[n // 3] += 0.5; c[n - 1] = float('nan')
    for view in (lambda t: t, lambda t: t[1:], lambda t: t.reshape(-1, 2).t()):
        a, b = view(r), view(c)
        got = compare_tensors(a, b, mode='allclose')
        x = a.clone().contiguous().double().numpy(); y = b.clone().contiguous().double().numpy()
        with np.errstate(invalid='ignore'):
            ok = (x == y) | (np.abs(y - x) <= 1e-5 + 1.3e-6 * np.abs(x))
        assert got.mismatch_count == int((~ok).sum()), (n, got.mismatch_count)
        assert got.cand_nan == int(np.isnan(y).sum())
        assert r.untyped_storage().resizable() and c.untyped_storage().resizable()
    r.resize_(n + 5); c.resize_(n + 5)
print("OK")
"""


@pytest.mark.slow
def test_no_kernel_process_reads_in_place_and_counts_right(tmp_path):
    env = {**os.environ, "PARITY_NO_KERNEL": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=120,
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("OK")


@pytest.mark.parametrize("n", [4, 300, 70_000])
def test_bool_with_non_canonical_bytes_compares_by_value(n):
    """A bool tensor whose stored bytes are 2 or 255 (a uint8 view) holds True: equal values."""
    raw = (torch.arange(n) % 4).to(torch.uint8) * 85  # 0, 85, 170, 255
    ref = raw.view(torch.bool)
    cand = raw != 0  # canonical bytes, the same truth values
    assert torch.equal(ref, cand)
    for mode in ("equal", "allclose"):
        got = compare_tensors(ref, cand, mode=mode)
        assert (got.status, got.mismatch_count or 0) == ("equal", 0), got.message
    flip = cand.clone()
    flip[1] = False  # raw[1] is 85: True
    got = compare_tensors(ref, flip, mode="equal")
    assert (got.status, got.mismatch_count) == ("mismatch", 1)


@pytest.mark.parametrize("dims", [20, 32])
def test_many_dims_permuted_and_transposed(dims):
    g = torch.Generator().manual_seed(8)
    shape = (2, 2) + (1,) * (dims - 4) + (2, 3)
    base = torch.randn(shape, generator=g)
    t = base.permute(*range(dims - 1, -1, -1))
    np.testing.assert_array_equal(numpy_in_place(t), _private(t))
    cand = t.contiguous().clone()
    cand.reshape(-1)[5] += 1.0
    got = compare_tensors(t, cand, mode="equal")
    assert (got.status, got.mismatch_count) == ("mismatch", 1)
    assert got.max_abs_diff == pytest.approx(abs(float(cand.reshape(-1)[5]) - float(
        t.contiguous().reshape(-1)[5])), rel=1e-6)  # fmt: skip


@pytest.mark.parametrize("layout", ["transposed", "step"])
def test_parameter_views_with_grad(layout):
    """A requires-grad Parameter's non-contiguous view (a model's weight.t())."""
    g = torch.Generator().manual_seed(6)
    w = nn.Parameter(torch.randn(12, 10, generator=g))
    cut = (lambda t: t.t()) if layout == "transposed" else (lambda t: t[::2, 1::3])
    ref = cut(w)
    cand = cut(w.detach().clone())
    cand = cand.contiguous()
    cand.reshape(-1)[-1] -= 0.25
    got = compare_tensors(ref, cand, mode="allclose")
    status, bad, top = expected(ref, cand, "allclose")
    assert (got.status, got.mismatch_count, got.max_abs_diff) == (status, bad, top)
    assert w.untyped_storage().resizable()


def test_strided_nested_tensor_gets_the_nested_message():
    got = compare_tensors(_nested(), _nested(), mode="equal")
    assert got.status == "error"
    assert "register its components separately" in got.message, got.message
