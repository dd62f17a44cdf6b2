"""Every metric of a small differing pair in a few whole-array numpy calls (issue 19, item 4).

A pair of at most :data:`SMALL_PAIR` elements is one chunk of ``metrics.diff_stats``, which
folds it through ``fused.EagerFold`` (one row of ``fused.LANES`` lanes, zero-padded) and
``metrics.DiffAccumulator``: about 30 numpy calls and two Python objects. :func:`small_stats`
computes the same :class:`~parity_tracker.compare.metrics.DiffStats`, bit for bit, with the
same operations on whole arrays (tests compare the two field by field): each lane of a single
row is ``0.0 + p_j``, and the lanes are combined by the same ``numpy.add.reduce`` call.
Pairs that are not foldable (a NaN or an infinity, sums that leave float64) return ``None``
and take the general path.
"""

from __future__ import annotations

import numpy as np

from parity_tracker.compare import scaled
from parity_tracker.compare.fused import LANES, _combine, foldable, ulp_scale
from parity_tracker.compare.metrics import DiffStats
from parity_tracker.compare.scaled import ScaledSum

SMALL_PAIR = LANES
"""Largest pair (elements) computed here: one row of :data:`fused.LANES` (256)."""


def small_stats(
    r: np.ndarray, c: np.ndarray, rtol: float, atol: float, eps: float, tiny: float
) -> DiffStats | None:
    """All metrics of a small real floating pair, or ``None`` when the general path must run.

    Args:
        r: reference values, a numpy float16/32/64 array of 1 to :data:`SMALL_PAIR` elements.
        c: candidate values, same shape (any numpy float dtype).
        rtol: relative tolerance of the mismatch count.
        atol: absolute tolerance of the mismatch count.
        eps: ``torch.finfo(reference dtype).eps`` (the ULP unit).
        tiny: ``torch.finfo(reference dtype).tiny`` (the subnormal ULP scale).

    Returns:
        The :class:`DiffStats` that ``metrics.diff_stats(r, c, rtol=rtol, atol=atol)`` returns.
    """
    n = r.size
    x = np.zeros((3, LANES))
    p = np.empty((5, LANES))  # lanes: rr, cc, dd, rc, sabs (fused.EagerFold's order)
    with np.errstate(all="ignore"):
        # widening a signalling NaN (float32 0x7fb5c336, w8 seed 103) quiets it and raises
        # IEEE "invalid": it stays a NaN (never a number), so the sums below are NaN and the
        # pair is refused (the general path counts it); no integer cast happens here
        x[0, :n] = r.reshape(-1)
        x[1, :n] = c.reshape(-1)
        np.subtract(x[1], x[0], out=x[2])
        np.multiply(x, x, out=p[:3])
        np.multiply(x[0], x[1], out=p[3])
        np.abs(x[2], out=p[4])
        # one row: lane j is 0.0 + p_j, i.e. p_j but -0.0 read as +0.0; only the sign of a
        # zero sum can differ, and no metric reads it (ScaledSum ignores zeros)
        rr, cc, dd, rc, sabs = _combine(p)
        if n == 0 or not foldable(rr, cc, rc, dd, sabs):
            return None
        mismatch, top, i_abs, top_rel, i_rel, qr = 0, 0.0, None, 0.0, None, 0.0
        if sabs != 0.0:
            d, ar = p[4, :n], np.abs(x[0, :n])
            i_abs = int(d.argmax())
            top = float(d[i_abs])
            q = d / ar
            top_rel = max(float(np.fmax.reduce(q)), 0.0)
            i_rel = int((q == top_rel).argmax()) if top_rel > 0.0 else None
            t = ar * rtol
            t += atol
            mismatch = int(np.count_nonzero(t < d))
            qr = max(0.0, float(np.maximum.reduce(d / ulp_scale(ar, tiny))))  # all measured
    stats = object.__new__(DiffStats)  # the frozen record, filled without its slow __init__
    stats.__dict__.update(
        numel=n,
        mismatch_count=mismatch,
        max_abs_diff=top,
        max_abs_diff_index=i_abs,
        max_rel_diff=top_rel,
        max_rel_diff_index=i_rel,
        mean_abs_diff=(0.0 + sabs) / n,
        cosine=scaled.cosine(ScaledSum(rc), ScaledSum(rr), ScaledSum(cc)),
        sqnr_db=scaled.sqnr_db(ScaledSum(rr), ScaledSum(dd)),
        max_ulp=qr / eps,
        ref_nan=0,
        cand_nan=0,
        ref_inf=0,
        cand_inf=0,
    )
    return stats
