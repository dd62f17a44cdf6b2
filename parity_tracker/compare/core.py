"""Compare one reference tensor with one candidate tensor (design.md, "Comparison semantics").

One public function, :func:`compare_tensors`, read top to bottom (the layout of
``torch/testing/_comparison.py``): normalise both sides (:mod:`parity_tracker.compare.convert`),
check shapes, run the ``equal`` fast path (content hashes and a bitwise check chunk by chunk,
one read of each input), and only for pairs that are not bitwise identical compute every metric
in one chunked pass (:mod:`parity_tracker.compare.metrics`). Tolerances come from
:mod:`parity_tracker.compare.tolerances`. ``compare.verdict.passes`` is the same verdict
without the metrics.

Semantics:

- ``equal``: same shape, same dtype and equal values — ``torch.equal`` semantics, so
  ``-0.0 == 0.0`` (the content hashes still differ and the message says so), plus NaN matching
  NaN at the same position.
- ``allclose``: ``|c − r| ≤ atol + rtol·|r|`` elementwise (``torch.isclose``; complex by the
  modulus of the difference), defaults per dtype from ``torch.testing.assert_close`` for the
  lower-precision side, integers and bools always exact, NaN/inf matched by position. A pair
  whose values are equal and whose dtypes match is reported ``equal`` in this mode too;
  otherwise ``close`` or ``mismatch``. A dtype difference is named in the message.
- Shapes that differ give ``shape_mismatch`` (never broadcast); an input without data (meta)
  gives ``skipped``; ``None`` or an unsupported type gives ``error``. No pair raises and no
  metric is NaN.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Any

import torch
import xxhash

from parity_tracker.compare.convert import Converted, _plain, quant_notes, to_tensor
from parity_tracker.compare.finite import DOT_FINITE_MIN, _all_finite  # noqa: F401 (re-exported)
from parity_tracker.compare.finite import side_counts as _side_counts
from parity_tracker.compare.hashing import (
    _NUMPY_DTYPES,
    StreamHasher,
    dtype_name,
    numpy_in_place,
    raw_buffer,
)
from parity_tracker.compare.metrics import (
    SMALL,
    DiffStats,
    diff_stats,
    flat,
    nonfinite_counts,
    torch_threads,
    ulp_spec,
)
from parity_tracker.compare.small import SMALL_PAIR, small_stats
from parity_tracker.compare.tolerances import Tolerances, check_pair
from parity_tracker.errors import InputError
from parity_tracker.statuses import MODES, PASSING

EQUAL_CHUNK = 1 << 18
"""Elements per chunk of the equal fast path (1 MiB of float32: hashed, then compared in cache)."""
# SMALL (metrics.SMALL): pairs of at most this many elements take the small path: each side
# hashed in one call, no chunking, no worker threads and no change to torch's thread count (a
# process-wide setting that costs more than the whole comparison of a small pair).


@dataclass(frozen=True)
class Comparison:
    """The verdict and metrics for one reference/candidate pair.

    Field names are the comparison columns of the ``modules`` and ``ops`` tables.
    Metrics are ``None`` where they do not apply (never NaN as a stand-in).
    """

    status: str
    mode: str
    numel: int | None = None
    ref_shape: tuple[int, ...] | None = None
    cand_shape: tuple[int, ...] | None = None
    ref_dtype: str | None = None
    cand_dtype: str | None = None
    ref_device: str | None = None
    cand_device: str | None = None
    mismatch_count: int | None = None
    max_abs_diff: float | None = None
    max_abs_diff_index: tuple[int, ...] | None = None
    max_rel_diff: float | None = None
    max_rel_diff_index: tuple[int, ...] | None = None
    mean_abs_diff: float | None = None
    cosine: float | None = None
    sqnr_db: float | None = None
    max_ulp: float | None = None
    ref_nan: int | None = None
    cand_nan: int | None = None
    ref_inf: int | None = None
    cand_inf: int | None = None
    ref_hash: str | None = None
    cand_hash: str | None = None
    rtol: float | None = None
    atol: float | None = None
    message: str = ""
    golden_max_abs_err: float | None = None
    twin_max_abs_err: float | None = None
    error_ratio: float | None = None

    @property
    def passed(self) -> bool:
        """True when the status is ``equal`` or ``close``."""
        return self.status in PASSING

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (tuples kept), ready for a table row.

        Shallow on purpose: every field is immutable, and ``dataclasses.asdict``'s deep copy
        cost more than the comparison of a small identical pair.
        """
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    @classmethod
    def _fast(cls, values: dict[str, Any]) -> Comparison:
        """Build a record from complete field values without the frozen ``__init__``.

        The generated frozen ``__init__`` sets each of the 27 fields through
        ``object.__setattr__`` (≈ 5 µs, a sixth of a small comparison); filling ``__dict__``
        gives an identical, still frozen record. ``values`` must name only fields.
        """
        record = object.__new__(cls)
        record.__dict__.update(_DEFAULTS)
        record.__dict__.update(values)
        return record


_DEFAULTS = {f.name: f.default for f in fields(Comparison)}
_FIELD_NAMES = tuple(_DEFAULTS)


def missing(side: str, mode: str, other: Any = None) -> Comparison:
    """A ``missing_reference`` / ``missing_candidate`` record; ``side`` names the absent side."""
    status = f"missing_{side}"
    return Comparison(status=status, mode=mode, message=f"no {side} tensor registered")


def _base(mode: str, ref: Converted, cand: Converted) -> dict[str, Any]:
    return dict(
        mode=mode,
        numel=ref.tensor.numel() if ref.tensor is not None else None,
        ref_shape=ref.shape,
        cand_shape=cand.shape,
        ref_dtype=ref.dtype,
        cand_dtype=cand.dtype,
        ref_device=ref.device,
        cand_device=cand.device,
    )


def _unravel(flat_index: int | None, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """C-order multi-index of a flat index (as ``torch.testing``'s ``unravel_flat_index``)."""
    if flat_index is None:
        return None
    if len(shape) == 1:
        return (flat_index,)
    out = []
    for size in reversed(shape):
        flat_index, rem = divmod(flat_index, size)
        out.append(rem)
    return tuple(reversed(out))


@dataclass(frozen=True)
class _Scan:
    stats: DiffStats | None  # None: bitwise identical, no metrics needed
    ref_hash: str
    cand_hash: str
    ref_nan: int = 0
    ref_inf: int = 0


def _scan(r: torch.Tensor, c: torch.Tensor, ref: Converted, cand: Converted, tol) -> _Scan:
    """Hash both sides, comparing prefix digests chunk by chunk; metrics from the first diff."""
    if r.numel() <= SMALL:
        return _scan_small(r, c, ref, cand, tol)
    shape = tuple(r.shape)
    hr, hc = StreamHasher(ref.dtype, shape), StreamHasher(cand.dtype, shape)
    rf, cf = flat(r), flat(c)
    if ref.dtype == cand.dtype and r.dtype == c.dtype:
        with torch_threads(1):
            same, lo, nan, inf = _identical_prefix(rf, cf, hr, hc)
        if same:
            return _Scan(None, hr.hexdigest(), hc.hexdigest(), nan, inf)
    else:
        lo = 0
    stats = diff_stats(r, c, rtol=tol[0], atol=tol[1], hashers=(hr, hc), start=lo)
    return _Scan(stats, hr.hexdigest(), hc.hexdigest())


@functools.lru_cache(maxsize=4096)
def _header(dtype: str, shape: tuple[int, ...]) -> bytes:
    return f"{dtype}|{shape}|".encode()


def _digest(buffer, dtype: str, shape: tuple[int, ...]) -> str:
    """``compare.hashing.content_hash`` of a tensor's raw ``buffer`` in one call."""
    hasher = xxhash.xxh3_64(_header(dtype, shape))
    hasher.update(buffer)
    return hasher.hexdigest()


def _scan_small(r: torch.Tensor, c: torch.Tensor, ref: Converted, cand: Converted, tol) -> _Scan:
    """The small-pair path: hash each side whole; equal hashes and dtypes settle the pair.

    Same verdicts as the chunked path: equal digests with equal dtypes mean bitwise-identical
    contents (up to an xxh3-64 collision), and only then are NaN/inf counted (one reduction
    when all finite); anything else gets every metric from one single-threaded-caller pass.
    """
    shape = tuple(r.shape)
    c_buf = raw_buffer(c)
    ref_hash, cand_hash = (
        _digest(raw_buffer(r), ref.dtype, shape),
        _digest(c_buf, cand.dtype, shape),
    )
    if ref_hash == cand_hash and ref.dtype == cand.dtype and r.dtype == c.dtype:
        nan, inf = _side_counts(c, c_buf)  # identical bytes: counted where they were read last
        return _Scan(None, ref_hash, cand_hash, nan, inf)
    return _Scan(diff_stats(r, c, rtol=tol[0], atol=tol[1]), ref_hash, cand_hash)


def _identical_prefix(rf, cf, hr: StreamHasher, hc: StreamHasher) -> tuple[bool, int, int, int]:
    """Feed both hashers until their prefix digests differ.

    Returns ``(identical, hashed up to this flat index, NaN count, inf count)``.

    Equal prefix digests mean bitwise-identical prefixes (up to an xxh3-64 collision), so an
    identical pair is settled in one read of each side; NaN/inf are counted on the way.
    """
    n, nan, inf = rf.numel(), 0, 0
    if n == 0:
        hr.update(rf)
        hc.update(cf)
        return True, 0, 0, 0
    for lo in range(0, n, EQUAL_CHUNK):
        rs, cs = rf[lo : lo + EQUAL_CHUNK], cf[lo : lo + EQUAL_CHUNK]
        hr.update(rs)
        hc.update(cs)
        if hr.intdigest() != hc.intdigest():
            return False, lo + rs.numel(), 0, 0
        k_nan, k_inf = _side_counts(cs)  # identical chunks: the one read last (in cache)
        nan, inf = nan + k_nan, inf + k_inf
    return True, n, nan, inf


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _failure_message(mode: str, s: DiffStats, shape, tol) -> str:
    """``torch.testing``-style summary on one line: count, greatest abs/rel diff with index."""
    equality = mode == "equal"
    pct = 100.0 * s.mismatch_count / s.numel if s.numel else 0.0
    allowed = ("", "") if equality else (f" (up to {tol[1]} allowed)", f" (up to {tol[0]} allowed)")
    return (
        f"Tensor-likes are not {'equal' if equality else 'close'}! "
        f"Mismatched elements: {s.mismatch_count} / {s.numel} ({pct:.1f}%). "
        f"Greatest absolute difference: {_fmt(s.max_abs_diff)} at index "
        f"{_unravel(s.max_abs_diff_index, shape)}{allowed[0]}. "
        f"Greatest relative difference: {_fmt(s.max_rel_diff)} at index "
        f"{_unravel(s.max_rel_diff_index, shape)}{allowed[1]}."
    )


def _notes(ref: Converted, cand: Converted, s_nan: tuple[int, int] | None) -> list[str]:
    notes = []
    if ref.dtype != cand.dtype:
        notes.append(f"dtypes differ: reference {ref.dtype}, candidate {cand.dtype}")
    if ref.device != cand.device:
        notes.append(f"devices differ: reference {ref.device}, candidate {cand.device}")
    notes += quant_notes(ref, cand)
    if s_nan is not None and (s_nan[0] or s_nan[1]):
        notes.append(f"NaN count: reference {s_nan[0]}, candidate {s_nan[1]}")
    return notes


def _join(*parts: str) -> str:
    return " ".join(p if p.endswith(".") else p + "." for p in parts if p)


def _shape_mismatch(ref: Converted, cand: Converted, base: dict[str, Any]) -> Comparison:
    r, c = ref.tensor, cand.tensor
    (rn, ri), (cn, ci) = nonfinite_counts(r), nonfinite_counts(c)
    msg = f"shapes differ: reference {tuple(r.shape)}, candidate {tuple(c.shape)}; not broadcast"
    return Comparison(
        status="shape_mismatch",
        ref_nan=rn,
        cand_nan=cn,
        ref_inf=ri,
        cand_inf=ci,
        ref_hash=_hash(r, ref.dtype),
        cand_hash=_hash(c, cand.dtype),
        message=_join(msg, *_notes(ref, cand, None)),
        **base,
    )


def _hash(t: torch.Tensor, dtype: str | None) -> str:
    hasher = StreamHasher(dtype or t.dtype, tuple(t.shape))
    hasher.update(flat(t))
    return hasher.hexdigest()


#: The metrics of a bitwise-identical pair (SQNR +inf: no noise; cosine 1; no mismatch).
_IDENTICAL_METRICS = dict(
    status="equal",
    mismatch_count=0,
    max_abs_diff=0.0,
    max_rel_diff=0.0,
    mean_abs_diff=0.0,
    cosine=1.0,
    sqnr_db=math.inf,
)


def _identical(scan: _Scan, ref: Converted, cand: Converted, base, tol) -> Comparison:
    exact_ulp = None if ulp_spec(ref.tensor.dtype) is None else 0.0
    return Comparison._fast(
        dict(
            **_IDENTICAL_METRICS,
            max_ulp=exact_ulp,
            ref_nan=scan.ref_nan,
            cand_nan=scan.ref_nan,
            ref_inf=scan.ref_inf,
            cand_inf=scan.ref_inf,
            ref_hash=scan.ref_hash,
            cand_hash=scan.cand_hash,
            rtol=tol[0] if base["mode"] == "allclose" else None,
            atol=tol[1] if base["mode"] == "allclose" else None,
            message=_join(*_notes(ref, cand, None)),
            **base,
        )
    )


def _verdict(mode: str, s: DiffStats, same_dtype: bool) -> str:
    if s.max_abs_diff == 0.0 and same_dtype:
        return "equal"
    if mode == "equal":
        return "mismatch"
    return "close" if s.mismatch_count == 0 else "mismatch"


def _from_stats(scan: _Scan, ref: Converted, cand: Converted, base, tol) -> Comparison:
    s = scan.stats
    shape = tuple(ref.tensor.shape)
    mode = base["mode"]
    status = _verdict(mode, s, ref.dtype == cand.dtype)
    parts = []
    if status == "mismatch" and s.mismatch_count:
        parts.append(_failure_message(mode, s, shape, tol))
    elif status == "mismatch":
        parts.append("Tensor-likes are not equal! Values are equal but the dtypes differ")
    if status == "equal":
        parts.append("values equal but not bitwise identical (-0.0 vs 0.0 or NaN payloads)")
    parts += _notes(ref, cand, (s.ref_nan, s.cand_nan) if s.ref_nan or s.cand_nan else None)
    allclose = mode == "allclose"
    return Comparison._fast(  # every field given: the frozen record without its slow __init__
        dict(
            status=status,
            mismatch_count=s.mismatch_count,
            max_abs_diff=s.max_abs_diff,
            max_abs_diff_index=_unravel(s.max_abs_diff_index, shape),
            max_rel_diff=s.max_rel_diff,
            max_rel_diff_index=_unravel(s.max_rel_diff_index, shape),
            mean_abs_diff=s.mean_abs_diff,
            cosine=s.cosine,
            sqnr_db=s.sqnr_db,
            max_ulp=s.max_ulp,
            ref_nan=s.ref_nan,
            cand_nan=s.cand_nan,
            ref_inf=s.ref_inf,
            cand_inf=s.cand_inf,
            ref_hash=scan.ref_hash,
            cand_hash=scan.cand_hash,
            rtol=tol[0] if allclose else None,
            atol=tol[1] if allclose else None,
            message=_join(*parts),
            **base,
        )
    )


def _unusable(ref: Converted, cand: Converted, base: dict[str, Any]) -> Comparison:
    status = "error" if "error" in (ref.status, cand.status) else "skipped"
    msg = _join(*(side.message for side in (ref, cand) if side.status))
    return Comparison(status=status, message=msg, **base)


def compare_tensors(
    reference: Any,
    candidate: Any,
    *,
    mode: str = "equal",
    rtol: float | None = None,
    atol: float | None = None,
    tag: str | None = None,
    tolerances: Tolerances | None = None,
) -> Comparison:
    """Compare a candidate tensor with its reference and return the verdict with all metrics.

    Args:
        reference: the reference side: a torch tensor of any dtype/device/layout, a numpy
            array, an object with ``__dlpack__`` or ``__array__``, or a Python number
            (see :mod:`parity_tracker.compare.convert`).
        candidate: the candidate side, same kinds; must have the reference's shape.
        mode: ``"equal"`` (identical values, dtype and shape) or ``"allclose"``.
        rtol: relative tolerance for ``allclose``; give together with ``atol`` or neither
            (then the per-dtype defaults of ``torch.testing.assert_close`` apply).
        atol: absolute tolerance for ``allclose``, in the tensors' units.
        tag: the tag, used to look up per-tag overrides in ``tolerances``.
        tolerances: per-tag tolerance overrides
            (:class:`parity_tracker.compare.tolerances.Tolerances`).

    Returns:
        A frozen :class:`Comparison`. Its ``status`` is one of :data:`STATUSES`; metrics are
        ``None`` where they do not apply and never NaN; ``message`` says what failed
        (mismatched elements ``k / n (p%)``, greatest absolute and relative difference with
        index and allowed tolerance, differing dtypes/devices/quantization parameters).

    Raises:
        InputError: (a ``ValueError``) for an unknown ``mode`` or when only one of ``rtol``
            and ``atol`` is given. A bad PAIR never raises: it gets status ``error``.
    """
    if mode not in MODES:
        raise InputError(f"unknown comparison mode {mode!r}; use one of {', '.join(MODES)}")
    explicit = check_pair(rtol, atol)
    try:
        fast = _identical_small(reference, candidate, mode, explicit, tag, tolerances)
    except Exception:  # the general path below reports it
        fast = None
    if fast is not None:
        return fast
    ref, cand = to_tensor(reference, "reference"), to_tensor(candidate, "candidate")
    base = _base(mode, ref, cand)
    if ref.status or cand.status:
        return _unusable(ref, cand, base)
    try:
        return _compare(ref, cand, base, explicit, tag, tolerances)
    except Exception as exc:  # never abort a whole check for one pair
        msg = f"comparison failed: {type(exc).__name__}: {exc}"
        return Comparison(status="error", message=msg, **base)


def _identical_small(reference, candidate, mode, explicit, tag, tolerances) -> Comparison | None:
    """The common case in one short step, or ``None`` to take the general path.

    Two plain, contiguous CPU tensors of one numpy-representable dtype and one shape, at most
    :data:`SMALL` elements, with equal content hashes (bitwise identical, up to an xxh3-64
    collision): the record :func:`_identical` would build, without the per-side conversion
    records, scan record and notes (≈ 2/3 of the cost of a 64-element pair).
    """
    dtype, shape = reference.dtype, reference.shape  # AttributeError → general path
    if not (_plain(reference) and _plain(candidate)):
        return None
    if candidate.dtype != dtype or dtype not in _NUMPY_DTYPES or candidate.shape != shape:
        return None
    if reference.numel() > SMALL:
        return None
    r = reference.detach() if reference.requires_grad else reference
    c = candidate.detach() if candidate.requires_grad else candidate
    name, shape = dtype_name(dtype), tuple(shape)
    r_buf, c_buf = numpy_in_place(r), numpy_in_place(c)  # not numpy(): see numpy_in_place
    ref_hash, cand_hash = _digest(r_buf, name, shape), _digest(c_buf, name, shape)
    if ref_hash != cand_hash:
        if dtype.is_floating_point and r.numel() <= SMALL_PAIR:
            return _small_differing(
                r, c, (r_buf, c_buf), (ref_hash, cand_hash), mode, explicit, tag, tolerances
            )
        return None
    nan, inf = _side_counts(c, c_buf)  # identical bytes: the side read last (in cache)
    if mode == "equal":
        tol = (None, None)
    else:
        tol = (tolerances or Tolerances()).resolve(tag, dtype, dtype, *(explicit or ()))
    return identical_record(mode, shape, dtype, tol, ref_hash, (nan, inf))


def identical_record(
    mode: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    tol: tuple[float | None, float | None],
    content: str,
    nonfinite: tuple[int, int],
) -> Comparison:
    """The record :func:`compare_tensors` gives a bitwise-identical plain CPU pair.

    The one owner of that record for the small path (``_identical_small``) and the bulk path
    (:mod:`parity_tracker.compare.batch`). Same values as the general path's ``_identical``.

    Args:
        mode: ``"equal"`` or ``"allclose"``.
        shape: the shape of both sides.
        dtype: the dtype of both sides (a numpy-representable torch dtype).
        tol: ``(rtol, atol)`` resolved for the pair (``(None, None)`` in ``equal`` mode).
        content: the content hash of both sides (``compare.hashing.content_hash``; identical
            bytes, dtype and shape give one hash).
        nonfinite: ``(NaN count, ±inf count)`` of either side (the same bytes).

    Returns:
        A frozen :class:`Comparison` of status ``equal``.
    """
    values = _identical_template(mode, shape, dtype, dtype_name(dtype)).copy()
    values["rtol"], values["atol"] = tol
    values["ref_nan"] = values["cand_nan"] = nonfinite[0]
    values["ref_inf"] = values["cand_inf"] = nonfinite[1]
    values["ref_hash"] = values["cand_hash"] = content
    record = object.__new__(Comparison)
    object.__setattr__(record, "__dict__", values)  # the fresh copy becomes the record's
    return record


@functools.lru_cache(maxsize=1024)
def _identical_template(mode, shape, dtype, name) -> dict[str, Any]:
    """The fields of an identical small pair's record but tolerances, hashes and NaN/inf counts.

    Issue 19: one dict copy per pair instead of building 27 fields twice (``Comparison._fast``
    on a fresh dict); the values are those :func:`_identical` gives. Never mutated.
    """
    values = dict(_DEFAULTS)
    values.update(
        mode=mode,
        numel=math.prod(shape),
        ref_shape=shape,
        cand_shape=shape,
        ref_dtype=name,
        cand_dtype=name,
        ref_device="cpu",
        cand_device="cpu",
        **_IDENTICAL_METRICS,
        max_ulp=None if ulp_spec(dtype) is None else 0.0,
        message="",
    )
    return values


_NO_OVERRIDES = Tolerances()  # no tag overrides, no global pair: the per-dtype defaults


@functools.cache
def _finfo(dtype: torch.dtype) -> tuple[float, float]:
    info = torch.finfo(dtype)
    return float(info.eps), float(info.tiny)


def _small_differing(r, c, arrays, hashes, mode, explicit, tag, tolerances) -> Comparison | None:
    """A small differing plain float pair through :func:`compare.small.small_stats`.

    The same record as the general path, bit for bit; ``None`` when that path must run.
    """
    if mode == "equal":
        tol = (0.0, 0.0)
    else:
        tol = (tolerances or _NO_OVERRIDES).resolve(tag, r.dtype, c.dtype, *(explicit or ()))
    stats = small_stats(*arrays, *tol, *_finfo(r.dtype))
    if stats is None:
        return None
    name, shape = dtype_name(r.dtype), tuple(r.shape)
    ref = Converted(tensor=r, dtype=name, device="cpu", shape=shape)
    cand = Converted(tensor=c, dtype=name, device="cpu", shape=shape)
    return _from_stats(_Scan(stats, *hashes), ref, cand, _base(mode, ref, cand), tol)


def _compare(ref, cand, base, explicit, tag, tolerances) -> Comparison:
    if base["mode"] == "equal":
        tol = (0.0, 0.0)
    else:
        tol = (tolerances or Tolerances()).resolve(tag, ref.dtype, cand.dtype, *(explicit or ()))
    r, c = ref.tensor, cand.tensor
    if r.shape != c.shape:
        return _shape_mismatch(ref, cand, base)
    scan = _scan(r, c, ref, cand, tol)
    if scan.stats is None:
        return _identical(scan, ref, cand, base, tol)
    return _from_stats(scan, ref, cand, base, tol)
