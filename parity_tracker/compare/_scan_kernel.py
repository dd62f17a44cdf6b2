"""The compiled error scan of :mod:`parity_tracker.compare.budget_scan` (numba; ``fast`` extra).

Imported only when ``numba`` is installed. One loop over a side and its float64 golden reads
each element once: ``max |side − golden|`` (float64, the side widened exactly), the largest
``|golden|``, and whether any of those values is not finite (then the caller takes the torch
path and its non-finite rule). No ``fastmath``; the maxima are exact whatever the order.
"""

from __future__ import annotations

import numba
import numpy as np

LANES = 256
"""Independent running maxima (a constant trip count LLVM vectorizes, as in ``_kernel``)."""


from parity_tracker.compare._kernel import _wide  # noqa: E402  (one owner of the widening)


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
