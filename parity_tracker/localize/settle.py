"""Settle an aligned pair of identical op outputs from the digests taken when the ops ran.

Issue 19. Each CPU op output is held with a digest taken when its op ran
(``capture.op_store.guarded``): its ``content_hash`` (xxh3-64 of dtype, shape and C-order
bytes) or, for a dense non-contiguous output, its ``storage_digest`` (xxh3-64 of the bytes its
elements occupy, in storage order). :func:`settled` gives the ``equal`` record of a pair whose
two digests agree, whose metadata agree, and whose two sides still hold those bytes — without
the comparison's per-side copies and reads:

- a reference spilled *sealed* (``capture.op_store._seal``: the bytes written to its file hashed
  to its digest right before the write) is not read back; a resident reference is hashed again
  now (a write through a raw pointer reaches a held tensor unseen by anything but a hash: issue
  13's rule, object/version/address/layout AND hash) — only when not contiguous: for a resident
  contiguous pair ``compare_tensors`` itself is as cheap (it hashes both sides, as here);
- the candidate is always hashed again now;
- a dense non-contiguous pair with the same strides is proved identical by its storage digests
  (the same strides map each element to the same span position on both sides) and made
  contiguous once, for the record's content hash, instead of once per side.

Equal xxh3-64 digests of equally laid-out bytes are the evidence on which ``compare_tensors``
settles every ``equal`` pair (``compare.core._identical_small`` and ``_identical_prefix``): the
same accepted risk, an xxh3-64 collision (2**-64). The record is
:func:`parity_tracker.compare.core.identical_record`, the one ``compare_tensors`` gives such a
pair. Anything else returns None and the pair is compared (and checked) as before.
"""

from __future__ import annotations

import ctypes

import torch

from parity_tracker.capture.op_store import Held
from parity_tracker.capture.store import span_elements
from parity_tracker.compare import Comparison
from parity_tracker.compare.core import identical_record
from parity_tracker.compare.finite import side_counts
from parity_tracker.compare.hashing import (
    _NUMPY_DTYPES,
    _is_cow,
    content_hash,
    content_hash_in_place,
    flat_view,
    storage_digest,
)
from parity_tracker.compare.tolerances import Tolerances


def settled(rh: Held, ch: Held, mode: str, tolerances: Tolerances, tag: str) -> Comparison | None:
    """The ``equal`` record of an aligned identical pair of held op outputs, or None.

    Args:
        rh: the reference's held output (``capture.op_store.Held``).
        ch: the candidate's held output.
        mode: ``"equal"`` or ``"allclose"``.
        tolerances: the session's tolerance table (the record's ``rtol``/``atol`` in
            ``allclose``, resolved as ``compare_tensors`` resolves them).
        tag: the op output's tag (tolerance overrides).

    Returns:
        The :class:`~parity_tracker.compare.Comparison` ``compare_tensors`` gives the pair, or
        None when the digests, dtypes, shapes or strides differ, a side's bytes changed since
        its op ran, a spilled reference is not sealed or its file is gone, or a side is not a
        plain CPU tensor of a dtype numpy reads (then the caller compares as before).
    """
    held = rh.digest
    if held is None or held != ch.digest or type(held) is not type(ch.digest):
        return None
    if rh.dtype != ch.dtype or rh.dtype not in _NUMPY_DTYPES or rh.size != ch.size:
        return None
    ordered = isinstance(held, str)  # a content hash; else a storage digest
    if not ordered and rh.stride != ch.stride:
        return None
    ref_t = rh.tensor
    if ref_t is None and not _sealed_file(rh):
        return None
    if ordered and ref_t is not None:  # compare_tensors hashes both sides as cheaply (≈ 8 µs)
        return None
    cand_t = ch.get()
    if not (_plain(cand_t) and _unchanged(cand_t, held)):
        return None
    if ref_t is not None and not (_plain(ref_t) and _unchanged(ref_t, held)):
        return None
    content = held if ordered else content_hash(cand_t)
    tol = (None, None)
    if mode != "equal":  # as ``compare_tensors`` resolves it for this pair
        tol = (tolerances or Tolerances()).resolve(tag, cand_t.dtype, cand_t.dtype)
    flat = _span(cand_t)  # the same elements, in storage order: counts do not depend on it
    nonfinite = side_counts(flat)
    return identical_record(mode, tuple(cand_t.shape), cand_t.dtype, tol, content, nonfinite)


def _sealed_file(h: Held) -> bool:
    """A spilled capture sealed at its write, in a spill file still linked and uncut."""
    spilled = h.spilled
    return h.sealed and spilled is not None and spilled.pack is not None and spilled.pack.intact()


def _plain(t: torch.Tensor) -> bool:
    """A plain CPU tensor numpy may read without copying a shared (copy-on-write) buffer."""
    return (
        type(t) is torch.Tensor
        and t.is_cpu
        and t.numel() > 0
        and not t.requires_grad
        and not _is_cow(t)
    )


def _unchanged(t: torch.Tensor, held: str | int) -> bool:
    """``t`` hashes NOW as its op's output hashed (the digest kinds of ``guarded``)."""
    if isinstance(held, str):
        return t.is_contiguous() and content_hash_in_place(t) == held
    return storage_digest(t) == held


def _span(t: torch.Tensor) -> torch.Tensor:
    """A dense tensor's elements as a contiguous 1-D view of its storage span (no copy)."""
    if t.is_contiguous():
        return flat_view(t)
    return torch.as_strided(t, (t.numel(),), (1,), t.storage_offset())


def _libc_memcmp() -> ctypes._CFuncPtr | None:
    """The C library's ``memcmp`` (None where ``ctypes`` cannot load it: never relied on)."""
    try:
        fn = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_MEMCMP = _libc_memcmp()
#: elements from which :func:`same_bytes` beats ``torch.equal`` on a float32 pair (its ≈ 3.5 µs
#: of checks against ``torch.equal``'s ≈ 6 GB/s; measured 2026-12-01, one thread)
SAME_BYTES_MIN = 4096
_TENSOR, _STRIDED = torch.Tensor, torch.strided


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two views of one dtype, shape and strides hold byte-identical elements NOW.

    Issue 19: the op recorder's input evidence compares the parameters (and other inputs) of
    every op pair; ``torch.equal`` reads a float32 pair at ≈ 6 GB/s, ``memcmp`` ≈ 8× faster
    (1 M elements: 650 vs 86 µs, one thread). Each view's storage span (its elements from the
    first to the last, read in place through ``const_data_ptr``: a copy-on-write buffer is not
    given a copy) is compared byte for byte; with the same strides every element sits at the
    same span offset on both sides, so identical spans mean identical elements. Identical bytes
    of one dtype are equal by every rule of the comparison (``equal``: the same values, NaN
    at the same positions; ``allclose`` follows). False is not a verdict: the spans differ
    somewhere (perhaps only in bytes between a strided view's elements, or ``-0.0`` vs
    ``0.0``), or the pair is not two plain dense CPU tensors (another device, a subclass, a
    conjugate/negative view, quantized, empty), or ``memcmp`` is unavailable; the caller then
    compares as before.

    Args:
        a: the reference side (any tensor; only plain CPU ones of one layout are compared).
        b: the candidate side (likewise).

    Returns:
        True only when both spans hold the same bytes.
    """
    if _MEMCMP is None or type(a) is not _TENSOR or type(b) is not _TENSOR:
        return False
    if a.layout != _STRIDED or b.layout != _STRIDED or not (a.is_cpu and b.is_cpu):
        return False
    shape, stride = a.shape, a.stride()
    if a.dtype != b.dtype or shape != b.shape or stride != b.stride():
        return False
    if a.is_quantized or a.is_neg() or b.is_neg() or a.is_conj() or b.is_conj():
        return False
    numel = a.numel()
    if numel == 0:
        return False
    span = numel if a.is_contiguous() else span_elements(tuple(shape), stride)
    return _MEMCMP(a.const_data_ptr(), b.const_data_ptr(), span * a.element_size()) == 0
