"""The compiled loop of :mod:`parity_tracker.compare.fused` (numba; the ``fast`` extra).

Imported only when ``numba`` is installed; every function follows ``fused.EagerFold``'s
definitions and summation order exactly (``tests/test_compare_fused.py`` checks bit identity).
No ``fastmath``: no reassociation, no fused multiply-add; ``error_model="numpy"``: IEEE
division (``x/0 = inf``). Compiled on first use and cached next to this file (numba's cache).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from parity_tracker.compare.fused import LANES
from parity_tracker.compare.ulp import _EXP64


@intrinsic
def _bits(typingctx, x):  # pragma: no cover (compiled); a float64's bit pattern, as int64
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def _from_bits(typingctx, b):  # pragma: no cover (compiled); the float64 of a bit pattern
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def _f32(typingctx, b):  # pragma: no cover (compiled); the float32 of a 32-bit pattern
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


def _wide(x):  # pragma: no cover (replaced by the overload below when compiled)
    raise NotImplementedError


@overload(_wide)
def _wide_overload(x):  # pragma: no cover (compiled)
    """float64 of one element: a float as is; ``uint16``: the bits of a bfloat16 (exact)."""
    if isinstance(x, types.Float):
        return lambda x: np.float64(x)
    if x == types.uint16:  # bfloat16 = the upper half of a float32
        return lambda x: np.float64(_f32(np.uint32(x) << np.uint32(16)))
    return None


@numba.njit(nogil=True, error_model="numpy", cache=True)
def value(r, c, k, rel):  # pragma: no cover (compiled); d_k or rel_k, as rows computes it
    x = _wide(r[k])
    a = abs(_wide(c[k]) - x)
    if not rel:
        return a
    q = a / abs(x)
    return 0.0 if a == 0.0 else q


@numba.njit(nogil=True, error_model="numpy", cache=True)
def first(r, c, lane_max, top, rel):  # pragma: no cover (compiled)
    """Smallest index whose d (or rel) equals ``top``: only the lanes whose maximum it is."""
    best = -1
    for j in range(LANES):
        if lane_max[j] != top:
            continue
        for k in range(j, r.size, LANES):
            if best >= 0 and k >= best:
                break
            if value(r, c, k, rel) == top:
                best = k
                break
    return best


@numba.njit(nogil=True, error_model="numpy", cache=True)
def kernel(r, c, tiny, rtol, atol, half_best, best_abs, best_rel, out):
    """Fold one chunk: lane sums into ``out`` (rows rr, cc, dd, rc, sabs); the rest returned.

    ``r`` and ``c``: float32 or float64 arrays, or ``uint16`` arrays holding bfloat16 bits
    (widened exactly in the loop, so a bfloat16 side is read as stored: 2 bytes per element).

    The lanes are local arrays, not ``out``'s rows nor a helper's arguments: LLVM vectorizes
    stores it can prove do not alias (measured 0.65 against 1.1 to 3.3 ns per element).

    The ULP ratio ``d / max(2**e(r), tiny)`` is computed for every element in the same loop,
    without a branch (issue 19): the scale is the exponent field of the float64 bit pattern of
    ``|r|`` (``fused.ulp_scale``), and an element counts only when ``d > 0`` and
    ``rel ≥ half_best`` (the filter of ``DiffAccumulator._ulp``), else it adds 0. A branch per
    element there mispredicted on rounding noise (≈ 9 ns per element on bf16-rounded data).
    """
    n = r.size
    srr, scc, src, sdd = np.zeros(LANES), np.zeros(LANES), np.zeros(LANES), np.zeros(LANES)
    sab, mab, mrl, mqr = np.zeros(LANES), np.zeros(LANES), np.zeros(LANES), np.zeros(LANES)
    count = np.zeros(LANES, np.int64)
    full = n // LANES
    tail = n - full * LANES
    tr, tc = np.zeros(LANES, r.dtype), np.zeros(LANES, c.dtype)  # the tail, zero-padded to a
    tr[:tail] = r[full * LANES :]  # row as the eager fold pads it
    tc[:tail] = c[full * LANES :]
    for part in range(2):  # the full rows, then the padded tail; one loop body (vectorized)
        xr = r if part == 0 else tr
        xc = c if part == 0 else tc
        nrows = full if part == 0 else min(tail, 1)
        for lo in range(0, nrows * LANES, LANES):
            for j in range(LANES):  # a constant trip count: LLVM vectorizes the lanes
                x = _wide(xr[lo + j])
                y = _wide(xc[lo + j])
                e = y - x
                srr[j] += x * x
                scc[j] += y * y
                src[j] += x * y
                sdd[j] += e * e
                a = abs(e)
                sab[j] += a
                mab[j] = max(mab[j], a)
                ax = abs(x)
                q = a / ax
                u = a / max(_from_bits(_bits(ax) & _EXP64), tiny)  # d / ULP scale (exact)
                mqr[j] = max(mqr[j], u if (a != 0.0 and q >= half_best) else 0.0)
                q = 0.0 if a == 0.0 else q  # 0/0 (both zero): relative difference 0
                mrl[j] = max(mrl[j], q)
                count[j] += 1 if a > atol + rtol * ax else 0
    out[0, :] = srr
    out[1, :] = scc
    out[2, :] = sdd
    out[3, :] = src
    out[4, :] = sab
    top, top_rel = mab.max(), mrl.max()
    i_abs = first(r, c, mab, top, False) if top > 0.0 and top >= best_abs else -1
    i_rel = first(r, c, mrl, top_rel, True) if top_rel > 0.0 and top_rel >= best_rel else -1
    return top, i_abs, top_rel, i_rel, count.sum(), mqr.max()
