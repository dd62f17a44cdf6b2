"""Issue 19, budget round 3: the compiled loop's branch-free ULP pass and its float32 reading.

The compiled loop (``compare._kernel.kernel``) now computes each element's ULP ratio without a
branch and reads a pair of float32 / bfloat16 / float16 sides as float32 (narrow sides
widened exactly). Checked here against a straightforward numpy float64 computation written
from the documented definitions (``compare.fused`` module docstring), not against the code:

- per chunk (``fused.KernelFold``): greatest d and its first index, greatest rel and its first
  index, mismatch count, greatest ULP ratio over ``rel ≥ half_best`` (the scale from
  ``numpy.frexp``, not from bit patterns), and the five sums (to 1e-12: their order differs);
- chunks holding NaN or inf are refused (``None``), as the numpy fold refuses them;
- through ``diff_stats`` (many chunks, NaN / inf / -0.0 / subnormals / bf16 ties) every metric
  against ``test_metrics._np_expected``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_metrics import _close, _np_expected

from parity_tracker.compare import fused, metrics

PAIRS = [
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.bfloat16, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.bfloat16),
    (torch.float32, torch.float32),
    (torch.float64, torch.float64),
    (torch.float64, torch.bfloat16),
]
HALVES = [-1.0, 2.0**-9, 1e-3, math.inf]


def _ties(n: int, g: np.random.Generator) -> np.ndarray:
    """float32 values exactly halfway between two bfloat16 neighbours (low 16 bits 0x8000)."""
    bits = g.integers(0x3F000000, 0x41000000, n, dtype=np.uint32) & np.uint32(0xFFFF0000)
    signs = np.where(g.random(n) < 0.5, np.uint32(0), np.uint32(0x80000000))
    return ((bits | np.uint32(0x8000)) | signs).view(np.float32).astype(np.float64)


def _finite_case(name: str, n: int, seed: int = 0) -> np.ndarray:
    """A float64 reference; the candidate is this rounded to its own dtype (or perturbed)."""
    g = np.random.default_rng(seed)
    r = g.standard_normal(n)
    if name == "ties":
        r = _ties(n, g)
    elif name == "zeros":  # +0.0 and -0.0 in the reference (rel x/0 = inf where c differs)
        r[::3] = 0.0
        r[1::5] = -0.0
    elif name == "subnormal":  # float32 subnormals (≈ 1e-40) next to normal values
        r[::2] *= 1e-40
    elif name == "wide":  # magnitudes from 1e-30 to 1e30
        r = r * 10.0 ** g.uniform(-30, 30, n)
    return r


def _pair(name, n, dtypes, seed=0):
    r64 = _finite_case(name, n, seed)
    r = torch.from_numpy(r64).to(dtypes[0])
    c = r.to(dtypes[1])
    if dtypes[0] == dtypes[1]:  # the same dtype: perturb, or the pair is equal
        c = r.double() * (1 + 1e-3 * torch.from_numpy(np.random.default_rng(1).standard_normal(n)))
        c = c.to(dtypes[1])
    if name == "zeros":
        c[::6] = 0.0  # some zeros matched (0/0), some not
        c[2::7] = -0.0
    return r, c


def _np_fold(r: np.ndarray, c: np.ndarray, rtol, atol, half, tiny) -> dict:
    """The chunk's quantities, straight from the definitions, in numpy float64."""
    with np.errstate(all="ignore"):  # inf - inf (a float16 overflow): such chunks are refused
        return _np_fold_raw(r, c, rtol, atol, half, tiny)


def _np_fold_raw(r, c, rtol, atol, half, tiny) -> dict:
    d = np.abs(c - r)
    ar = np.abs(r)
    rel = np.where(d == 0.0, 0.0, d / ar)
    _, e = np.frexp(ar)  # |r| = m · 2**e, m in [0.5, 1): the power of two at or below is e - 1
    scale = np.maximum(np.where(ar == 0.0, 0.0, np.ldexp(1.0, e - 1)), tiny)
    keep = (d > 0.0) & (rel >= half)
    top, top_rel = float(d.max()), float(rel.max())
    return dict(
        max_abs=top,
        max_abs_idx=int(np.argmax(d)) if top > 0 else -1,
        max_rel=top_rel,
        max_rel_idx=int(np.argmax(rel)) if top_rel > 0 else -1,
        mismatch=int(np.count_nonzero(d > atol + rtol * ar)),
        max_qr=float((d[keep] / scale[keep]).max()) if keep.any() else 0.0,
        rr=float(np.sum(r * r)),
        cc=float(np.sum(c * c)),
        rc=float(np.sum(r * c)),
        dd=float(np.sum(d * d)),
        sabs=float(np.sum(d)),
    )


@pytest.mark.parametrize("dtypes", PAIRS, ids=str)
@pytest.mark.parametrize("case", ["noise", "ties", "zeros", "subnormal", "wide"])
def test_kernel_chunk_matches_numpy_float64(compiled, case, dtypes) -> None:
    tiny = float(torch.finfo(dtypes[0]).tiny)
    for n in (1, 255, 256, 257, 3000):
        r, c = _pair(case, n, dtypes, seed=n)
        rn, cn = r.double().numpy(), c.double().numpy()
        fold = fused.KernelFold(n, compiled)
        for tol in ((0.0, 0.0), (1e-3, 1e-5)):
            for half in HALVES:
                got = fold(r, c, tol, half, tiny, (0.0, 0.0))
                want = _np_fold(rn, cn, *tol, half, tiny)
                if want["sabs"] == 0.0:  # an equal chunk: nothing but the sums is kept
                    want.update(max_abs_idx=-1, max_rel_idx=-1, mismatch=0, max_qr=0.0)
                if got is None:  # refused only when a sum leaves the scaled range
                    assert case in ("subnormal", "wide", "zeros") and not fused.foldable(
                        want["rr"], want["cc"], want["rc"], want["dd"], want["sabs"]
                    ), (case, n)
                    continue
                for key in ("max_abs", "max_abs_idx", "max_rel", "max_rel_idx", "mismatch"):
                    assert getattr(got, key) == want[key], (key, n, tol, half)
                assert got.max_qr == want["max_qr"], (n, tol, half, got.max_qr, want["max_qr"])
                for key in ("rr", "cc", "rc", "dd", "sabs"):
                    assert getattr(got, key) == pytest.approx(want[key], rel=1e-12, abs=0)


@pytest.mark.parametrize("dtypes", PAIRS[:5], ids=str)
@pytest.mark.parametrize("special", [math.nan, math.inf, -math.inf])
def test_non_finite_chunks_are_refused_by_both_folds(compiled, dtypes, special) -> None:
    r, c = _pair("noise", 600, dtypes)
    tiny = float(torch.finfo(dtypes[0]).tiny)
    for side in (r, c):
        side_copy = side.clone()
        side_copy[17] = special
        pair = (side_copy, c) if side is r else (r, side_copy)
        for half in HALVES:
            args = ((1e-3, 1e-5), half, tiny, (0.0, 0.0))
            assert fused.KernelFold(600, compiled)(*pair, *args) is None
            assert fused.EagerFold(600)(*pair, *args) is None


def _specials(r: torch.Tensor, c: torch.Tensor) -> None:
    """NaN and ±inf on either side, matched and not, in a few chunks (in place)."""
    r[5], c[5] = math.nan, math.nan  # matched NaN
    c[900] = math.nan  # lost
    r[1500], c[1500] = math.inf, math.inf  # matched inf
    r[2100], c[2100] = -math.inf, math.inf  # opposite infs
    c[3333] = -math.inf  # lost
    r[4000] = -0.0
    c[4000] = 0.0


@pytest.mark.parametrize("dtypes", PAIRS, ids=str)
@pytest.mark.parametrize("case", ["noise", "ties", "zeros", "subnormal", "wide"])
@pytest.mark.parametrize("specials", [False, True], ids=["finite", "nan_inf"])
def test_diff_stats_mixed_pairs_match_numpy(compiled, monkeypatch, case, dtypes, specials):
    r, c = _pair(case, 5000, dtypes, seed=7)
    if specials:
        _specials(r, c)
    tol = (1.3e-6, 1e-5)
    want = _np_expected(r.double().numpy(), c.double().numpy(), *tol, dtypes[0])
    monkeypatch.setattr(fused, "KERNEL_MIN", 0)
    for workers in (1, 2):
        got = metrics.diff_stats(r, c, rtol=tol[0], atol=tol[1], chunk=700, workers=workers)
        skip = {"sqnr_db", "cosine"} if case in ("subnormal", "wide") else set()
        for key, value in want.items():
            if key not in skip:
                assert _close(getattr(got, key), value), (key, getattr(got, key), value)


def test_small_pairs_use_the_loop_once_it_is_loaded(compiled, monkeypatch) -> None:
    """Below KERNEL_MIN, the compiled loop is used only when already loaded; same metrics."""
    r, c = _pair("ties", 3000, (torch.float32, torch.bfloat16), seed=3)
    pair = r.clone(), c.clone()
    want = _np_expected(r.double().numpy(), c.double().numpy(), 1e-3, 1e-5, torch.float32)
    used = []
    real_call = fused.KernelFold.__call__
    monkeypatch.setattr(
        fused.KernelFold,
        "__call__",
        lambda self, *a, **k: used.append(1) or real_call(self, *a, **k),
    )
    got = metrics.diff_stats(*pair, rtol=1e-3, atol=1e-5)
    assert used  # loaded (the fixture built it): the small pair went through the loop
    for key, value in want.items():
        assert _close(getattr(got, key), value), (key, getattr(got, key), value)
    used.clear()
    monkeypatch.setitem(fused._KERNEL, "fn", None)  # not loaded: the numpy fold, same numbers
    again = metrics.diff_stats(r, c, rtol=1e-3, atol=1e-5)
    assert not used and again == got
