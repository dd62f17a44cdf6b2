"""Sums of squares and dot products that neither overflow nor underflow (issue 13, item 4).

SQNR and cosine come from ``Σ r²``, ``Σ c²``, ``Σ r·c`` and ``Σ d²``. Squaring float64 values
near 1e±154 or beyond overflows to ``inf`` or underflows to ``0``: a pair of subnormal-scaled
tensors that differ then had ``Σ d² = 0`` (SQNR ``+inf``: "identical") and two orthogonal
vectors of 1e-200 had ``Σ r² = Σ c² = 0`` (cosine ``1.0``). Here a sum is kept as
``m · 2**k`` (:class:`ScaledSum`): a chunk whose plain float64 sum is finite and at least
:data:`SAFE_LOW` is taken as it is (the fast, usual path); any other chunk is first multiplied
by ``2**-e``, ``e`` the binary exponent of its largest magnitude (exact: a power of two), so
its largest term is in ``[1/4, 1)`` and nothing that matters is lost, then summed, and carried
with ``k = 2e`` (``e_a + e_b`` for a dot). SQNR and cosine are then formed in log2 space.

Accuracy of the fast path: when the sum is ≥ ``SAFE_LOW = 2**-960``, terms lost to underflow
(< 2**-1074 each) change it by at most ``n·2**-114`` relatively.
"""

from __future__ import annotations

import math

import numpy as np
import torch

#: Smallest plain float64 sum taken without rescaling (see the module docstring).
SAFE_LOW = 2.0**-960


def sqnr_from_sums(signal: float, noise: float) -> float | None:
    """Signal-to-quantization-noise ratio in dB from ``Σ r²`` and ``Σ (r − c)²``.

    Formula: ``SQNR = 10·log10(Σ r_i² / Σ (r_i − c_i)²)`` (the ratio
    ``torch.ao.ns.fx.utils.compute_sqnr`` reports, there as ``20·log10(‖r‖/‖r − c‖)``).

    Defined cases (never NaN): no noise → ``+inf`` (identical, including two all-zero
    tensors); noise but an all-zero reference → ``-inf``; infinite noise (an unmatched
    NaN/inf) → ``-inf``; both sums overflowing float64 → ``None``.
    """
    if noise == 0.0:
        return math.inf
    if signal == 0.0 or noise == math.inf:
        return -math.inf if signal != math.inf else None
    if signal == math.inf:
        return math.inf
    return 10.0 * (math.log10(signal) - math.log10(noise))


def cosine_from_sums(dot: float, ref_sq: float, cand_sq: float) -> float | None:
    """Cosine similarity from ``Σ r·c``, ``Σ r²`` and ``Σ c²``, clamped to ``[-1, 1]``.

    Formula: ``cos = Σ r_i c_i / (sqrt(Σ r_i²) · sqrt(Σ c_i²))`` (as
    ``torch.nn.functional.cosine_similarity`` over the flattened tensors, without its eps).
    Complex tensors count as real vectors of their (real, imag) pairs.

    Defined cases (never NaN): both vectors all zero → ``1.0`` (identical); exactly one all
    zero → ``0.0``; a sum overflowing float64 → ``None``.
    """
    if not (math.isfinite(dot) and math.isfinite(ref_sq) and math.isfinite(cand_sq)):
        return None
    if ref_sq == 0.0 and cand_sq == 0.0:
        return 1.0
    if ref_sq == 0.0 or cand_sq == 0.0:
        return 0.0
    return max(-1.0, min(1.0, dot / (math.sqrt(ref_sq) * math.sqrt(cand_sq))))


class ScaledSum:
    """A float64 sum kept as ``m · 2**k`` (``m`` normalised by ``math.frexp``); exact in range."""

    __slots__ = ("k", "m")

    def __init__(self, m: float = 0.0, k: int = 0) -> None:
        self.m, self.k = 0.0, 0
        self.add(m, k)

    def add(self, m: float, k: int = 0) -> None:
        """Add ``m · 2**k`` (``m`` finite or ±inf; ``inf`` makes the sum infinite)."""
        if m == 0.0:
            return
        if not math.isfinite(m) or not math.isfinite(self.m):
            self.m, self.k = self.m + m if self.m else m, 0
            return
        if self.m == 0.0:
            self.m, self.k = math.frexp(m)[0], k + math.frexp(m)[1]
            return
        top = max(self.k, k)
        total = math.ldexp(self.m, self.k - top) + math.ldexp(m, k - top)
        f, e = math.frexp(total)
        self.m, self.k = f, top + e

    def merge(self, other: ScaledSum) -> None:
        """Add another sum."""
        self.add(other.m, other.k)

    def log2(self) -> float:
        """``log2`` of the (positive) sum; ``-inf`` for 0, ``inf`` for an infinite sum."""
        if self.m == 0.0:
            return -math.inf
        if not math.isfinite(self.m):
            return math.inf
        return math.log2(abs(self.m)) + self.k

    def __float__(self) -> float:
        """The value as one float64 (``inf``/``0`` where it does not fit)."""
        return math.ldexp(self.m, self.k) if math.isfinite(self.m) else self.m


def _exponent(x: torch.Tensor) -> int | None:
    """Binary exponent ``e`` of ``max |x_i|`` (``max = f·2**e``, ``f`` in [0.5, 1)); None: all 0."""
    top = float(x.abs().max()) if x.numel() else 0.0
    return math.frexp(top)[1] if top > 0.0 else None


def _scale(x: torch.Tensor, e: int) -> np.ndarray:
    """``x · 2**-e`` as a float64 numpy array (complex: (re, im) pairs), exact (two steps).

    ``x`` is ``metrics.DiffAccumulator``'s float64 scratch (a copy), never a model's tensor,
    so ``numpy()`` (which marks a storage not resizable for good) is safe here.
    """
    if x.is_complex():
        x = torch.view_as_real(x).reshape(-1)
    half = -e // 2
    return x.numpy() * math.ldexp(1.0, half) * math.ldexp(1.0, -e - half)


def scaled_sq(x: torch.Tensor, plain: float) -> tuple[float, int]:
    """``Σ |x_i|²`` as ``(m, k)`` given the plain float64 sum ``plain`` of the same chunk."""
    if math.isfinite(plain) and plain >= SAFE_LOW:
        return plain, 0
    e = _exponent(x)
    if e is None:
        return 0.0, 0
    y = _scale(x, e)
    return float(np.einsum("i,i->", y, y)), 2 * e


def scaled_dot(a: torch.Tensor, b: torch.Tensor, plain: float, safe: bool) -> tuple[float, int]:
    """``Σ a_i·b_i`` as ``(m, k)``; ``safe``: both sums of squares took the plain path.

    When ``Σ a²`` and ``Σ b²`` are both plain (finite, ≥ SAFE_LOW) every product is finite
    and the underflowed ones are negligible against ``sqrt(Σa²·Σb²)`` (Cauchy–Schwarz).
    """
    if safe and math.isfinite(plain):
        return plain, 0
    ea, eb = _exponent(a), _exponent(b)
    if ea is None or eb is None:
        return 0.0, 0
    return float(np.einsum("i,i->", _scale(a, ea), _scale(b, eb))), ea + eb


def sqnr_db(signal: ScaledSum, noise: ScaledSum) -> float | None:
    """``10·log10(Σ r² / Σ d²)`` from scaled sums; same defined cases as ``sqnr_from_sums``.

    No noise → ``+inf`` (identical); noise but an all-zero reference, or infinite noise (an
    unmatched NaN/inf) → ``-inf``. Finite otherwise, whatever the magnitudes.
    """
    if noise.m == 0.0:
        return math.inf
    if signal.m == 0.0 or not math.isfinite(noise.m):
        return -math.inf
    return 10.0 * math.log10(2.0) * (signal.log2() - noise.log2())


def cosine(dot: ScaledSum, ref_sq: ScaledSum, cand_sq: ScaledSum) -> float | None:
    """``Σ r·c / (‖r‖·‖c‖)`` from scaled sums, clamped to [-1, 1]; same defined cases.

    Both all zero → ``1.0``; exactly one all zero → ``0.0``; an infinite sum → ``None``.
    """
    if not all(math.isfinite(s.m) for s in (dot, ref_sq, cand_sq)):
        return None
    if ref_sq.m == 0.0 and cand_sq.m == 0.0:
        return 1.0
    if ref_sq.m == 0.0 or cand_sq.m == 0.0 or dot.m == 0.0:
        return 0.0
    exponent = dot.k - (ref_sq.k + cand_sq.k) / 2.0
    value = dot.m / math.sqrt(ref_sq.m * cand_sq.m) * 2.0**exponent
    return max(-1.0, min(1.0, value))


def scaled_diff_sq(r: torch.Tensor, c: torch.Tensor) -> tuple[float, int]:
    """``Σ |c_i − r_i|²`` as ``(m, k)`` when ``c − r`` itself overflows (both sides finite).

    Both sides are scaled by one power of two (from the larger of their largest magnitudes)
    before subtracting, so the difference of two values near ±1.8e308 stays finite.
    """
    er, ec = _exponent(r), _exponent(c)
    e = max(x for x in (er, ec, 0) if x is not None)
    y = _scale(c, e) - _scale(r, e)
    return float(np.einsum("i,i->", y, y)), 2 * e
