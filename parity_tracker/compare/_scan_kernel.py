"""The compiled error scan of :mod:`parity_tracker.compare.budget_scan` (numba; ``fast`` extra).

Imported only when ``numba`` is installed. One loop over a side and its float64 golden reads
each element once: ``max |side − golden|`` (float64, the side widened exactly), the largest
``|golden|``, and whether any of those values is not finite (then the caller takes the torch
path and its non-finite rule). No ``fastmath``; the maxima are exact whatever the order.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

LANES = 256
"""Independent running maxima (a constant trip count LLVM vectorizes, as in ``_kernel``)."""


@intrinsic
def _f32(typingctx, b):  # pragma: no cover (compiled); the float32 of a 32-bit pattern
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


def _wide(x):  # pragma: no cover (replaced by the overload below when compiled)
    raise NotImplementedError


@overload(_wide)
def _wide_overload(x):  # pragma: no cover (compiled)
    """float64 of one element: a float as is; ``uint16``: the bits of a bfloat16."""
    if isinstance(x, types.Float):
        return lambda x: np.float64(x)
    if x == types.uint16:  # bfloat16 = the upper half of a float32 (exact widening)
        return lambda x: np.float64(_f32(np.uint32(x) << np.uint32(16)))
    return None


@numba.njit(nogil=True, error_model="numpy", cache=True)
def scan(s, g):  # pragma: no cover (compiled)
    """``(max |s − g|, max |g|, flag)`` of 1-D arrays; ``flag`` is 0.0 when all are finite.

    ``flag`` adds ``v − v`` for each difference and golden magnitude ``v``: NaN as soon as one
    is infinite or NaN (the maxima are then meaningless: the caller measures another way).
    """
    n = g.size
    top, top_g, bad = np.zeros(LANES), np.zeros(LANES), np.zeros(LANES)
    full = n // LANES
    for lo in range(0, full * LANES, LANES):
        for j in range(LANES):
            y = g[lo + j]
            d = abs(_wide(s[lo + j]) - y)
            a = abs(y)
            top[j] = max(top[j], d)
            top_g[j] = max(top_g[j], a)
            bad[j] += (d - d) + (a - a)
    worst, most, flag = top.max(), top_g.max(), bad.sum()
    for k in range(full * LANES, n):
        y = g[k]
        d = abs(_wide(s[k]) - y)
        a = abs(y)
        worst = max(worst, d)
        most = max(most, a)
        flag += (d - d) + (a - a)
    return worst, most, flag
