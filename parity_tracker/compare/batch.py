"""Small pairs compared in bulk: one bitwise check per dtype instead of one comparison per pair.

Issue 19, the "columnar" direction (``benchmarks/README.md``, round 4). A module-level eager run
of a model of many small modules compares thousands of pairs of a few hundred bytes; the
per-pair comparison (:func:`~parity_tracker.compare.core.compare_tensors`' small path: checks,
two ``numpy()`` reads, two hashes, a finiteness reduction, the record) costs ≈ 14 µs a pair, far
more than the bytes. :func:`compare_small` takes the pairs of a whole check at once:

1. per dtype, both sides' values are flattened into one buffer each (``torch``'s
   ``flatten_dense_tensors``: one C++ loop, C order, non-contiguous views made contiguous);
2. one bitwise equality of the two buffers settles every pair of the dtype when it holds;
   otherwise each pair's two content hashes are compared (the rule of the per-pair small path:
   equal xxh3-64 digests with equal dtypes mean bitwise-identical contents);
3. each identical pair's content hash is xxh3-64 over its header and its slice of the buffer
   (:func:`~parity_tracker.compare.hashing.content_hash`'s byte stream, so the same digest);
4. NaN/inf counts: one finiteness pass over the candidate buffer proves most dtypes all finite
   (counts 0); otherwise each identical pair is counted by the per-pair path's own function.

Identical pairs get the record the per-pair path gives
(:func:`~parity_tracker.compare.core.identical_record`, every field); a pair that differs gets
``None`` and the caller compares it with ``compare_tensors`` exactly as before. Tests compare
every field with ``compare_tensors`` on random pairs (``tests/test_compare_batch.py``).

The caller holds the pairs until the check (``capture.holder.Holder``): values nobody writes
(:func:`private_copy`), at most :data:`PENDING_BYTES` / :data:`PENDING_PAIRS` at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xxhash

from parity_tracker.compare.core import Comparison, _header, identical_record
from parity_tracker.compare.finite import _all_finite, side_counts
from parity_tracker.compare.hashing import _NUMPY_DTYPES, dtype_name
from parity_tracker.compare.tolerances import Tolerances

BULK_MAX_BYTES = 4096
"""Largest side (bytes) held for the bulk comparison; larger pairs are compared at once (their
bytes, not the per-pair overhead, dominate, and holding them would raise peak memory)."""

PENDING_BYTES = 1 << 20
"""Bytes of held pairs (both sides) at most before they are compared (1 MiB; further bounded by
1/16 of the checker's ``max_resident_bytes``, see ``capture.holder``)."""

PENDING_PAIRS = 2048
"""Pairs held at most before they are compared (bounds the Python objects per held pair)."""

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_FLATTEN = getattr(torch._C._nn, "flatten_dense_tensors", None)


def bulk_eligible(ref: Any, cand: Any) -> bool:
    """Whether a pair may be held for :func:`compare_small`.

    Two plain (not subclassed, not nested, not quantized) strided CPU tensors of one
    numpy-representable dtype and one shape, without a conjugate or negative bit, at most
    :data:`BULK_MAX_BYTES` bytes each. Any layout of strides (contiguous or not).
    """
    if type(ref) not in _PLAIN or type(cand) not in _PLAIN:
        return False
    if ref.is_nested or cand.is_nested:  # first: numel() of a nested tensor raises
        return False
    dtype = ref.dtype
    return (
        cand.dtype == dtype
        and dtype in _NUMPY_DTYPES
        and ref.shape == cand.shape
        and ref.numel() * ref.element_size() <= BULK_MAX_BYTES
        and ref.is_cpu
        and cand.is_cpu
        and ref.layout == torch.strided
        and cand.layout == torch.strided
        and not (ref.is_conj() or cand.is_conj() or ref.is_neg() or cand.is_neg())
    )


def private_copy(t: torch.Tensor) -> torch.Tensor:
    """A detached copy of ``t`` that no later write to ``t`` reaches (same strides, same bytes)."""
    if t.requires_grad or type(t) is not torch.Tensor:
        t = t.detach()
    return t.clone()


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors' values, each in C order, one after the other in one 1-D tensor."""
    if _FLATTEN is not None:
        return _FLATTEN(tensors)
    return torch.cat([t.reshape(-1) for t in tensors])  # pragma: no cover (older torch)


def compare_small(
    refs: Sequence[torch.Tensor],
    cands: Sequence[torch.Tensor],
    tags: Sequence[str | None],
    mode: str,
    tolerances: Tolerances | None = None,
) -> list[Comparison | None]:
    """The records of the bitwise-identical pairs among many small pairs; ``None`` for the rest.

    Args:
        refs: reference tensors, each :func:`bulk_eligible` with its candidate.
        cands: candidate tensors, ``cands[i]`` paired with ``refs[i]`` (same dtype and shape).
        tags: the tag of each pair (its per-tag tolerance override in ``allclose`` mode).
        mode: ``"equal"`` or ``"allclose"``.
        tolerances: the per-tag overrides, as given to ``compare_tensors`` (``None``: none).

    Returns:
        ``out[i]``: the :class:`Comparison` that ``compare_tensors(refs[i], cands[i], mode=mode,
        tag=tags[i], tolerances=tolerances)`` returns, field for field, when the pair is
        bitwise identical; ``None`` when it is not (the caller compares it alone).

    Raises:
        RuntimeError / TypeError: from torch if a pair breaks the preconditions; the caller
        then compares every pair alone.
    """
    out: list[Comparison | None] = [None] * len(refs)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, r in enumerate(refs):
        by_dtype.setdefault(r.dtype, []).append(i)
    tol = tolerances or Tolerances()
    for dtype, index in by_dtype.items():
        _compare_dtype(index, refs, cands, tags, mode, tol, dtype, out)
    return out


def _compare_dtype(index, refs, cands, tags, mode, tol, dtype, out) -> None:
    """:func:`compare_small` for the pairs ``index`` of one dtype (fills ``out``)."""
    rs, cs = [refs[i] for i in index], [cands[i] for i in index]
    for r, c in zip(rs, cs, strict=True):  # the preconditions that decide a record's fields
        if c.dtype != dtype or c.shape != r.shape:
            raise TypeError("compare_small: a pair of different dtypes or shapes")
    flat_c = _flatten(cs)
    rb = _flatten(rs).numpy().view(np.uint8)
    cb = flat_c.numpy().view(np.uint8)
    same = bool(np.array_equal(rb, cb))  # every pair of this dtype identical: one check
    floaty = dtype.is_floating_point or dtype.is_complex
    finite = not floaty or bool(_all_finite(flat_c))  # one pass: NaN/inf counts all 0
    mr, mc = memoryview(rb), memoryview(cb)
    name, size, start = dtype_name(dtype), flat_c.element_size(), 0
    for i, c in zip(index, cs, strict=True):
        shape = tuple(c.shape)
        end = start + c.numel() * size
        h = xxhash.xxh3_64(_header(name, shape))
        h.update(mr[start:end])
        content = h.hexdigest()
        if not same:
            hc = xxhash.xxh3_64(_header(name, shape))
            hc.update(mc[start:end])
            if hc.hexdigest() != content:  # differs: compared alone by the caller
                start = end
                continue
        start = end
        counts = (0, 0) if finite else side_counts(c)
        pair = (None, None) if mode == "equal" else tol.resolve(tags[i], dtype, dtype)
        out[i] = identical_record(mode, shape, dtype, pair, content, counts)
