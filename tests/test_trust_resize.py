"""A tensor the checker compared stays the model's to resize (wave 9, w9trust).

``Tensor.numpy()`` marks a storage not resizable for good. The comparison read its sides
through ``numpy()`` in the general path (a differing pair, a large or non-float pair), so a
model that captured a tensor, had it compared (eagerly, a pair that DIFFERS) and then
``resize_``-d it in its next forward raised "Trying to resize storage that is not resizable".
Every reader of a model's tensor now goes through ``compare.hashing.array_in_place`` (read
through ``const_data_ptr``, nothing marked).

Truth is independent of the code under test: the expected status and mismatch count come from
numpy float64/complex128 arithmetic on private copies, with torch.testing's default tolerances
written out; the expected ULP and SQNR figures are worked by hand / in numpy. Each test here
failed on main ed626ba (the model raised, a storage was left not resizable, a copy-on-write
buffer was copied, or a RuntimeWarning escaped).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from numpy_expected import TORCH_TESTING_TOL, Source, expected, use_fold, wide
from torch import nn

from parity_tracker.capture.tags import call_base, module_tag
from parity_tracker.compare import budget_scan
from parity_tracker.compare.core import compare_tensors
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

_DTYPES = [
    torch.bool,
    torch.int8,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
]
_SNAN = 0x7FB5C336  # a float32 signalling NaN (quiet bit clear): the w8 seed-103 value


def _expected(ref: torch.Tensor, cand: torch.Tensor, mode: str) -> tuple[str, int]:
    """(status, mismatch count) from numpy: NaN matches NaN by position, inf the same inf."""
    return expected(ref, cand, mode)[:2]


def _pair(dtype: torch.dtype, kind: str, shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """A reference and a candidate of ``dtype`` that differ as ``kind`` says."""
    g = torch.Generator().manual_seed(7)
    n = math.prod(shape)
    base = torch.randn(n, generator=g, dtype=torch.float64)
    if dtype == torch.bool:
        ref = base > 0
    elif dtype == torch.int8:
        ref = (base * 20).to(torch.int8)
    elif kind == "ulp":  # in [1, 2): one float32 ULP is exactly eps there
        ref = (1.0 + base.abs().fmod(1.0)).to(dtype)
    elif kind == "scaled":  # squares underflow float64: the scaled sums (compare.scaled)
        ref = (base * 1e-200).to(dtype)
    else:
        ref = (base * 3).to(dtype)
    cand = ref.clone()
    if kind == "mismatch":
        cand[5] = ~cand[5] if dtype == torch.bool else cand[5] + 1
    elif kind == "close":
        rtol = TORCH_TESTING_TOL[dtype][0]
        cand = ref.to(torch.complex128 if dtype.is_complex else torch.float64) * (1 + rtol / 4)
        cand = cand.to(dtype)
    elif kind == "nonfinite":
        ref[3], cand[3] = float("inf"), float("inf")  # matched
        cand[9] = float("nan")  # unmatched
    elif kind == "ulp":
        cand = torch.nextafter(ref, torch.full_like(ref, 4.0))
    elif kind == "scaled":
        cand = ref * (1 + 2.0**-20)
    return ref.reshape(shape), cand.reshape(shape)


class _Grow(nn.Module):
    """Keeps ``a``'s output and grows it with ``resize_`` at the start of its next forward."""

    def __init__(self, values: torch.Tensor) -> None:
        super().__init__()
        self.a = Source(values)
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kept:
            last = self.kept[-1]
            last.resize_(last.numel() + 7)  # raised: "Trying to resize storage that is not ..."
        self.kept.append(self.a(x))
        return x + 1


_MODEL_SHAPE = (64, 80)  # 5 KiB of bool, 40 KiB of complex64
_CASES = [(d, "mismatch") for d in _DTYPES] + [
    (torch.float32, "close"),
    (torch.bfloat16, "close"),
    (torch.float32, "nonfinite"),
    (torch.float16, "nonfinite"),
    (torch.float32, "ulp"),
    (torch.float64, "scaled"),
]


@pytest.mark.parametrize("fold", ["numpy", "compiled"])
@pytest.mark.parametrize("mode", ["equal", "allclose"])
@pytest.mark.parametrize(("dtype", "kind"), _CASES, ids=[f"{d}-{k}" for d, k in _CASES])
def test_model_resizes_a_tensor_whose_differing_pair_was_compared(
    dtype, kind, mode, fold, monkeypatch
):
    """Eager checker, a pair that differs, then the model's own ``resize_`` of that tensor."""
    use_fold(fold, monkeypatch)
    # 4-64 KiB at every dtype here: compared at once, read where the model wrote it (smaller
    # captures are copied first, larger ones snapshotted copy-on-write)
    ref_v, cand_v = _pair(dtype, kind, _MODEL_SHAPE)
    want = _expected(ref_v, cand_v, mode)
    if kind != "mismatch":
        assert want[0] == ("mismatch" if mode == "equal" or kind == "nonfinite" else "close")
    checker = TensorChecker(verbose=False, eager_mode=mode)
    ref, cand = _Grow(ref_v), _Grow(cand_v)
    x = torch.zeros(3)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        for _ in range(2):
            ref(x)
            cand(x)  # the second call resizes the tensor compared in the first
        rows = {r["tag"]: r for r in checker.check(mode).to_rows()}
        ref(x)
        cand(x)  # and after the check
    for tag in (module_tag("a"), module_tag(call_base("a", 1))):
        got = (rows[tag]["status"], rows[tag]["mismatch_count"] or 0)
        assert got == want, (tag, got, want)
    n = math.prod(_MODEL_SHAPE)
    assert [t.numel() for t in cand.kept] == [t.numel() for t in ref.kept] == [n + 7] * 2 + [n]
    if kind == "ulp":  # nextafter in [1, 2): exactly one ULP of the reference
        assert rows[module_tag("a")]["max_ulp"] == 1.0
    if kind == "scaled":  # SQNR from sums scaled by 2**660 (exact) in numpy float64
        a, b = wide(ref_v) * 2.0**660, wide(cand_v) * 2.0**660
        sqnr = 10 * math.log10(float(np.sum(a * a)) / float(np.sum((b - a) ** 2)))
        assert rows[module_tag("a")]["sqnr_db"] == pytest.approx(sqnr, rel=1e-9)


_LAYOUTS = {
    "contiguous": lambda t: t,
    "offset": lambda t: t[1:],  # contiguous, storage offset one row
    "transposed": lambda t: t.t(),
}


# the small path (≤ 256 elements), the whole-pair digest, the compiled-loop size, the chunks
_SHAPES = [(8, 8), (40, 40), (300, 300), (1100, 1000)]
_KINDS = ["equal", "mismatch", "nonfinite"]
_FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
_STORAGE_CASES = (
    [(d, s, k, "contiguous", "numpy") for d in _DTYPES for s in _SHAPES for k in _KINDS]
    + [(d, s, k, "contiguous", "compiled") for d in _FLOATS for s in _SHAPES[1:3] for k in _KINDS]
    + [(d, (40, 40), "mismatch", lay, "numpy") for d in _DTYPES for lay in ("offset", "transposed")]
)


@pytest.mark.parametrize(
    ("dtype", "shape", "kind", "layout", "fold"),
    _STORAGE_CASES,
    ids=["-".join(map(str, c)) for c in _STORAGE_CASES],
)
def test_compared_storages_stay_resizable(dtype, shape, kind, layout, fold, monkeypatch):
    """``compare_tensors`` leaves both sides' storages resizable, whatever the path taken."""
    use_fold(fold, monkeypatch)
    if kind == "nonfinite" and not (dtype.is_floating_point or dtype.is_complex):
        kind = "mismatch"
    ref_full, cand_full = _pair(dtype, "mismatch" if kind == "equal" else kind, shape)
    if kind == "equal":
        cand_full = ref_full.clone()
    view = _LAYOUTS[layout]
    ref, cand = view(ref_full), view(cand_full)
    for mode in ("equal", "allclose"):
        got = compare_tensors(ref, cand, mode=mode)
        assert (got.status, got.mismatch_count or 0) == _expected(ref, cand, mode)
        assert ref_full.untyped_storage().resizable(), (mode, "reference")
        assert cand_full.untyped_storage().resizable(), (mode, "candidate")
    cand_full.resize_(shape[0] + 1, shape[1])  # raised on main for most of these


@pytest.mark.skipif(
    not hasattr(torch, "_lazy_clone") or not hasattr(torch._C, "_data_address"),
    reason="this torch has no copy-on-write tensors",
)
@pytest.mark.parametrize("numel", [1000, 70_000, (1 << 20) + 5])
def test_a_differing_copy_on_write_side_stays_shared(numel):
    """A snapshot taken copy-on-write and compared (differing) still shares its source."""
    src = torch.randn(numel, generator=torch.Generator().manual_seed(3))
    lazy = torch._lazy_clone(src)
    cand = src.clone()
    cand[numel // 2] += 1.0
    got = compare_tensors(lazy, cand, mode="equal")
    assert (got.status, got.mismatch_count) == ("mismatch", 1)
    assert torch._C._data_address(lazy) == torch._C._data_address(src), "the buffer was copied"


def test_signalling_nan_widens_without_a_warning():
    """small.py widened a float32 signalling NaN into float64 outside ``np.errstate``: numpy
    warned "invalid value encountered in cast" (w8 seed 103). The NaN stays a NaN: counted."""
    bits = torch.arange(64, dtype=torch.int32) + 0x3F800000  # 1.0 and the next 63 floats
    bits[10] = _SNAN
    ref = bits.view(torch.float32)
    cand = ref.clone()
    cand[10] = 2.0  # unmatched NaN: mismatch, one element
    twin = ref.clone()
    twin.view(torch.int32)[10] = 0x7FC00000  # a quiet NaN: equal values, other bytes
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = compare_tensors(ref, cand, mode="allclose")
        same = compare_tensors(ref, twin, mode="equal")
    assert [str(w.message) for w in seen if w.category is RuntimeWarning] == []
    assert (got.status, got.mismatch_count, got.ref_nan, got.cand_nan) == ("mismatch", 1, 1, 0)
    assert got.max_abs_diff == math.inf
    assert (same.status, same.ref_nan, same.cand_nan) == ("equal", 1, 1)
    assert same.ref_hash != same.cand_hash  # the payloads differ


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_budget_scan_leaves_the_side_resizable(dtype):
    """The budget's compiled scan read a plain side through ``numpy()`` (main)."""
    pytest.importorskip("numba")
    if budget_scan._load() is None:
        pytest.skip("compiled scan disabled (PARITY_NO_KERNEL)")
    g = torch.Generator().manual_seed(5)
    golden = torch.randn(5000, generator=g, dtype=torch.float64)
    side = golden.to(dtype, copy=True)
    gold = golden.clone().numpy()  # a private copy (numpy() would mark golden's storage)
    want = (float(np.max(np.abs(wide(side) - gold))), float(np.max(np.abs(gold))))
    assert budget_scan.fast_scan(side, golden) == want
    assert golden.untyped_storage().resizable()
    assert side.untyped_storage().resizable()
    side.resize_(6000)
