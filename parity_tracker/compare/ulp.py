"""The unit of the ULP metric: a reference dtype's eps and smallest normal (``metrics.max_ulp``).

``ulp(x) = max(2**e(x), tiny) · eps`` for a value ``x`` of the reference dtype, widened exactly
to float64 (``2**e(x)``: the power of two at or below ``|x|``, read from the exponent field of
the float64 bit pattern; ``tiny = torch.finfo(dtype).tiny``); see ``metrics.max_ulp``.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

import torch

_EXP64 = 0x7FF0000000000000  # exponent field of a float64
_FILTER_FLOOR = 1e-300  # below it halving the running max ULP ratio could round; measure all


@dataclass(frozen=True)
class UlpSpec:
    """What the ULP of a reference dtype needs: its eps and its smallest normal (as float64 bits).

    Attributes:
        eps: ``torch.finfo(dtype).eps`` (the ULP of 1.0).
        tiny_bits: the float64 bit pattern of ``torch.finfo(dtype).tiny``.
    """

    eps: float
    tiny_bits: int


@functools.cache
def ulp_spec(dtype: torch.dtype) -> UlpSpec | None:
    """The :class:`UlpSpec` of a float (or complex) dtype; ``None`` for int/bool or e8m0."""
    if dtype.is_complex:
        dtype = dtype.to_real()
    if not dtype.is_floating_point or "e8m0" in str(dtype):
        return None
    info = torch.finfo(dtype)
    tiny_bits = struct.unpack("<q", struct.pack("<d", float(info.tiny)))[0]
    return UlpSpec(float(info.eps), tiny_bits)


def _ulp_ratio(x: torch.Tensor, d: torch.Tensor, spec: UlpSpec, bits: torch.Tensor, out):
    """``d / (2**e(x) clamped to tiny)`` where x is the float64 image of reference values.

    Masking the exponent field of the float64 bit pattern gives ``2**e(x)`` exactly, for any
    reference dtype (its values are exact in float64); clamping at the dtype's smallest normal
    gives the subnormal spacing ÷ eps. Multiply the result by ``1/eps`` for ULPs.
    """
    torch.bitwise_and(x.view(torch.int64), _EXP64, out=bits)
    bits.clamp_min_(spec.tiny_bits)
    return torch.div(d, bits.view(torch.float64), out=out)
