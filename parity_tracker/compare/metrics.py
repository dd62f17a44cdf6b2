"""Difference metrics between a reference and a candidate tensor, computed in one chunked pass.

Every metric is a pure function ``f(reference, candidate)`` (the torchmetrics ``functional``
style); they share one engine, :func:`diff_stats`, which walks both tensors in flat chunks of
:data:`CHUNK` elements, converts each chunk into reused float64 (complex128) buffers and
accumulates every metric at once, so a comparison reads each input from memory once and needs
at most ``CHUNK``-sized scratch buffers (no whole-tensor temporaries). Chunks of two real
floating tensors go through :mod:`parity_tracker.compare.fused` (one pass per chunk, sums in
one fixed lane order, an optional compiled loop with the same results); the rest, and the
chunks it refuses (NaN/inf, sums leaving float64), through :class:`DiffAccumulator`'s own path.

Element-wise difference ``d_i`` (the basis of every metric), ``r`` = reference, ``c`` =
candidate, both converted exactly to float64 / complex128 (int64 differences are taken in
int64, so ids ``2**62`` and ``2**62 + 512`` are 512 apart):

- both finite: ``d_i = |c_i − r_i|`` (complex: the modulus of the difference, as
  ``torch.isclose``);
- NaN on both sides, or the same infinity on both sides: ``d_i = 0`` (matched by position);
- otherwise (NaN or inf on one side only, or ``+inf`` vs ``-inf``): ``d_i = +inf``.

So no metric is ever NaN: an unmatched NaN makes ``max_abs_diff`` ``inf`` and points at it.
``-0.0`` vs ``0.0`` has ``d_i = 0`` (``torch.equal`` semantics; their content hashes differ).
Sums for SQNR and cosine run over the positions finite on both sides, kept as ``m·2**k`` and
scaled by a power of two wherever squaring would overflow or underflow float64
(:mod:`parity_tracker.compare.scaled`), so a differing pair never gets SQNR ``+inf`` and two
non-parallel vectors never get cosine ``1.0``, at any magnitude.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from parity_tracker.compare import fused, scaled
from parity_tracker.compare.hashing import StreamHasher
from parity_tracker.compare.scaled import (  # noqa: F401  (float forms re-exported)
    ScaledSum,
    cosine_from_sums,
    scaled_diff_sq,
    scaled_dot,
    scaled_sq,
    sqnr_from_sums,
)
from parity_tracker.compare.ulp import _FILTER_FLOOR, UlpSpec, _ulp_ratio, ulp_spec  # noqa: F401

CHUNK = 1 << 16
"""Elements per chunk: float64 scratch buffers of 512 KiB each stay in the L2/L3 cache."""

INF = math.inf

SMALL = 1 << 20
"""Up to this many elements (with ``workers`` not given) :func:`diff_stats` runs in the calling
thread without touching torch's thread count: worker threads and ``torch.set_num_threads``
(process-wide, tens of µs per call) cost more than the metrics of a small pair."""

SERIAL_CHUNK = 1 << 14
"""Chunk of that small path: below torch's intra-op grain (32 Ki elements) every op runs
serially in the calling thread, without a parallel region's barrier."""


@dataclass(frozen=True)
class DiffStats:
    """All metrics of one same-shape pair (see the module docstring for ``d_i``).

    Attributes:
        numel: number of elements compared.
        mismatch_count: elements with ``d_i > atol + rtol·|r_i|``.
        max_abs_diff: ``max_i d_i`` (0.0 for empty tensors), in the inputs' units.
        max_abs_diff_index: flat (C-order) index of the first maximum, ``None`` if no element
            differs.
        max_rel_diff: ``max_i d_i / |r_i|`` with ``0/0 = 0`` and ``x/0 = inf`` for ``x > 0``.
        max_rel_diff_index: flat index of the first maximum, ``None`` if no element differs.
        mean_abs_diff: ``Σ d_i / n`` (0.0 if empty).
        cosine: see :func:`cosine_from_sums`.
        sqnr_db: see :func:`sqnr_from_sums`.
        max_ulp: see :func:`max_ulp`; ``None`` for integer/bool references.
        ref_nan: NaN count of the reference (complex: either component NaN).
        cand_nan: NaN count of the candidate.
        ref_inf: ±inf count of the reference (complex: a component infinite, none NaN).
        cand_inf: ±inf count of the candidate.
    """

    numel: int
    mismatch_count: int
    max_abs_diff: float
    max_abs_diff_index: int | None
    max_rel_diff: float
    max_rel_diff_index: int | None
    mean_abs_diff: float
    cosine: float | None
    sqnr_db: float | None
    max_ulp: float | None
    ref_nan: int
    cand_nan: int
    ref_inf: int
    cand_inf: int


class DiffAccumulator:
    """Accumulates :class:`DiffStats` over consecutive flat chunks of one pair.

    Args:
        ref_dtype: dtype of the reference chunks (sets the ULP unit and the int64 path).
        cand_dtype: dtype of the candidate chunks.
        chunk: largest chunk that :meth:`add` will get (sizes the scratch buffers).
        rtol: relative tolerance (dimensionless), ``0`` for exact comparison.
        atol: absolute tolerance (inputs' units), ``0`` for exact comparison.
        kernel: real floating chunks through ``fused``'s compiled loop (``None``: when numba
            imports) or its numpy fold (``False``); the results are the same, bit for bit.
    """

    def __init__(
        self,
        ref_dtype: torch.dtype,
        cand_dtype: torch.dtype,
        chunk: int,
        rtol: float = 0.0,
        atol: float = 0.0,
        kernel: bool | None = False,
    ) -> None:
        self.rtol, self.atol = float(rtol), float(atol)
        self.complex = ref_dtype.is_complex or cand_dtype.is_complex
        # exact int64 differences: 64-bit integers on either side (uint64 only against uint64,
        # compared through an order-preserving sign-bit flip); smaller ints are exact in float64
        both_u64 = ref_dtype == cand_dtype == torch.uint64
        self.int64 = not _floaty(ref_dtype) and not _floaty(cand_dtype)
        self.int64 = self.int64 and (both_u64 or torch.int64 in (ref_dtype, cand_dtype))
        self.int64 = self.int64 and (both_u64 or torch.uint64 not in (ref_dtype, cand_dtype))
        self.ulp = ulp_spec(ref_dtype)
        self._size, self._rd = max(chunk, 1), None  # the general path's buffers: on first use
        real = ref_dtype.is_floating_point and cand_dtype.is_floating_point
        self._fold, self._kernel = None, kernel  # issue 19: fetched in the thread that folds
        self._fused = real
        self._tiny = float(torch.finfo(ref_dtype).tiny) if self.ulp else 0.0
        self.n = self.mismatch = 0
        self.nan_r = self.nan_c = self.inf_r = self.inf_c = 0
        self.max_abs, self.max_abs_idx = 0.0, None
        self.max_rel, self.max_rel_idx = 0.0, None
        self.max_qr = 0.0  # greatest d / ulp-scale so far (ULPs × eps, see _ulp_ratio)
        self.sum_abs = 0.0
        self.rr, self.cc, self.rc, self.dd = (ScaledSum() for _ in range(4))

    def _buffers(self) -> None:
        size = self._size
        work = torch.complex128 if self.complex else torch.float64
        self._rd = torch.empty(size, dtype=work)
        self._cd = torch.empty(size, dtype=work)
        self._dc = torch.empty(size, dtype=work) if self.complex else None
        self._d, self._a, self._q = (torch.empty(size, dtype=torch.float64) for _ in range(3))
        self._b = torch.empty(size, dtype=torch.bool)
        self._di = torch.empty(size, dtype=torch.int64) if self.int64 else None
        self._ib = torch.empty(size, dtype=torch.int64) if self.ulp else None
        self._atol_t = torch.tensor(self.atol, dtype=torch.float64)

    def add(self, r: torch.Tensor, c: torch.Tensor, offset: int) -> None:
        """Fold in one chunk: 1-D contiguous CPU slices of equal length starting at ``offset``."""
        n = r.numel()
        if n == 0:
            return
        if self._fused and self._folded(r, c, offset, n):
            return
        if self._rd is None:
            self._buffers()
        rd, cd, d = self._rd[:n], self._cd[:n], self._d[:n]
        rd.copy_(r)
        cd.copy_(c)
        rr, cc = _sq(rd), _sq(cd)
        unmatched = None
        if not (math.isfinite(rr) and math.isfinite(cc)):
            unmatched = self._mask_nonfinite(rd, cd, n)
            rr, cc = _sq(rd), _sq(cd)
        self._abs_diff(r, c, rd, cd, d, n)
        if unmatched is not None:
            d.masked_fill_(unmatched, INF)
        self.n += n
        self._sums(rd, cd, rr, cc)
        top = float(d.max())
        if top == 0.0:  # equal values in this chunk: no rel/ULP/mismatch contribution
            return
        self._noise(rd, cd, d, top, unmatched)
        self.sum_abs += float(d.sum())
        self._track_max(d, top, offset, "abs")
        absr = self._a[:n]
        torch.abs(rd, out=absr)
        rel = self._q[:n]
        torch.div(d, absr, out=rel)
        top_rel = float(rel.max())
        if math.isnan(top_rel):  # 0/0 where both are zero: relative difference 0
            rel.nan_to_num_(nan=0.0, posinf=INF)
            top_rel = float(rel.max())
        self._track_max(rel, top_rel, offset, "rel")
        if top_rel > self.rtol * (1.0 - 1e-12):  # else d <= rtol·|r| <= allowed everywhere
            self._count_mismatch(d, absr, top, n)
        self._ulp(rd, cd, d, rel, top_rel, n, unmatched)

    def _folded(self, r: torch.Tensor, c: torch.Tensor, offset: int, n: int) -> bool:
        """Fold the chunk through :mod:`compare.fused`; False when it must take the general path."""
        best = self.max_qr
        half = math.inf if self.ulp is None else (0.5 * best if best > _FILTER_FLOOR else -1.0)
        bests = (self.max_abs, self.max_rel)
        if self._fold is None:  # per thread (fused.make_fold): workers never share scratch
            self._fold = fused.make_fold(self._size, self._kernel)
        got = self._fold(r, c, (self.rtol, self.atol), half, self._tiny, bests)
        if got is None:
            return False
        self.n += n
        for name in ("rr", "cc", "rc", "dd"):
            getattr(self, name).add(getattr(got, name))
        if got.sabs == 0.0:
            return True
        self.sum_abs += got.sabs
        if got.max_abs_idx >= 0:
            self._keep_max(got.max_abs, offset + got.max_abs_idx, "abs")
        if got.max_rel_idx >= 0:
            self._keep_max(got.max_rel, offset + got.max_rel_idx, "rel")
        self.mismatch += got.mismatch
        self.max_qr = max(best, got.max_qr)
        return True

    def _sums(self, rd: torch.Tensor, cd: torch.Tensor, rr: float, cc: float) -> None:
        """Add Σr², Σc², Σr·c without over/underflow (``compare.scaled``)."""
        rr_s, cc_s = scaled_sq(rd, rr), scaled_sq(cd, cc)
        self.rr.add(*rr_s)
        self.cc.add(*cc_s)
        self.rc.add(*scaled_dot(rd, cd, _dot(rd, cd), rr_s[1] == 0 and cc_s[1] == 0))

    def _noise(self, rd, cd, d, top: float, unmatched) -> None:
        """Add Σd²: infinite for an unmatched NaN/inf, scaled where squares leave float64."""
        if top == INF and unmatched is not None and bool(unmatched.any()):
            self.dd.add(INF)
        elif top == INF:  # c − r overflowed although both are finite
            self.dd.add(*scaled_diff_sq(rd, cd))
        else:
            self.dd.add(*scaled_sq(d, _sq(d)))

    def _mask_nonfinite(self, rd: torch.Tensor, cd: torch.Tensor, n: int) -> torch.Tensor:
        """Count NaN/inf, zero non-finite positions in rd/cd; return the unmatched-position mask."""
        rn, cn = torch.isnan(rd), torch.isnan(cd)
        rf, cf = torch.isfinite(rd), torch.isfinite(cd)
        ri, ci = ~(rf | rn), ~(cf | cn)
        self.nan_r += int(rn.sum())
        self.nan_c += int(cn.sum())
        self.inf_r += int(ri.sum())
        self.inf_c += int(ci.sum())
        both = rf & cf
        matched = both | (rn & cn) | (ri & ci & (rd == cd))
        rd.masked_fill_(~both, 0)
        cd.masked_fill_(~both, 0)
        return ~matched

    def _abs_diff(self, r, c, rd, cd, d, n) -> None:
        if self.complex:
            dc = self._dc[:n]
            torch.sub(cd, rd, out=dc)
            torch.abs(dc, out=d)
            return
        if not self.int64:
            torch.sub(cd, rd, out=d)
            d.abs_()
            return
        di = self._di[:n]
        r, c = _as_int64(r), _as_int64(c)
        torch.sub(c, r, out=di)
        d.copy_(di)
        d.abs_()
        wrapped = torch.gt(c, r) != torch.gt(di, 0)
        if bool(wrapped.any()):  # int64 overflow: |c - r| >= 2**63, float64 is accurate there
            d[wrapped] = (cd - rd).abs()[wrapped]

    def _track_max(self, x: torch.Tensor, top: float, offset: int, which: str) -> None:
        """Keep the greatest value and the flat index of its first occurrence."""
        best = self.max_abs if which == "abs" else self.max_rel
        if top >= best:
            self._keep_max(top, offset + int(torch.argmax(x)), which)

    def _keep_max(self, top: float, index: int, which: str) -> None:
        best = self.max_abs if which == "abs" else self.max_rel
        if top < best:
            return
        if top == best:
            index = min(index, self.max_abs_idx if which == "abs" else self.max_rel_idx)
        if which == "abs":
            self.max_abs, self.max_abs_idx = top, index
        else:
            self.max_rel, self.max_rel_idx = top, index

    def _count_mismatch(self, d: torch.Tensor, absr: torch.Tensor, top: float, n: int) -> None:
        """Count ``d > atol + rtol·|r|`` (torch.isclose's allowed error); absr is overwritten."""
        if top <= self.atol:  # tolerance >= atol everywhere
            return
        # numpy compare + count: half the time of torch's. numpy() is safe here: d, absr and
        # _b are this accumulator's scratch, never a model's tensor (those are read in place)
        above = self._b[:n].numpy()
        if self.rtol == 0.0:
            self.mismatch += int(np.count_nonzero(np.greater(d.numpy(), self.atol, out=above)))
            return
        tol = torch.add(self._atol_t, absr, alpha=self.rtol, out=absr)
        self.mismatch += int(np.count_nonzero(np.less(tol.numpy(), d.numpy(), out=above)))

    def _ulp(self, rd, cd, d, rel, top_rel: float, n: int, unmatched) -> None:
        """Fold the chunk's greatest ULP ratio ``d_i / scale(r_i)`` into ``max_qr``.

        Real pairs skip what cannot raise the maximum: ``scale(r) = 2**e(r)`` for normal ``r``
        (so ``|r| < 2·scale``) and the dtype's ``tiny`` for zero/subnormal ``r`` (``≥ |r|``),
        hence ``ratio_i ≤ 2·rel_i`` everywhere (also after float rounding, which is monotone).
        A chunk with ``2·max rel < max_qr`` is skipped; otherwise only elements with
        ``rel_i ≥ max_qr / 2`` are measured (all of them while ``max_qr`` is 0). Exact: the
        same maximum as measuring every element.
        """
        spec = self.ulp
        if spec is None:
            return
        if self.complex:  # per component: |Δre| / ulp(re_r) and |Δim| / ulp(im_r)
            x = torch.view_as_real(rd).reshape(-1)
            diff = (torch.view_as_real(cd).reshape(-1) - x).abs_()
            q = _ulp_ratio(x, diff, spec, torch.empty_like(x, dtype=torch.int64), diff)
            q = q.reshape(-1, 2).amax(1)
            if unmatched is not None:
                q.masked_fill_(unmatched, INF)
            self.max_qr = max(self.max_qr, float(q.max()))
            return
        best = self.max_qr
        if 2.0 * top_rel < best:
            return
        if best > _FILTER_FLOOR:
            where = torch.nonzero(rel >= 0.5 * best).reshape(-1)
            x, dx = rd[where], d[where]
            q = _ulp_ratio(x, dx, spec, torch.empty_like(x, dtype=torch.int64), dx)
        else:
            q = _ulp_ratio(rd, d, spec, self._ib[:n], self._q[:n])
        if q.numel():
            self.max_qr = max(best, float(q.max()))

    def merge(self, other: DiffAccumulator) -> None:
        """Fold in another accumulator of the same pair (chunks processed elsewhere)."""
        for name in ("n", "mismatch", "nan_r", "nan_c", "inf_r", "inf_c"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.sum_abs += other.sum_abs
        for name in ("rr", "cc", "rc", "dd"):
            getattr(self, name).merge(getattr(other, name))
        self.max_qr = max(self.max_qr, other.max_qr)
        for which in ("abs", "rel"):
            value, index = getattr(other, f"max_{which}"), getattr(other, f"max_{which}_idx")
            best, best_idx = getattr(self, f"max_{which}"), getattr(self, f"max_{which}_idx")
            if value > best or (value == best and index is not None and index < best_idx):
                setattr(self, f"max_{which}", value)
                setattr(self, f"max_{which}_idx", index)

    def result(self) -> DiffStats:
        """The metrics of everything added so far."""
        empty = self.n == 0
        return DiffStats(
            numel=self.n,
            mismatch_count=self.mismatch,
            max_abs_diff=self.max_abs,
            max_abs_diff_index=self.max_abs_idx,
            max_rel_diff=self.max_rel,
            max_rel_diff_index=self.max_rel_idx,
            mean_abs_diff=0.0 if empty else self.sum_abs / self.n,
            cosine=scaled.cosine(self.rc, self.rr, self.cc),
            sqnr_db=scaled.sqnr_db(self.rr, self.dd),
            max_ulp=None if self.ulp is None else self.max_qr / self.ulp.eps,
            ref_nan=self.nan_r,
            cand_nan=self.nan_c,
            ref_inf=self.inf_r,
            cand_inf=self.inf_c,
        )


def _as_int64(x: torch.Tensor) -> torch.Tensor:
    """int64 values with the order (and pairwise differences) of ``x``; uint64 sign-flipped."""
    if x.dtype == torch.uint64:
        return torch.bitwise_xor(x.view(torch.int64), -(2**63))
    return x.to(torch.int64)


def _floaty(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _complex_of(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype.is_complex else torch.complex128


def _sq(x: torch.Tensor) -> float:
    """Σ |x_i|² in float64 (complex: over the real and imaginary parts); see :func:`_dot`."""
    return _dot(x, x)


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    """Σ a_i·b_i in float64 (complex: as real vectors of (re, im) pairs).

    Up to :data:`SERIAL_CHUNK` elements through ``numpy.einsum`` (its own SIMD loop: no BLAS,
    no threads), above through ``torch.dot`` (BLAS, run with one torch thread by
    :func:`diff_stats`). The BLAS ``ddot`` behind ``torch.dot`` uses torch's thread pool once
    it is awake, and on a busy machine waiting for the second thread to be scheduled cost
    ≈ 7 ms per call even at 4 Ki elements (against 6 µs for einsum). Both accumulate in float64.
    """
    if a.is_complex():
        a, b = torch.view_as_real(a).reshape(-1), torch.view_as_real(b).reshape(-1)
    if a.numel() <= SERIAL_CHUNK:  # a, b: the accumulator's float64 scratch copies (numpy())
        return float(np.einsum("i,i->", a.numpy(), b.numpy()))
    return float(torch.dot(a, b))


def flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D contiguous view (or copy, for non-contiguous input) of a CPU tensor."""
    return t.contiguous().reshape(-1)


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the body with ``count`` torch intra-op threads, restoring the previous count after.

    The chunked engine runs each torch op single-threaded and spreads chunks over Python
    threads instead: on a small chunk an intra-op parallel region costs a barrier per op,
    which on a busy 2-core machine costs more than the op itself.
    """
    previous = torch.get_num_threads()
    if previous != count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if previous != count:
            torch.set_num_threads(previous)


def _feed(hashers, r, c, lo, hi) -> None:
    """Hash flat range [lo, hi) of both sides in 1 MiB pieces (in order)."""
    step = max((1 << 20) // max(r.element_size(), 1), 1)
    for k in range(lo, hi, step):
        hashers[0].update(r[k : min(k + step, hi)])
        hashers[1].update(c[k : min(k + step, hi)])


def _run_chunks(acc: DiffAccumulator, r, c, starts, chunk: int) -> DiffAccumulator:
    for lo in starts:
        acc.add(r[lo : lo + chunk], c[lo : lo + chunk], lo)
    return acc


def diff_stats(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    chunk: int = CHUNK,
    hashers: tuple[StreamHasher, StreamHasher] | None = None,
    start: int = 0,
    workers: int | None = None,
) -> DiffStats:
    """All metrics of a same-shape pair in one chunked pass.

    Chunks are spread round-robin over ``workers`` Python threads, each with its own scratch
    buffers (so at most ``workers · 8`` chunk-sized buffers: 4 MiB each at the default chunk)
    and single-threaded torch ops; the calling thread feeds ``hashers`` meanwhile.

    Args:
        reference: dense CPU tensor, any dtype (not quantized), any shape.
        candidate: dense CPU tensor of the same shape, any dtype.
        rtol: relative tolerance of the mismatch count.
        atol: absolute tolerance of the mismatch count.
        chunk: elements per chunk.
        hashers: optional content hashers fed with both tensors from flat index ``start`` on
            (so hashing shares the pass).
        start: first flat index to feed to ``hashers``.
        workers: threads for the metrics; default ``torch.get_num_threads()`` (one, in the
            calling thread with torch's thread count untouched, up to :data:`SMALL` elements).

    Returns:
        :class:`DiffStats`.

    Raises:
        ValueError: if the shapes differ (callers report ``shape_mismatch`` before this).
    """
    if reference.shape != candidate.shape:
        raise ValueError(f"shapes differ: {tuple(reference.shape)} vs {tuple(candidate.shape)}")
    r, c = flat(reference), flat(candidate)
    n = r.numel()
    kernel = None if n >= fused.KERNEL_MIN or fused.kernel_loaded() else False
    if workers is None and n <= SMALL:
        if not (r.dtype.is_floating_point and c.dtype.is_floating_point):  # torch ops: serial
            chunk = min(chunk, SERIAL_CHUNK)  # (the fused fold makes no torch parallel region)
        acc = DiffAccumulator(r.dtype, c.dtype, min(chunk, n), rtol, atol, kernel)
        if hashers is not None:
            _feed(hashers, r, c, start, n)
        return _run_chunks(acc, r, c, range(0, n, chunk), chunk).result()
    workers = torch.get_num_threads() if workers is None else max(int(workers), 1)
    workers = min(workers, -(-n // chunk)) if n else 1
    size = min(chunk, n)
    accs = [DiffAccumulator(r.dtype, c.dtype, size, rtol, atol, kernel) for _ in range(workers)]
    stride = workers * chunk
    with torch_threads(1):
        if workers == 1:
            if hashers is not None:
                _feed(hashers, r, c, start, n)
            _run_chunks(accs[0], r, c, range(0, n, chunk), chunk)
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="parity-metrics") as pool:
                jobs = [
                    pool.submit(_run_chunks, acc, r, c, range(w * chunk, n, stride), chunk)
                    for w, acc in enumerate(accs)
                ]
                if hashers is not None:
                    _feed(hashers, r, c, start, n)
                for job in jobs:
                    job.result()
    for acc in accs[1:]:
        accs[0].merge(acc)
    return accs[0].result()


# --- the metrics as pure functions f(reference, candidate) -----------------------------------


def max_abs_diff(reference: torch.Tensor, candidate: torch.Tensor) -> tuple[float, int | None]:
    """Greatest ``d_i = |c_i − r_i|`` and its flat index (module docstring: NaN/inf rules).

    Source: ``torch.testing._comparison._make_tensor_mismatch_msg`` (greatest absolute
    difference). Returns ``(0.0, None)`` for empty tensors.
    """
    s = diff_stats(reference, candidate)
    return s.max_abs_diff, s.max_abs_diff_index


def max_rel_diff(reference: torch.Tensor, candidate: torch.Tensor) -> tuple[float, int | None]:
    """Greatest ``d_i / |r_i|`` and its flat index; ``0/0 = 0``, ``x/0 = inf`` for ``x > 0``.

    Source: ``torch.testing`` (greatest relative difference, divided by the expected value).
    """
    s = diff_stats(reference, candidate)
    return s.max_rel_diff, s.max_rel_diff_index


def mean_abs_diff(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """``Σ d_i / n`` (mean absolute error, as ``torchmetrics.functional.mean_absolute_error``)."""
    return diff_stats(reference, candidate).mean_abs_diff


def mismatch_count(
    reference: torch.Tensor, candidate: torch.Tensor, *, rtol: float = 0.0, atol: float = 0.0
) -> int:
    """Number of elements with ``d_i > atol + rtol·|r_i|`` (the complement of ``torch.isclose``).

    With ``rtol = atol = 0`` this counts elements that differ (NaN matching NaN by position).
    """
    return diff_stats(reference, candidate, rtol=rtol, atol=atol).mismatch_count


def sqnr_db(reference: torch.Tensor, candidate: torch.Tensor) -> float | None:
    """SQNR in dB: ``10·log10(Σ r_i² / Σ (r_i − c_i)²)``; see :func:`sqnr_from_sums`."""
    return diff_stats(reference, candidate).sqnr_db


def cosine_similarity(reference: torch.Tensor, candidate: torch.Tensor) -> float | None:
    """``Σ r_i c_i / (‖r‖·‖c‖)`` over the flattened tensors; see :func:`cosine_from_sums`."""
    return diff_stats(reference, candidate).cosine


def max_ulp(reference: torch.Tensor, candidate: torch.Tensor) -> float | None:
    """Greatest difference measured in units in the last place (ULP) of the reference dtype.

    Formula: ``max_i |c_i − r_i| / ulp(r_i)`` with ``ulp(x) = 2**e(x) · eps`` for normal ``x``
    (``2**e(x)``, the power of two at or below ``|x|``, read from the exponent field of the
    integer bit pattern of ``x`` widened exactly to float64; ``eps = torch.finfo(dtype).eps``)
    and ``ulp(x) = tiny · eps`` (the subnormal spacing) for zero and subnormal ``x`` of the
    reference dtype; the same as ``numpy.spacing`` for float16/32/64 and extended to bfloat16
    and float8. Not the count of representable values between (the integer bit-pattern
    distance); the two agree when ``r`` and ``c`` lie in one binade. Cross-dtype pairs are
    measured in the reference's ULP. Complex:
    the larger of the real and imaginary parts' ULP distances. ``None`` for integer and bool
    references, where the difference itself is exact.
    """
    return diff_stats(reference, candidate).max_ulp


def nonfinite_counts(tensor: torch.Tensor) -> tuple[int, int]:
    """``(NaN count, ±inf count)`` of one tensor (complex: per element, NaN winning)."""
    if not _floaty(tensor.dtype):
        return 0, 0
    t = flat(tensor)
    if t.dtype.itemsize == 1 or t.dtype in (torch.complex32,):
        t = t.to(torch.float64 if not t.dtype.is_complex else torch.complex128)
    nan = torch.isnan(t)
    return int(nan.sum()), int((~(torch.isfinite(t) | nan)).sum())
