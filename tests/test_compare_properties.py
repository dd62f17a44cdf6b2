"""Property tests: random shapes, dtypes and NaN/inf placement never raise or give NaN metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity_tracker.compare import STATUSES, compare_tensors, passes
from parity_tracker.compare.hashing import content_hash

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.complex64,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
]
SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e-30]


@st.composite
def tensors(draw, shape=None, dtype=None):
    shape = shape or tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    dtype = dtype or draw(st.sampled_from(DTYPES))
    n = int(np.prod(shape)) if shape else 1
    seed = draw(st.integers(0, 2**32 - 1))
    g = np.random.default_rng(seed)
    values = g.standard_normal(n) * 10
    if dtype.is_floating_point or dtype.is_complex:
        k = draw(st.integers(0, n))
        values[g.choice(n, size=k, replace=False)] = g.choice(SPECIALS, size=k)
    t = torch.from_numpy(values.reshape(shape))
    if dtype == torch.bool:
        return t > 0
    if not (dtype.is_floating_point or dtype.is_complex):
        return t.round().clamp(0 if dtype == torch.uint8 else -1000, 1000).to(dtype)
    return t.to(dtype)


@st.composite
def pairs(draw):
    ref = draw(tensors())
    same_shape = draw(st.booleans())
    shape = tuple(ref.shape) if same_shape else None
    cand_dtype = draw(st.sampled_from([ref.dtype, *DTYPES]))
    cand = (
        draw(tensors(shape=shape or None, dtype=cand_dtype)) if shape != () else ref.to(cand_dtype)
    )
    return ref, cand


def _finite_or_inf(c) -> None:
    for key, value in c.to_dict().items():
        if isinstance(value, float):
            assert not math.isnan(value), (key, c)


@settings(max_examples=60, deadline=None)
@given(pairs(), st.sampled_from(["equal", "allclose"]))
def test_never_raises_never_nan_and_symmetric(pair, mode) -> None:
    ref, cand = pair
    ab = compare_tensors(ref, cand, mode=mode)
    ba = compare_tensors(cand, ref, mode=mode)
    assert ab.status in STATUSES and ab.status != "error", ab.message
    _finite_or_inf(ab)
    _finite_or_inf(ba)
    if ab.status != "shape_mismatch":
        assert ab.max_abs_diff == ba.max_abs_diff
        assert ab.max_abs_diff_index == ba.max_abs_diff_index
        if ab.cosine is not None:
            assert math.isclose(ab.cosine, ba.cosine, rel_tol=1e-12, abs_tol=1e-12)
        # symmetric whenever the tolerance does not scale with |r| (rtol 0; equal mode: exact)
        if ab.rtol in (None, 0.0) and (ab.atol, ab.rtol) == (ba.atol, ba.rtol):
            assert ab.mismatch_count == ba.mismatch_count


@settings(max_examples=40, deadline=None)
@given(tensors(), st.sampled_from(["equal", "allclose"]))
def test_tensor_equals_itself(t, mode) -> None:
    got = compare_tensors(t, t.clone(), mode=mode)
    assert got.status == "equal", got.message
    assert got.ref_hash == got.cand_hash and got.mismatch_count == 0
    same_object = compare_tensors(t, t, mode=mode)
    assert same_object.status == "equal"
    if t.dtype.is_floating_point and t.dtype.itemsize > 1:
        assert got.ref_nan == int(torch.isnan(t).sum())
        assert got.ref_inf == int(torch.isinf(t).sum())


@st.composite
def same_dtype_pairs(draw):
    ref = draw(tensors())
    if draw(st.booleans()):
        return ref, draw(tensors(shape=tuple(ref.shape) or None, dtype=ref.dtype))
    # a small perturbation of the reference: close in allclose mode, or just outside
    scale = draw(st.sampled_from([0.0, 1e-9, 1e-6, 1e-3, 1e-1]))
    if not (ref.dtype.is_floating_point or ref.dtype.is_complex):
        return ref, ref.clone()
    noise = torch.from_numpy(np.random.default_rng(0).standard_normal(tuple(ref.shape)))
    return ref, (ref.double() * (1 + scale * noise)).to(ref.dtype)


@settings(max_examples=80, deadline=None)
@given(same_dtype_pairs(), st.sampled_from(["equal", "allclose"]))
def test_passes_is_compare_tensors_verdict(pair, mode) -> None:
    """``passes`` (no metrics, used by the op recorder) agrees with ``compare_tensors``."""
    ref, cand = pair
    assert passes(ref, cand, mode=mode) == compare_tensors(ref, cand, mode=mode).passed


# ---------------------------------------------------------------------------------------------
# layouts: non-contiguous, strided, sliced, 0-d and 1-element tensors of every dtype (issue 14)

#: Every dtype ``compare_tensors`` accepts densely (quantized dtypes have their own tests).
ALL_DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.complex128,
    torch.complex64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
]
LAYOUTS = ("plain", "col0", "step", "transpose", "zero_d", "one", "expand", "offset")


def _values(g: np.random.Generator, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``n`` finite values of ``dtype`` (small integers survive every float format exactly)."""
    if dtype == torch.bool:
        return torch.from_numpy(g.integers(0, 2, n).astype(bool))
    # float8_e5m2 has 2 mantissa bits: integers up to 8 are exact, so v and v + 1 stay distinct
    ints = torch.from_numpy(g.integers(0, 7 if dtype.itemsize == 1 else 100, n))
    if dtype.is_complex:
        return torch.complex(ints.double(), ints.double() - 3).to(dtype)
    return ints.to(dtype)


def layout_view(g: np.random.Generator, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """A tensor of ``dtype`` whose memory layout is ``layout`` (a view of a larger buffer)."""
    rows, cols = int(g.integers(1, 5)), int(g.integers(1, 5))
    base = _values(g, 3 * rows * cols + 1, dtype)
    if layout == "plain":
        return base[: rows * cols].reshape(rows, cols)
    if layout == "col0":  # the issue's case: 1 element, stride != 1, "contiguous" per torch
        return base[: 3 * cols].reshape(1, 3 * cols)[:, 0]
    if layout == "step":
        return base[:: int(g.integers(2, 4))]
    if layout == "transpose":
        return base[: rows * cols].reshape(rows, cols).t()
    if layout == "zero_d":
        return base[int(g.integers(0, base.numel()))]
    if layout == "one":
        return base[1:2].reshape(1, 1)[:, :1]
    if layout == "expand":
        return base[:cols].reshape(1, cols).expand(rows, cols)
    return base[1 : 1 + rows * cols].reshape(rows, cols)[:, 1:]  # offset + non-unit row stride


def _flip_one(t: torch.Tensor, g: np.random.Generator) -> torch.Tensor | None:
    """A contiguous copy of ``t`` with one element changed, or None when ``t`` is empty.

    The change is computed through numpy on float64/complex128 (independent of the code under
    test): +1 for numbers, ``not`` for bool; small integers stay exact in every format.
    """
    if t.numel() == 0:
        return None
    out = t.contiguous().clone()
    k = int(g.integers(0, t.numel()))
    flat = out.reshape(-1)
    if t.dtype == torch.bool:
        flat[k] = not bool(flat[k])
    elif t.dtype.is_complex:
        flat[k] = complex(flat[k]) + 1
    else:
        flat[k] = float(flat[k].double()) + 1 if t.dtype != torch.uint8 else int(flat[k]) ^ 1
    return out


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_issue_case_every_layout_and_dtype(dtype: torch.dtype, layout: str) -> None:
    g = np.random.default_rng(0)
    x = layout_view(g, dtype, layout)
    same = compare_tensors(x, x.clone())
    assert same.status == "equal", same.message
    changed = _flip_one(x, g)
    assert changed is not None
    got = compare_tensors(x, changed)
    assert got.status == "mismatch", (got.status, got.message)


def test_bfloat16_one_element_column_from_the_issue() -> None:
    x = torch.randn(1, 3).bfloat16()[:, 0]
    assert x.stride() == (3,)
    assert compare_tensors(x, x + 1).status == "mismatch"
    assert compare_tensors(x, x.clone()).status == "equal"
    assert content_hash(x) == content_hash(x.clone())


def test_seeded_loop_of_10000_strided_pairs() -> None:
    """10,000 seeded (dtype, layout) views: x vs a copy is equal, x vs one changed element not.

    The oracle is independent of the code under test: equality of ``x``'s values with its own
    clone (bitwise by construction), and a change made through Python numbers.
    """
    g = np.random.default_rng(14)
    bad = []
    for i in range(10_000):
        dtype = ALL_DTYPES[int(g.integers(0, len(ALL_DTYPES)))]
        layout = LAYOUTS[int(g.integers(0, len(LAYOUTS)))]
        x = layout_view(g, dtype, layout)
        changed = _flip_one(x, g) if i % 2 else None
        other = x.clone() if changed is None else changed
        want = "equal" if changed is None else "mismatch"
        got = compare_tensors(x, other, mode="equal")
        if got.status != want:
            bad.append((i, dtype, layout, tuple(x.shape), x.stride(), got.status, got.message))
    assert not bad, bad[:5]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ALL_DTYPES), st.sampled_from(LAYOUTS), st.integers(0, 2**32 - 1))
def test_any_layout_hashes_as_its_contiguous_copy(dtype, layout, seed) -> None:
    """The content hash covers the logical contents: a view hashes as its contiguous copy."""
    g = np.random.default_rng(seed)
    x = layout_view(g, dtype, layout)
    got = compare_tensors(x, x.contiguous().clone(), mode="equal")
    assert got.status == "equal", got.message
    assert got.ref_hash == got.cand_hash == content_hash(x.contiguous())
