"""compare_tensors: every input kind of issue 2 §3 gets a verdict, checked against hand values."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch

from parity_tracker.compare import PASSING, STATUSES, Comparison, compare_tensors, missing
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.errors import InputError

NAN, INF = math.nan, math.inf


def _no_nan_metric(c: Comparison) -> None:
    for key, value in c.to_dict().items():
        if isinstance(value, float):
            assert not math.isnan(value), key


def test_identical_is_equal_with_hashes() -> None:
    a = torch.randn(4, 5)
    c = compare_tensors(a, a.clone())
    assert c.status == "equal" and c.passed and c.mode == "equal"
    assert c.ref_hash == c.cand_hash and len(c.ref_hash) == 16
    assert (c.mismatch_count, c.max_abs_diff, c.cosine, c.sqnr_db) == (0, 0.0, 1.0, INF)
    assert (c.numel, c.ref_shape, c.ref_dtype, c.ref_device) == (20, (4, 5), "float32", "cpu")
    assert c.max_abs_diff_index is None and c.message == ""


def test_one_element_off_message_like_torch_testing() -> None:
    r = torch.zeros(2, 3, dtype=torch.float64)
    c = r.clone()
    c[1, 2] = 0.5
    got = compare_tensors(r, c, mode="allclose")
    assert got.status == "mismatch" and not got.passed
    assert (got.mismatch_count, got.max_abs_diff, got.max_abs_diff_index) == (1, 0.5, (1, 2))
    assert got.max_rel_diff == INF and got.max_rel_diff_index == (1, 2)
    assert (got.rtol, got.atol) == (1e-7, 1e-7)  # float64 defaults of torch.testing
    assert got.message.startswith("Tensor-likes are not close! Mismatched elements: 1 / 6 (16.7%)")
    assert "Greatest absolute difference: 0.5 at index (1, 2) (up to 1e-07 allowed)" in got.message
    assert "Greatest relative difference: inf at index (1, 2) (up to 1e-07 allowed)" in got.message
    eq = compare_tensors(r, c)
    assert eq.status == "mismatch" and eq.message.startswith("Tensor-likes are not equal!")
    assert "allowed" not in eq.message and eq.rtol is None


def test_nan_same_positions_equal_and_counted() -> None:
    r = torch.tensor([1.0, NAN, 3.0, NAN])
    got = compare_tensors(r, r.clone())
    assert got.status == "equal" and (got.ref_nan, got.cand_nan) == (2, 2)
    other = torch.tensor([1.0, NAN, 3.0, NAN])
    other.view(torch.int32)[1] |= 1  # another NaN payload: not bitwise identical, still equal
    got = compare_tensors(r, other)
    assert got.status == "equal" and got.ref_hash != got.cand_hash
    _no_nan_metric(got)


def test_nan_different_positions_mismatch_never_nan_metric() -> None:
    r = torch.tensor([1.0, NAN, 3.0])
    c = torch.tensor([1.0, 2.0, NAN])
    for mode in ("equal", "allclose"):
        got = compare_tensors(r, c, mode=mode)
        assert got.status == "mismatch" and got.mismatch_count == 2
        assert got.max_abs_diff == INF and got.max_abs_diff_index == (1,)
        assert (got.ref_nan, got.cand_nan) == (1, 1)
        assert got.cosine == 1.0  # over the positions finite on both sides: (1,) vs (1,)
        assert got.sqnr_db == -INF
        _no_nan_metric(got)


def test_inf_vs_inf_is_zero_difference() -> None:
    r = torch.tensor([INF, -INF, 2.0])
    c = torch.tensor([INF, -INF, 2.5])
    got = compare_tensors(r, c, mode="allclose", rtol=0.3, atol=0.0)
    assert got.status == "close" and got.max_abs_diff == 0.5 and got.max_abs_diff_index == (2,)
    assert (got.ref_inf, got.cand_inf) == (2, 2)
    flipped = compare_tensors(r, torch.tensor([-INF, -INF, 2.0]), mode="allclose")
    assert flipped.status == "mismatch" and flipped.max_abs_diff == INF
    assert flipped.max_abs_diff_index == (0,)
    _no_nan_metric(flipped)


def test_signed_zero_equal_but_hashes_differ() -> None:
    got = compare_tensors(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]))
    assert got.status == "equal" and got.ref_hash != got.cand_hash
    assert "not bitwise identical" in got.message


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
def test_half_vs_float32(low) -> None:
    g = torch.Generator().manual_seed(1)
    r = torch.randn(64, generator=g)
    c = r.to(low)
    want = float((c.double() - r.double()).abs().max())
    eq = compare_tensors(r, c)
    assert eq.status == "mismatch" and "dtypes differ: reference float32" in eq.message
    close = compare_tensors(r, c, mode="allclose")
    assert close.status == "close" and close.passed
    assert (close.rtol, close.atol) == ({torch.float16: 1e-3, torch.bfloat16: 1.6e-2}[low], 1e-5)
    assert close.max_abs_diff == want
    # representable values: equal values, different dtype → still mismatch in equal mode
    exact = compare_tensors(torch.tensor([0.5, 2.0]), torch.tensor([0.5, 2.0], dtype=low))
    assert exact.status == "mismatch" and exact.max_abs_diff == 0.0
    half = torch.tensor([0.5])
    assert compare_tensors(half, half.to(low), mode="allclose").passed


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8(dtype) -> None:
    r = torch.tensor([1.0, 2.0, -4.0, 0.0]).to(dtype)
    assert compare_tensors(r, r.clone()).status == "equal"
    c = torch.tensor([1.0, 3.0, -4.0, 0.0]).to(dtype)
    got = compare_tensors(r, c, mode="allclose")
    assert got.status == "mismatch" and got.mismatch_count == 1
    assert got.max_abs_diff == 1.0 and got.max_abs_diff_index == (1,)
    # ULP at 2.0: e4m3fn 2**-2, e5m2 2**-1
    assert got.max_ulp == {torch.float8_e4m3fn: 4.0, torch.float8_e5m2: 2.0}[dtype]
    wide = compare_tensors(r.float(), r, mode="allclose")
    assert wide.status == "close" and (wide.rtol, wide.atol) == (
        torch.finfo(dtype).eps,
        torch.finfo(dtype).tiny,
    )


def test_complex_by_modulus() -> None:
    r = torch.tensor([1 + 1j, 2 - 2j], dtype=torch.complex64)
    c = torch.tensor([1 + 1j, 2 + 1j], dtype=torch.complex64)
    got = compare_tensors(r, c, mode="allclose")
    assert got.status == "mismatch" and (got.max_abs_diff, got.max_abs_diff_index) == (3.0, (1,))
    assert got.max_rel_diff == pytest.approx(3 / math.sqrt(8))
    assert compare_tensors(r, r.clone()).status == "equal"


def test_int64_ids_512_apart_mismatch_in_allclose() -> None:
    r = torch.tensor([2**62, 5], dtype=torch.int64)
    c = torch.tensor([2**62 + 512, 5], dtype=torch.int64)
    got = compare_tensors(r, c, mode="allclose")
    assert got.status == "mismatch" and got.max_abs_diff == 512.0
    assert got.max_abs_diff_index == (0,) and (got.rtol, got.atol) == (0.0, 0.0)
    assert compare_tensors(r, c, mode="allclose", rtol=1.0, atol=1.0).status == "mismatch"


def test_uint64_exact_near_the_top() -> None:
    r = torch.tensor([2**64 - 1, 9], dtype=torch.uint64)
    c = torch.tensor([2**64 - 513, 9], dtype=torch.uint64)
    got = compare_tensors(r, c, mode="allclose")
    assert got.status == "mismatch" and got.max_abs_diff == 512.0 and got.mismatch_count == 1


def test_bool_exact() -> None:
    r = torch.tensor([True, False, True])
    got = compare_tensors(r, torch.tensor([True, True, True]), mode="allclose")
    assert got.status == "mismatch" and got.mismatch_count == 1 and got.max_abs_diff == 1.0
    assert compare_tensors(r, r.clone()).status == "equal"


def test_quantized_scale_named() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = torch.tensor([0.1, 0.2, 0.4])
        q1 = torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)
        q2 = torch.quantize_per_tensor(x, 0.2, 0, torch.quint8)
    got = compare_tensors(q1, q2, mode="allclose")
    # q1 = [1, 2, 4]·0.1, q2 = round([.5, 1, 2])·0.2 = [0, 1, 2]·0.2 (round half to even)
    want = np.abs(np.array([0.0, 0.2, 0.4], np.float32) - np.array([0.1, 0.2, 0.4], np.float32))
    assert got.status == "mismatch" and got.max_abs_diff == pytest.approx(want.max())
    assert "scale differs: reference 0.1, candidate 0.2" in got.message
    assert "int_repr differs at 3 / 3 elements" in got.message
    assert got.ref_dtype == "quint8"


def test_sparse_coo_vs_dense() -> None:
    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    assert compare_tensors(dense.to_sparse(), dense).status == "equal"
    other = dense.clone()
    other[0, 0] = 3.0
    got = compare_tensors(dense.to_sparse(), other)
    assert (got.max_abs_diff, got.max_abs_diff_index) == (3.0, (0, 0))


def test_meta_skipped() -> None:
    got = compare_tensors(torch.empty(2, device="meta"), torch.zeros(2))
    assert got.status == "skipped" and not got.passed and "meta" in got.message


def test_shape_mismatch_never_broadcast() -> None:
    got = compare_tensors(torch.ones(3, 1), torch.ones(3))
    assert got.status == "shape_mismatch" and got.ref_shape == (3, 1) and got.cand_shape == (3,)
    assert "not broadcast" in got.message and got.ref_hash and got.cand_hash
    assert compare_tensors(torch.ones(0), torch.ones(1)).status == "shape_mismatch"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_devices_recorded_compared_on_cpu() -> None:
    r = torch.arange(4.0)
    got = compare_tensors(r, r.cuda())
    assert got.status == "equal" and (got.ref_device, got.cand_device) == ("cpu", "cuda:0")
    assert "devices differ" in got.message


def test_device_recorded_cpu() -> None:
    got = compare_tensors(torch.ones(2), torch.ones(2))
    assert (got.ref_device, got.cand_device) == ("cpu", "cpu")


def test_non_contiguous_and_expanded_views() -> None:
    base = torch.arange(12.0).reshape(3, 4)
    got = compare_tensors(base.t(), base.t().contiguous())
    assert got.status == "equal"
    c = base.t().contiguous()
    c[3, 1] += 1.0
    got = compare_tensors(base.t(), c)
    assert got.max_abs_diff_index == (3, 1) and got.mismatch_count == 1
    e = torch.tensor([1.0, 2.0]).expand(3, 2)
    got = compare_tensors(e, torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.5]]))
    assert (got.max_abs_diff, got.max_abs_diff_index, got.mismatch_count) == (0.5, (2, 1), 1)


def test_zero_d_and_empty() -> None:
    got = compare_tensors(torch.tensor(1.5), torch.tensor(2.0), mode="allclose")
    assert got.status == "mismatch" and got.max_abs_diff_index == () and got.numel == 1
    assert "at index ()" in got.message
    empty = compare_tensors(torch.empty(0, 3), torch.empty(0, 3))
    assert empty.status == "equal" and empty.numel == 0 and empty.mismatch_count == 0
    _no_nan_metric(empty)


def test_numpy_and_protocol_objects() -> None:
    a = np.array([1.0, 2.0, 3.0])
    got = compare_tensors(a, torch.tensor([1.0, 2.0, 3.25], dtype=torch.float64))
    assert got.status == "mismatch" and got.max_abs_diff == 0.25

    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return np.array([1.0, 2.0, 3.0])

    assert compare_tensors(ArrayLike(), a).status == "equal"

    class DLPackLike:
        def __dlpack__(self, **kw):
            return a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return a.__dlpack_device__()

    assert compare_tensors(DLPackLike(), a).status == "equal"


def test_python_scalars() -> None:
    assert compare_tensors(2.5, 2.5).status == "equal"
    got = compare_tensors(2.5, torch.tensor(2.5))  # a Python float is float64
    assert got.status == "mismatch" and "dtypes differ" in got.message
    assert compare_tensors(2.5, torch.tensor(2.5), mode="allclose").status == "close"
    got = compare_tensors(3, 4)
    assert got.status == "mismatch" and got.max_abs_diff == 1.0 and got.ref_dtype == "int64"


def test_none_and_unsupported_are_errors() -> None:
    got = compare_tensors(None, torch.ones(2))
    assert got.status == "error" and "reference is None" in got.message
    assert got.cand_dtype == "float32"
    got = compare_tensors(torch.ones(2), object())
    assert got.status == "error" and "builtins.object" in got.message


def test_bad_arguments_raise_input_error() -> None:
    with pytest.raises(InputError, match="allclose"):
        compare_tensors(torch.ones(1), torch.ones(1), mode="close")
    with pytest.raises(ValueError, match="rtol and atol"):
        compare_tensors(torch.ones(1), torch.ones(1), mode="allclose", rtol=1e-3)


def test_tag_overrides() -> None:
    tol = Tolerances({"checker_down*": (0.0, 0.5)})
    r, c = torch.zeros(3), torch.full((3,), 0.25)
    got = compare_tensors(r, c, mode="allclose", tag="checker_down.1", tolerances=tol)
    assert got.status == "close" and (got.rtol, got.atol) == (0.0, 0.5)
    got = compare_tensors(r, c, mode="allclose", tag="checker_up", tolerances=tol)
    assert got.status == "mismatch"


def test_large_pair_differing_late_and_early() -> None:
    g = np.random.default_rng(0)
    r_np = g.standard_normal(300_001).astype(np.float32)
    for pos in (299_999, 3):
        c_np = r_np.copy()
        c_np[pos] += np.float32(1.0)
        want = float(np.abs(c_np.astype(np.float64) - r_np.astype(np.float64)).max())
        got = compare_tensors(torch.from_numpy(r_np), torch.from_numpy(c_np))
        assert got.status == "mismatch" and got.mismatch_count == 1
        assert (got.max_abs_diff, got.max_abs_diff_index) == (want, (pos,))
        from parity_tracker.compare.hashing import content_hash

        assert got.cand_hash == content_hash(torch.from_numpy(c_np))
        assert got.ref_hash == content_hash(torch.from_numpy(r_np))


def test_missing_and_statuses_contract() -> None:
    m = missing("candidate", "equal")
    assert m.status == "missing_candidate" and m.status in STATUSES and not m.passed
    assert {"equal", "close"} == PASSING
    assert re.fullmatch(r"[0-9a-f]{16}", compare_tensors(1.0, 1.0).ref_hash)


def test_small_pairs_leave_torch_thread_count_alone(monkeypatch) -> None:
    # set_num_threads is process-wide and costs more than a small comparison: the small path
    # (<= compare.SMALL elements) must never call it, equal or not.
    def refuse(n: int) -> None:
        raise AssertionError("torch.set_num_threads called on the small path")

    monkeypatch.setattr(torch, "set_num_threads", refuse)
    a = torch.randn(70_000)
    assert compare_tensors(a, a.clone()).status == "equal"
    b = a.clone()
    b[69_999] += 1.0
    got = compare_tensors(a, b, mode="allclose")
    assert (got.status, got.mismatch_count, got.max_abs_diff_index) == ("mismatch", 1, (69_999,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.complex64])
def test_small_identical_counts_nan_and_inf(dtype: torch.dtype) -> None:
    r = torch.tensor([1.0, NAN, INF, -INF, 2.0, NAN]).to(dtype)
    got = compare_tensors(r, r.clone())
    assert got.status == "equal" and got.ref_hash == got.cand_hash
    assert (got.ref_nan, got.cand_nan, got.ref_inf, got.cand_inf) == (2, 2, 2, 2)
    fin = compare_tensors(r.nan_to_num(), r.nan_to_num().clone())
    assert (fin.ref_nan, fin.ref_inf) == (0, 0)


def test_pair_above_small_limit_takes_chunked_path() -> None:
    from parity_tracker.compare import SMALL
    from parity_tracker.compare.hashing import content_hash

    g = np.random.default_rng(5)
    r_np = g.standard_normal(SMALL + 7).astype(np.float32)
    r_np[[10, SMALL + 3]] = np.nan
    r = torch.from_numpy(r_np)
    same = compare_tensors(r, r.clone())
    assert same.status == "equal" and (same.ref_nan, same.cand_nan) == (2, 2)
    assert same.ref_hash == content_hash(r)
    c_np = r_np.copy()
    c_np[SMALL + 5] += np.float32(0.25)
    got = compare_tensors(r, torch.from_numpy(c_np))
    want = float(abs(np.float64(c_np[SMALL + 5]) - np.float64(r_np[SMALL + 5])))
    assert (got.status, got.mismatch_count, got.max_abs_diff) == ("mismatch", 1, want)
    assert got.max_abs_diff_index == (SMALL + 5,) and got.cand_hash == content_hash(
        torch.from_numpy(c_np)
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(3, 5),
        lambda: torch.tensor(2.5, dtype=torch.float16),
        lambda: torch.empty(0, 4),
        lambda: torch.arange(-6, 6, dtype=torch.int64).reshape(3, 4),
        lambda: torch.tensor([True, False, True]),
        lambda: torch.randn(4, dtype=torch.complex64),
        lambda: torch.tensor([1.0, NAN, -INF]),
    ],
)
@pytest.mark.parametrize("mode", ["equal", "allclose"])
def test_identical_shortcut_matches_general_path(make, mode: str) -> None:
    # torch tensors take the one-step identical shortcut; the same data as numpy arrays
    # takes the general path (conversion records, scan, notes): the records must be equal.
    from parity_tracker.compare.hashing import content_hash

    a = make()
    fast = compare_tensors(a, a.clone(), mode=mode)
    general = compare_tensors(a.numpy(), a.clone().numpy(), mode=mode)
    assert fast == general and fast.status == "equal"
    assert fast.ref_hash == content_hash(a)
