"""One fused pass over a chunk of a real floating pair (issue 19, item 4).

:class:`metrics.DiffAccumulator` hands every chunk of two real floating tensors (float16,
bfloat16, float32, float64, float8; not complex, not integer) to :func:`fold_chunk` first. It
computes every per-chunk quantity of :mod:`parity_tracker.compare.metrics` in float64, with the
same definitions:

- ``d_i = |c_i − r_i|``; the greatest ``d_i`` and the flat index of its first occurrence;
- ``rel_i = d_i / |r_i|`` (``0/0 = 0``, ``x/0 = inf``); its greatest value and first index;
- the mismatch count ``#{d_i > atol + rtol·|r_i|}`` (``rtol·|r_i|`` rounded, then ``+ atol``
  rounded: ``torch.isclose``'s and numpy's order);
- the greatest ULP ratio ``d_i / scale(r_i)`` over the elements with ``rel_i ≥ half_best``
  (see ``DiffAccumulator._ulp`` for why that filter is exact);
- the five sums ``Σ r²``, ``Σ c²``, ``Σ r·c``, ``Σ d²``, ``Σ d``.

The maxima, indices and count are exact whatever the order of work. The sums are not, so they
have ONE fixed order: the chunk is laid out as rows of :data:`LANES` consecutive elements, lane
``j`` adds the products of column ``j`` row after row (``acc_j = ((0 + p_0j) + p_1j) + …``,
each product rounded first, no fused multiply-add), and the lanes are combined with
``math.fsum`` (correctly rounded, so order-free). Two implementations follow that order:

- the eager one, numpy only (``numpy.add.reduce`` over axis 0 of a C-contiguous
  ``(rows, LANES)`` array adds row after row);
- an optional compiled one (``numba``, installed with the ``fast`` extra): one loop reading each
  input element once. It is used when ``numba`` imports and the environment variable
  ``PARITY_NO_KERNEL`` is unset; tests check that both give bit-identical results.

A chunk is folded here only when ``Σ r²``, ``Σ c²`` and ``Σ d²`` are finite and at least
``scaled.SAFE_LOW`` (``Σ d² = Σ d = 0`` allowed) and ``Σ r·c`` is finite; those sums are the
same in both implementations, so both take the same decision. Any other chunk (a NaN or an
infinity, a sum that over- or underflows) returns ``None`` and the caller's general path
measures it.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from parity_tracker.compare.hashing import array_in_place, numpy_in_place
from parity_tracker.compare.scaled import SAFE_LOW
from parity_tracker.compare.ulp import _EXP64

LANES = 256
"""Elements per row of the fixed summation order (see the module docstring)."""

KERNEL_MIN = 1 << 16
"""Smallest pair (elements) that ``metrics.diff_stats`` sends to the compiled loop: importing
numba and loading the cached loop cost ≈ 0.9 s once per process (≈ 20 s the first time after
installing, compiling), which only pairs of this size and up win back. Once the loop is loaded
(:func:`kernel_loaded`), smaller pairs use it too (≈ 8× less time than the numpy fold on a
16 Ki pair; same results)."""

#: Source dtypes the compiled loop reads directly; others are first widened to float64.
_DIRECT = {torch.float32: np.float32, torch.float64: np.float64}
#: Pairs of these dtypes are read as float32 (narrow sides widened exactly into float32).
_TO32 = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class ChunkFold:
    """Everything one chunk adds to a ``DiffAccumulator`` (indices are within the chunk).

    Attributes:
        rr: ``Σ r_i²``.  cc: ``Σ c_i²``.  rc: ``Σ r_i·c_i``.  dd: ``Σ d_i²``.  sabs: ``Σ d_i``.
        max_abs: greatest ``d_i``; max_abs_idx its first index (``-1`` when 0).
        max_rel: greatest ``rel_i``; max_rel_idx its first index (``-1`` when 0).
        mismatch: ``#{d_i > atol + rtol·|r_i|}``.
        max_qr: greatest ULP ratio among the filtered elements (0 when none).
    """

    rr: float
    cc: float
    rc: float
    dd: float
    sabs: float
    max_abs: float
    max_abs_idx: int
    max_rel: float
    max_rel_idx: int
    mismatch: int
    max_qr: float


def _combine(lanes: np.ndarray) -> list[float]:
    """Each row's lanes added by one numpy call: the same call, so the same order, in both folds."""
    return np.add.reduce(lanes, axis=1).tolist()  # callers ignore inf - inf: refused after


def _plain(x: float) -> bool:
    return math.isfinite(x) and x >= SAFE_LOW


def foldable(rr: float, cc: float, rc: float, dd: float, sabs: float) -> bool:
    """Whether a chunk's sums let it be folded here (module docstring); else the general path."""
    noise_ok = (dd == 0.0 and sabs == 0.0) or _plain(dd)
    return _plain(rr) and _plain(cc) and noise_ok and math.isfinite(rc)


class EagerFold:
    """The numpy implementation; scratch buffers for chunks of up to ``size`` elements."""

    def __init__(self, size: int) -> None:
        size = -(-max(size, 1) // LANES) * LANES
        self._x = np.zeros((3, size))  # rows: r, c, d (padding stays 0: adds +0.0 products)
        self._p = np.empty((3, size))
        self._b = np.empty(size, dtype=bool)
        self._lanes = np.empty((5, LANES))  # rr, cc, dd, rc, sabs

    def __call__(self, r, c, tol, half_best: float, tiny: float, bests=(0.0, 0.0)):
        """Fold one chunk (1-D contiguous CPU slices); ``None`` when not foldable.

        ``bests``: the running greatest d and rel; a first index is searched only for a chunk
        maximum that reaches them (``-1`` otherwise: it could not be kept).
        """
        with np.errstate(all="ignore"):  # inf - inf, 0/0: such chunks are refused or defined
            return self._fold(r, c, tol, half_best, tiny, bests)

    def _sums(self, n: int) -> list[float]:
        m = -(-n // LANES)
        x, p, lanes = self._x[:, : m * LANES], self._p[:, : m * LANES], self._lanes
        rd, cd, d = x
        rd[n:] = 0.0
        cd[n:] = 0.0
        np.subtract(cd, rd, out=d)
        np.multiply(x, x, out=p)  # r², c², d²: each product rounded, then added lane by lane
        np.add.reduce(p.reshape(3, m, LANES), axis=1, out=lanes[:3], initial=0.0)
        np.multiply(rd, cd, out=p[0])
        np.add.reduce(p[0].reshape(m, LANES), axis=0, out=lanes[3], initial=0.0)
        np.abs(d, out=d)
        np.add.reduce(d.reshape(m, LANES), axis=0, out=lanes[4], initial=0.0)
        return _combine(lanes)

    def _fold(self, r, c, tol, half_best: float, tiny: float, bests):
        n = r.numel()
        rd, cd, d = self._x[0, :n], self._x[1, :n], self._x[2, :n]
        _widen(rd, r)
        _widen(cd, c)
        rr, cc, dd, rc, sabs = self._sums(n)
        if not foldable(rr, cc, rc, dd, sabs):
            return None
        if sabs == 0.0:
            return ChunkFold(rr, cc, rc, dd, 0.0, 0.0, -1, 0.0, -1, 0, 0.0)
        top = float(d.max())
        i_abs = int(np.argmax(d)) if top >= bests[0] else -1
        np.abs(rd, out=rd)  # |r| (its exponent bits are r's: the ULP scale is unchanged)
        q, t = self._p[0, :n], self._p[1, :n]
        np.divide(d, rd, out=q)  # 0/0 = NaN: ignored by fmax, never >= anything
        top_rel = max(float(np.fmax.reduce(q)), 0.0)
        i_rel = -1
        if top_rel > 0.0 and top_rel >= bests[1]:
            i_rel = int(np.argmax(q == top_rel))
        np.multiply(rd, tol[0], out=t)
        np.add(t, tol[1], out=t)
        mismatch = int(np.count_nonzero(np.less(t, d, out=self._b[:n])))
        qr = _eager_ulp(rd, d, q, half_best, tiny) if top_rel >= half_best else 0.0
        return ChunkFold(rr, cc, rc, dd, sabs, top, i_abs, top_rel, i_rel, mismatch, qr)


def _widen(dst: np.ndarray, src: torch.Tensor) -> None:
    """Copy a chunk into the float64 buffer (exact: every real floating dtype fits).

    The chunk may be a model's own tensor: read in place (``hashing.numpy_in_place``), never
    through ``numpy()``, which marks its storage not resizable for good (a later ``resize_``
    in the model raised).
    """
    if src.dtype in _DIRECT or src.dtype == torch.float16:
        np.copyto(dst, numpy_in_place(src))
    else:
        torch.from_numpy(dst).copy_(src)


def ulp_scale(ar: np.ndarray, tiny: float) -> np.ndarray:
    """``max(2**e(x), tiny)`` of float64 magnitudes: the exponent field of their bit pattern.

    Zeros and float64 subnormals read 0 there and get ``tiny`` (the reference dtype's smallest
    normal, ≥ float64's); the compiled loop computes the same power of two with ``frexp``.
    """
    scale = np.bitwise_and(ar.view(np.int64), _EXP64).view(np.float64)
    return np.maximum(scale, tiny, out=scale)


def _eager_ulp(ar: np.ndarray, d: np.ndarray, q: np.ndarray, half_best: float, tiny: float):
    """Greatest ``d_i / max(2**e(r_i), tiny)`` over ``q_i >= half_best`` (all when ``< 0``)."""
    if half_best < 0.0:  # d_i = 0 adds a ratio of 0
        return float((d / ulp_scale(ar, tiny)).max())
    where = np.flatnonzero((q >= half_best) & (d > 0.0))
    if where.size == 0:
        return 0.0
    return float((d[where] / ulp_scale(ar[where], tiny)).max())


# --- the optional compiled loop ------------------------------------------------------------


def _build_kernel():
    """The numba loop, or ``None`` when numba is absent or disabled (``PARITY_NO_KERNEL``)."""
    if os.environ.get("PARITY_NO_KERNEL"):
        return None
    try:
        from parity_tracker.compare._kernel import kernel as fn
    except ImportError:
        return None
    except Exception as exc:  # a broken numba install: the numpy fold gives the same results
        _disable(exc)
        return None
    return fn


def give_up(state: dict, what: str, fallback: str, exc: BaseException) -> None:
    """Stop using a compiled loop in this process, once, with a warning naming why.

    The one rule for every optional numba loop of the package (this module's comparison loop,
    :mod:`parity_tracker.compare.budget_scan`'s error scan): ``state`` (``{"fn", "built"}``)
    is set to "built, none", so the caller's fallback (``fallback``: same results) is used
    from now on.

    Args:
        state: the loop's ``{"fn": ..., "built": ...}`` record.
        what: the loop, e.g. ``"compiled comparison loop"``.
        fallback: what computes instead, e.g. ``"the numpy fold"``.
        exc: why the loop cannot be used.
    """
    state["fn"], state["built"] = None, True
    warnings.warn(
        f"parity_tracker: {what} unavailable ({type(exc).__name__}: {exc}); "
        f"using {fallback} (same results, slower). Set PARITY_NO_KERNEL=1 to silence.",
        RuntimeWarning,
        stacklevel=4,
    )


def _disable(exc: BaseException) -> None:
    give_up(_KERNEL, "compiled comparison loop", "the numpy fold", exc)


_KERNEL = {"fn": None, "built": False}


def kernel_loaded() -> bool:
    """Whether the compiled loop is already loaded in this process (using it costs no import)."""
    return _KERNEL["built"] and _KERNEL["fn"] is not None


def kernel():
    """The compiled loop (built on first use), or ``None``."""
    if not _KERNEL["built"]:
        _KERNEL["fn"], _KERNEL["built"] = _build_kernel(), True
    return _KERNEL["fn"]


class KernelFold:
    """The compiled implementation (same results as :class:`EagerFold`, bit for bit)."""

    def __init__(self, size: int, fn) -> None:
        self._fn = fn
        self._lanes = np.zeros((5, LANES))  # rr, cc, dd, rc, sabs (EagerFold's rows)
        self._r, self._c = np.empty(max(size, 1)), np.empty(max(size, 1))
        self._r32, self._c32 = (np.empty(max(size, 1), np.float32) for _ in range(2))
        self._size, self._eager = size, None  # the numpy fold, once the loop failed to run

    def _inputs(self, r: torch.Tensor, c: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """The two numpy arrays the loop reads (float32, float64, or bfloat16 bits as uint16).

        float32 pairs and float64 pairs are read in place; in a pair of float32, bfloat16 and
        float16 sides, bfloat16 is read in place as its bits (``uint16``; the loop widens it
        exactly) and float16 is widened into a float32 scratch (exact); any other pair is
        widened into float64 scratch.

        In place is ``hashing.array_in_place``, never ``numpy()`` (which marks a model's own
        tensor's storage not resizable for good); ``writeable=True`` only so that the loop's
        compiled signatures stay those of writable arrays (it never writes its inputs).
        """
        n = r.numel()
        if r.dtype == c.dtype and r.dtype in _DIRECT:  # read in place
            return array_in_place(r, writeable=True), array_in_place(c, writeable=True)
        if r.dtype in _TO32 and c.dtype in _TO32:
            return self._to32(r, self._r32, n), self._to32(c, self._c32, n)
        rs, cs = self._r[:n], self._c[:n]
        _widen(rs, r)
        _widen(cs, c)
        return rs, cs

    @staticmethod
    def _to32(x: torch.Tensor, scratch: np.ndarray, n: int) -> np.ndarray:
        if x.dtype == torch.float32:
            return array_in_place(x, writeable=True)
        if x.dtype == torch.bfloat16:  # its bits, widened in the loop (``_kernel._wide``)
            return array_in_place(x, np.uint16, writeable=True)
        torch.from_numpy(scratch[:n]).copy_(x)
        return scratch[:n]

    def __call__(self, r, c, tol, half_best: float, tiny: float, bests=(0.0, 0.0)):
        """Fold one chunk (1-D contiguous CPU slices); ``None`` when not foldable.

        ``bests``: the running greatest d and rel; a first index is searched only for a chunk
        maximum that reaches them (``-1`` otherwise: it could not be kept).
        """
        if self._eager is not None:
            return self._eager(r, c, tol, half_best, tiny, bests)
        rs, cs = self._inputs(r, c)
        try:
            top, i_abs, top_rel, i_rel, mismatch, qr = self._fn(
                rs, cs, *(float(x) for x in (tiny, *tol, half_best, *bests)), self._lanes
            )
        except Exception as exc:  # e.g. numba cannot compile here: never lose the comparison
            _disable(exc)
            self._eager = EagerFold(self._size)
        if self._eager is not None:
            return self._eager(r, c, tol, half_best, tiny, bests)
        with np.errstate(all="ignore"):  # inf - inf in a non-finite chunk: not foldable
            rr, cc, dd, rc, sabs = _combine(self._lanes)
        if not foldable(rr, cc, rc, dd, sabs):
            return None
        if sabs == 0.0:
            return ChunkFold(rr, cc, rc, dd, 0.0, 0.0, -1, 0.0, -1, 0, 0.0)
        return ChunkFold(rr, cc, rc, dd, sabs, top, i_abs, top_rel, i_rel, int(mismatch), qr)


_FOLDS = threading.local()  # per thread: {(rounded size, loop): fold}, scratch reused


def make_fold(size: int, use_kernel: bool | None = None):
    """The fold for chunks of up to ``size`` elements: compiled when available, else eager.

    Folds keep no state between calls, so one per thread and size class (a power of two) is
    reused: fresh multi-MiB scratch buffers per comparison cost more in page faults than the
    comparison itself (2.6 ms against 0.6 for a 2^16-element pair).

    Args:
        size: the largest chunk (sizes the scratch buffers).
        use_kernel: force (``True``) or refuse (``False``) the compiled loop; ``None``: use it
            when ``numba`` imports and ``PARITY_NO_KERNEL`` is unset.
    """
    fn = kernel() if use_kernel in (None, True) else None
    if use_kernel and fn is None:
        raise RuntimeError("the compiled comparison loop needs numba: pip install numba")
    rounded = max(LANES, 1 << (max(size, 1) - 1).bit_length())
    folds = getattr(_FOLDS, "folds", None)
    if folds is None:
        folds = _FOLDS.folds = {}
    key = (rounded, fn)
    if key not in folds:
        folds[key] = KernelFold(rounded, fn) if fn is not None else EagerFold(rounded)
    return folds[key]
