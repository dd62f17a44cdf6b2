"""Property tests: random shapes, dtypes and NaN/inf placement never raise or give NaN metrics."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity_tracker.compare import STATUSES, compare_tensors, passes

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
