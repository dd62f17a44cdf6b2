"""Tolerances for ``allclose`` comparisons: the per-dtype table, pairing rules, per-tag overrides.

Defaults come from ``torch.testing.assert_close``: the table below is ``_DTYPE_PRECISIONS`` of
``torch/testing/_comparison.py`` (torch 2.13.0), and, as there, a pair of dtypes gets the
larger rtol and the larger atol of its two sides, so the lower-precision side wins (float32
reference vs bfloat16 candidate → bfloat16's ``(1.6e-2, 1e-5)``).

Two additions, where torch's table has no entry:

- integer and bool dtypes: always ``(0, 0)`` — compared exactly, even in ``allclose`` mode, and
  a pair with an integer or bool on either side is compared exactly.
- other floating dtypes (float8 ``e4m3fn``, ``e5m2``, their ``fnuz`` forms, ...):
  ``rtol = finfo.eps`` (one ULP at 1.0, the rule float16's ``1e-3 ≈ eps = 9.8e-4`` follows) and
  ``atol = finfo.tiny`` (the smallest normal number). torch itself compares float8 bitwise
  (its table falls back to ``(0, 0)``), which would make every float8 candidate fail.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import torch

from parity_tracker.errors import InputError

# torch/testing/_comparison.py, _DTYPE_PRECISIONS (torch 2.13.0): dtype -> (rtol, atol).
DTYPE_PRECISIONS: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
    torch.quint8: (1.3e-6, 1e-5),
    torch.quint2x4: (1.3e-6, 1e-5),
    torch.quint4x2: (1.3e-6, 1e-5),
    torch.qint8: (1.3e-6, 1e-5),
    torch.qint32: (1.3e-6, 1e-5),
}

EXACT = (0.0, 0.0)

V = TypeVar("V")


def first_match(overrides: Sequence[tuple[str, V]], tag: str | None) -> V | None:
    """The value of the first ``(glob, value)`` pair whose glob matches ``tag``, else ``None``.

    The one per-tag glob rule of the package (tolerances, error-budget ``k``): ``fnmatch``
    patterns, case-sensitive (``fnmatch.fnmatchcase``), tried in the order given, first wins.
    """
    if tag is None:
        return None
    for pattern, value in overrides:
        if fnmatch.fnmatchcase(tag, pattern):
            return value
    return None


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A ``torch.dtype`` from a dtype or its name (``"bfloat16"`` or ``"torch.bfloat16"``).

    Raises:
        InputError: if the name is not a torch dtype.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise InputError(f"unknown dtype {dtype!r}; use a torch dtype name such as 'float32'")
    return found


def is_exact_dtype(dtype: torch.dtype) -> bool:
    """True for integer and bool dtypes (compared exactly in every mode)."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype in DTYPE_PRECISIONS)


def dtype_tolerance(dtype: torch.dtype | str) -> tuple[float, float]:
    """Default ``(rtol, atol)`` of one dtype (module docstring gives the sources).

    Args:
        dtype: a torch dtype or its name.

    Returns:
        ``(rtol, atol)``, dimensionless and in the dtype's units.
    """
    dtype = as_dtype(dtype)
    if dtype in DTYPE_PRECISIONS:
        return DTYPE_PRECISIONS[dtype]
    if is_exact_dtype(dtype):
        return EXACT
    try:
        info = torch.finfo(dtype)
    except TypeError:
        return EXACT
    return (float(info.eps), float(info.tiny))


def default_tolerances(
    ref_dtype: torch.dtype | str, cand_dtype: torch.dtype | str
) -> tuple[float, float]:
    """Default ``(rtol, atol)`` for a pair: exact if either side is integer/bool, else the max.

    Source: ``torch.testing._comparison._get_default_rtol_and_atol`` (max over both dtypes).
    """
    ref, cand = as_dtype(ref_dtype), as_dtype(cand_dtype)
    if is_exact_dtype(ref) or is_exact_dtype(cand):
        return EXACT
    (r1, a1), (r2, a2) = dtype_tolerance(ref), dtype_tolerance(cand)
    return (max(r1, r2), max(a1, a2))


def check_pair(rtol: float | None, atol: float | None) -> tuple[float, float] | None:
    """Validate an explicit ``(rtol, atol)``: both given or neither (as torch.testing requires).

    Returns:
        ``None`` when neither is given, else ``(float(rtol), float(atol))``.

    Raises:
        InputError: (a ``ValueError``) when only one of rtol and atol is given, or either is
            negative or NaN.
    """
    if rtol is None and atol is None:
        return None
    if rtol is None or atol is None:
        given, missing = ("rtol", "atol") if atol is None else ("atol", "rtol")
        raise InputError(
            f"rtol and atol must be given together or not at all: got {given} without {missing}"
        )
    pair = (float(rtol), float(atol))
    if not all(v >= 0 and not math.isnan(v) for v in pair):
        raise InputError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    return pair


class Tolerances:
    """Resolves the ``(rtol, atol)`` of one tag: explicit > tag override > global > dtype table.

    Overrides are ``fnmatch`` glob patterns on the tag (case-sensitive), tried in the order
    given; the FIRST matching pattern wins, so list specific patterns before general ones
    (``{"checker_down.1*": (1e-2, 1e-3), "checker_down*": (1e-3, 1e-4)}``). Integer and bool
    pairs stay exact whatever the override says.

    Args:
        overrides: mapping (or iterable of pairs) from glob pattern to ``(rtol, atol)``.
        rtol: global rtol for tags without an override; give together with ``atol``.
        atol: global atol for tags without an override; give together with ``rtol``.

    Raises:
        InputError: when an ``(rtol, atol)`` pair is incomplete, negative or NaN.
    """

    def __init__(
        self,
        overrides: Mapping[str, tuple[float, float]]
        | Iterable[tuple[str, tuple[float, float]]]
        | None = None,
        *,
        rtol: float | None = None,
        atol: float | None = None,
    ) -> None:
        items = overrides.items() if isinstance(overrides, Mapping) else (overrides or ())
        self.overrides: list[tuple[str, tuple[float, float]]] = []
        for pattern, pair in items:
            try:
                checked = check_pair(*pair)
            except InputError as exc:
                raise InputError(f"tolerance override {pattern!r}: {exc}") from None
            if checked is None:
                raise InputError(f"tolerance override {pattern!r} needs (rtol, atol), got {pair}")
            self.overrides.append((str(pattern), checked))
        self.default = check_pair(rtol, atol)

    def match(self, tag: str | None) -> tuple[float, float] | None:
        """The ``(rtol, atol)`` of the first override pattern matching ``tag``, else ``None``."""
        return first_match(self.overrides, tag)

    def resolve(
        self,
        tag: str | None,
        ref_dtype: torch.dtype | str,
        cand_dtype: torch.dtype | str,
        rtol: float | None = None,
        atol: float | None = None,
    ) -> tuple[float, float]:
        """The ``(rtol, atol)`` to use for one tag and dtype pair.

        Precedence: explicit ``rtol``/``atol`` > first matching tag override > the global pair
        given to the constructor > :func:`default_tolerances` of the two dtypes. Integer or
        bool on either side → ``(0.0, 0.0)`` regardless.

        Raises:
            InputError: when only one of ``rtol`` and ``atol`` is given, or a dtype is unknown.
        """
        explicit = check_pair(rtol, atol)
        ref, cand = as_dtype(ref_dtype), as_dtype(cand_dtype)
        if is_exact_dtype(ref) or is_exact_dtype(cand):
            return EXACT
        for pair in (explicit, self.match(tag), self.default):
            if pair is not None:
                return pair
        return default_tolerances(ref, cand)
