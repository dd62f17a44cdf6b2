"""Small pairs held as bytes and compared in bulk (issue 19, the "columnar" direction).

A module-level eager run of a model of many small modules compares thousands of pairs of a few
hundred bytes. The per-pair comparison (:func:`~parity_tracker.compare.core.compare_tensors`'
small path, with the pair comparer's cache and the snapshot check around it) costs ≈ 12–14 µs a
pair, almost all of it Python and torch call overhead, not bytes. :class:`HeldPairs` instead:

1. :meth:`HeldPairs.add` copies each side's C-order bytes once, when the pair is known (a
   ``ctypes`` char array read at the tensor's ``const_data_ptr``: ≈ 0.35 µs for a small tensor,
   less than a ``clone`` or a ``numpy()`` view; a copy-on-write storage is not materialized); a
   side held as :class:`HeldBytes` since its capture is not copied again. The copies are the
   pair's values of that moment, whatever is written to the tensors later.
2. :meth:`HeldPairs.compare` settles every held pair at once: a pair is identical exactly when
   its two byte strings are equal (one ``memcmp``); the NaN/inf counts of all identical pairs of
   one dtype are proven zero by one ``isfinite`` pass over their joined bytes (otherwise each
   such pair is counted by the per-pair path's own function); each identical pair's content hash
   is xxh3-64 over its header and bytes, the byte stream of
   :func:`~parity_tracker.compare.hashing.content_hash`.
3. Identical pairs get the record the per-pair path gives
   (:func:`~parity_tracker.compare.core.identical_record`, every field); a pair that differs
   gets ``None``, and the caller compares it alone with ``compare_tensors`` on the held values
   (:meth:`HeldPairs.tensors`), exactly as before.

``tests/test_compare_batch.py`` checks every field against ``compare_tensors`` on random pairs.
The caller (``capture.holder.Holder``) bounds what is held (:data:`PENDING_BYTES`,
:data:`PENDING_PAIRS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xxhash

from parity_tracker.compare.core import Comparison, _header, identical_record
from parity_tracker.compare.finite import side_counts
from parity_tracker.compare.hashing import (
    _CHARS,
    _NUMPY_DTYPES,
    bytes_in_place,
    dtype_name,
    numpy_dtype,
)
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.statuses import VALUE_DIFFERS, is_passing

BULK_MAX_BYTES = 4096
"""Largest side (bytes) held; larger pairs are compared at once (their bytes, not the per-pair
overhead, dominate their cost, and holding them would raise peak memory)."""

PENDING_BYTES = 1 << 20
"""Held bytes (both sides) at most before the held pairs are compared (1 MiB; further bounded
by 1/16 of the checker's ``max_resident_bytes``, see ``capture.holder``)."""

PENDING_PAIRS = 2048
"""Held pairs at most before they are compared (bounds the Python objects per held pair)."""

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided
#: the numpy dtypes that are not complex: torch sets a conjugate bit on complex tensors only
#: (``torch._C._set_conj`` of a float tensor fails an internal assert), so a tensor of one of
#: these has none and its ``is_conj()`` need not be read (issue 19: ≈ 0.13 µs a read)
_REAL_DTYPES = frozenset(d for d in _NUMPY_DTYPES if not d.is_complex)


def _readable(t: Any) -> bool:
    """A plain, dense, strided CPU tensor of a numpy dtype whose memory holds its values as is.

    Plain: not a subclass (fake, functional, distributed tensors), not nested; no conjugate or
    negative bit (their memory holds the values before the lazy negation). CPU: the memory is
    read from this process. Strided: sparse and other layouts have no such memory.
    """
    return readable_dtype(t) is not None


def readable_dtype(t: Any) -> torch.dtype | None:
    """``t.dtype`` when ``t`` is :func:`_readable`, else None (one read of the dtype, issue 19).

    The tests of :func:`_readable`, cheapest first; ``is_conj()`` is read only for a complex
    dtype (:data:`_REAL_DTYPES`). ``HeldPairs.add_live`` makes the same tests inline.
    """
    if type(t) not in _PLAIN:
        return None
    dtype = t.dtype
    if (
        dtype in _NUMPY_DTYPES
        and t.layout == _STRIDED
        and t.is_cpu
        and not t.is_nested
        and (dtype in _REAL_DTYPES or not t.is_conj())
        and not t.is_neg()
    ):
        return dtype
    return None


def _bytes(t: torch.Tensor) -> bytes:
    """A copy of the C-order bytes of a :func:`_readable` tensor, as ``bytes``.

    Read through ``const_data_ptr`` (a copy-on-write storage is not materialized, as in
    ``hashing.content_hash_in_place``); a non-contiguous tensor is made contiguous first.
    """
    if not t.is_contiguous():
        t = t.contiguous()
    data = bytes_in_place(t)
    return data if type(data) is bytes else data.raw  # a copy (``.raw``: faster than bytes())


def _copy(t: torch.Tensor, n: int) -> bytes:
    """:func:`_bytes` of a :func:`_readable` tensor known to hold ``n`` bytes (issue 19).

    The ``c_char`` array type of ``n`` bytes is looked up here, not through
    ``bytes_in_place`` (one call and one ``nbytes`` read less per small copy).
    """
    if not t.is_contiguous():
        t = t.contiguous()
    array = _CHARS.get(n)
    if array is None:  # not cached yet (never for 0 bytes)
        data = bytes_in_place(t)
        return data if type(data) is bytes else data.raw
    return array.from_address(t.const_data_ptr()).raw


class HeldBytes:
    """A small tensor's values at one moment: its C-order bytes, dtype and shape (issue 19).

    What the TensorChecker holds, instead of a cloned snapshot, for a small :func:`_readable`
    tensor (at most :data:`BULK_MAX_BYTES`) of a run whose small pairs are compared in bulk
    (``Snapshotter.take`` with ``bytes_max``): one copy of its bytes (:func:`_bytes`), and
    the pair's held bytes when the other side arrives (:meth:`HeldPairs.add`), so those bytes
    are copied once. :meth:`load` rebuilds a new tensor of exactly these values (as
    ``Spilled.load`` does; ``compare.pairing.load`` reads either). Never written.

    Attributes:
        data: the values' bytes, C order (``numel * itemsize`` bytes).
        dtype: the tensor's dtype (one of ``compare.hashing``'s numpy dtypes).
        shape: the tensor's shape.
    """

    __slots__ = ("__weakref__", "data", "dtype", "owner", "shape")

    def __init__(self, data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.data, self.dtype, self.shape = data, dtype, shape
        #: the round of the store that counted it (``capture.store.SmallCopies``), or None
        self.owner: object = None

    @classmethod
    def of(cls, t: torch.Tensor, shape: tuple[int, ...] | None = None) -> HeldBytes:
        """The values of a :func:`_readable` tensor ``t`` now (its bytes copied).

        ``shape``: ``tuple(t.shape)`` when the caller has it (the capture's ``meta``).
        """
        return cls(_bytes(t), t.dtype, tuple(t.shape) if shape is None else shape)

    def load(self, *, to_device: bool = False) -> torch.Tensor:
        """A new contiguous CPU tensor holding these values (``to_device``: CPU already)."""
        array = np.frombuffer(self.data, numpy_dtype(self.dtype)).reshape(self.shape)
        return torch.from_numpy(array.copy())


def holdable(t: Any, limit: int) -> bool:
    """A :func:`_readable` tensor of at most ``limit`` bytes (``HeldBytes.of`` can hold it).

    ``Tensor.nbytes`` is ``numel() * element_size()`` for a strided tensor (torch's docs).
    """
    return _readable(t) and t.nbytes <= limit


class HeldPairs:
    """Small pairs held as bytes until :meth:`compare` settles them together (module docstring).

    A pair whose reference is the ``HeldBytes`` of the last pair held with it, and whose
    candidate's bytes equal that pair's (a tensor captured again, unchanged, under another
    tag), is held as that pair's alias (:meth:`alias`; ``dedupe``, issue 19).

    Attributes:
        keys: the caller's key of each held pair, in the order they were added.
        nbytes: bytes held (both sides).
    """

    #: False: every pair is held and settled on its own (tests compare the two)
    dedupe = True

    def __init__(self) -> None:
        self.keys: list[Any] = []
        self.nbytes = 0
        self._items: list[tuple[str | None, torch.dtype, tuple[int, ...], bytes, bytes]] = []
        #: index of an alias (:meth:`alias`) -> index of the pair whose bytes it holds
        self._aliases: dict[int, int] = {}
        #: id of a reference's held bytes -> index of the last pair held with them
        self._last: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def add(self, key: Any, tag: str | None, ref: Any, cand: Any) -> bool:
        """Hold a copy of both sides' values of now; False (nothing held) for other pairs.

        Held: two :func:`_readable` tensors of one dtype and one shape (any strides), at most
        :data:`BULK_MAX_BYTES` bytes each; either side may instead be a :class:`HeldBytes`
        (its bytes are held as they are, not copied again).

        Args:
            key: anything; returned in :attr:`keys` (the checker's group and capture index).
            tag: the pair's tag (its per-tag tolerance override in ``allclose`` mode).
            ref: the reference value.
            cand: the candidate value.
        """
        if type(ref) is HeldBytes or type(cand) is HeldBytes:
            return self._add_held(key, tag, ref, cand)
        if not (_readable(ref) and _readable(cand)):
            return False
        dtype, shape = ref.dtype, ref.shape
        if cand.dtype != dtype or cand.shape != shape:
            return False
        if ref.numel() * ref.element_size() > BULK_MAX_BYTES:
            return False
        rb, cb = _bytes(ref), _bytes(cand)
        self._items.append((tag, dtype, tuple(shape), rb, cb))
        self.keys.append(key)
        self.nbytes += len(rb) + len(cb)
        return True

    def _add_held(self, key: Any, tag: str | None, ref: Any, cand: Any) -> bool:
        """:meth:`add` of a pair with a :class:`HeldBytes` side (or two)."""
        if type(cand) is not HeldBytes:  # the common case: one side held, the other live
            return self.add_live(key, tag, ref, cand, True)
        if type(ref) is not HeldBytes:
            return self.add_live(key, tag, cand, ref, False)
        # both sides held as bytes since their capture: nothing to copy
        if ref.dtype != cand.dtype or ref.shape != cand.shape:
            return False
        if len(ref.data) > BULK_MAX_BYTES:
            return False
        self._items.append((tag, ref.dtype, ref.shape, ref.data, cand.data))
        self.keys.append(key)
        self.nbytes += len(ref.data) + len(cand.data)
        return True

    def add_live(
        self,
        key: Any,
        tag: str | None,
        held: HeldBytes,
        live: Any,
        live_is_cand: bool,
        shape: tuple[int, ...] | None = None,
    ) -> bool:
        """:meth:`add` of a pair of one :class:`HeldBytes` side and one live tensor (issue 19).

        The one path of the usual small pair (the capture's holder calls it directly): the
        live side is held when it is :func:`_readable` (its tests inline, in the same order;
        as :func:`readable_dtype`) with ``held``'s dtype
        and shape; its C-order bytes are copied now (:func:`_copy`, inline). A candidate equal
        byte for byte to the last one held with the same reference bytes is held as that
        pair's alias (:meth:`_same_as_last`).

        Args:
            key: as for :meth:`add` (returned in :attr:`keys`).
            tag: as for :meth:`add`.
            held: the side held as bytes since its capture.
            live: the other side, as captured (any object: anything but a readable tensor of
                ``held``'s dtype and shape is not held).
            live_is_cand: whether ``live`` is the candidate (else the reference).
            shape: ``tuple(live.shape)`` when the caller has it (the capture's ``meta``).

        Returns:
            True when the pair is held; False (nothing held) otherwise.
        """
        data = held.data
        n = len(data)
        dtype = held.dtype  # a numpy dtype (HeldBytes of a readable tensor)
        if (
            n > BULK_MAX_BYTES
            or type(live) not in _PLAIN  # _readable's tests, in its order
            or live.dtype != dtype
            or live.layout != _STRIDED
            or not live.is_cpu
            or live.is_nested
            or (dtype not in _REAL_DTYPES and live.is_conj())
            or live.is_neg()
            or (live.shape if shape is None else shape) != held.shape
        ):
            return False
        src = live if live.is_contiguous() else live.contiguous()
        array = _CHARS.get(n)  # _copy(live, n), inline: as many bytes as held's
        new = _bytes(src) if array is None else array.from_address(src.const_data_ptr()).raw
        shape = held.shape
        if not live_is_cand:
            self._items.append((tag, dtype, shape, new, data))
        elif self.dedupe and self._same_as_last(key, tag, data, new, dtype, shape):
            return True
        else:
            self._items.append((tag, dtype, shape, data, new))
        self.keys.append(key)
        self.nbytes += 2 * n
        return True

    def _same_as_last(
        self, key: Any, tag: str | None, ref: bytes, cand: bytes, dtype: torch.dtype, shape: tuple
    ) -> bool:
        """Hold the pair ``(ref, cand)`` as an alias of the last pair held with ``ref``'s bytes.

        ``ref``: a reference's ``HeldBytes.data``. Only when that pair's candidate bytes are
        ``cand``, byte for byte, and its dtype and shape are ``dtype`` and ``shape``: the same
        values, so the same record (issue 19: a re-captured tensor, paired again with the same
        reference snapshot). Otherwise ``ref`` is noted as last held with the pair about to be
        added (the caller adds it).
        """
        last = self._last
        rid = id(ref)  # alive in the held items: an id never reused meanwhile
        i = last.get(rid)
        if i is not None:
            item = self._items[i]
            if item[4] == cand and item[1] == dtype and item[2] == shape:
                self.alias(key, tag, i)
                return True
        last[rid] = len(self._items)
        return False

    def alias(self, key: Any, tag: str | None, i: int) -> None:
        """Hold, under ``key`` and ``tag``, a pair of the very values of held pair ``i``.

        For a pair whose two sides hold held pair ``i``'s values, byte for byte (issue 19,
        :meth:`_same_as_last`): its bytes are pair ``i``'s (nothing copied) and
        :meth:`compare` gives it pair ``i``'s record (or ``None`` with it), with the tolerances
        resolved for its own tag (also :meth:`alias_record`).
        """
        _, dtype, shape, rb, cb = self._items[i]
        self._aliases[len(self._items)] = i
        self._items.append((tag, dtype, shape, rb, cb))
        self.keys.append(key)

    def alias_record(
        self, i: int, alone: dict[int, Comparison], mode: str, tolerances: Tolerances | None
    ) -> Comparison | None:
        """The record of alias ``i`` from its pair's, when that pair was compared alone.

        ``alone``: the caller's records of the pairs it compared alone (those :meth:`compare`
        gave ``None``), by index. The record is reused when the pair's values were compared
        (a passing or value-differing status: an ``error`` names its own tag) and the
        alias's tag resolves the same tolerances (``allclose``); otherwise None (compare the
        alias alone too: :meth:`tensors`).
        """
        j = self._aliases.get(i)
        first = None if j is None else alone.get(j)
        if first is None or not (is_passing(first.status) or first.status in VALUE_DIFFERS):
            return None
        return _reused(first, mode, tolerances or Tolerances(), self._items[i], rebuild=False)

    def tensors(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Held pair ``i`` as two new tensors (its values when it was added; contiguous)."""
        _, dtype, shape, rb, cb = self._items[i]
        return HeldBytes(rb, dtype, shape).load(), HeldBytes(cb, dtype, shape).load()

    def compare(self, mode: str, tolerances: Tolerances | None = None) -> list[Comparison | None]:
        """The record of each bitwise-identical held pair, ``None`` for each pair that differs.

        Args:
            mode: ``"equal"`` or ``"allclose"``.
            tolerances: the per-tag overrides, as given to ``compare_tensors`` (``None``: none).

        Returns:
            ``out[i]`` for the ``i``-th pair added: the :class:`Comparison` that
            ``compare_tensors(ref, cand, mode=mode, tag=tag, tolerances=tolerances)`` returned
            for the values held, field for field, when they are bitwise identical; ``None``
            when they are not (the caller compares them alone, :meth:`tensors`).
        """
        tol = tolerances or Tolerances()
        finite = self._finite()
        out: list[Comparison | None] = []
        aliases = self._aliases
        headers: dict[tuple, bytes] = {}  # one header per (dtype, shape) (issue 19)
        for i, item in enumerate(self._items):
            if aliases and i in aliases:  # the values of an earlier pair: its record
                out.append(_reused(out[aliases[i]], mode, tol, item))
                continue
            tag, dtype, shape, rb, cb = item
            if rb != cb:  # differs: compared alone by the caller
                out.append(None)
                continue
            header = headers.get((dtype, shape))
            if header is None:
                header = headers[dtype, shape] = _header(dtype_name(dtype), shape)
            content = xxhash.xxh3_64_hexdigest(header + rb)
            counts = (0, 0) if finite[dtype] else side_counts(self.tensors(i)[1])
            pair = (None, None) if mode == "equal" else tol.resolve(tag, dtype, dtype)
            out.append(identical_record(mode, shape, dtype, pair, content, counts))
        return out

    def _finite(self) -> dict[torch.dtype, bool]:
        """Per dtype: True when every held candidate value is finite (one pass over them all)."""
        by_dtype: dict[torch.dtype, list[bytes]] = {}
        aliases = self._aliases
        for i, (_, dtype, _, _, cb) in enumerate(self._items):
            if i not in aliases:  # an alias holds an earlier pair's bytes
                by_dtype.setdefault(dtype, []).append(cb)
        finite = {}
        for dtype, chunks in by_dtype.items():
            if dtype.is_floating_point or dtype.is_complex:
                values = np.frombuffer(b"".join(chunks), numpy_dtype(dtype))
                finite[dtype] = bool(np.isfinite(values).all())
            else:
                finite[dtype] = True
        return finite


def _reused(
    first: Comparison | None, mode: str, tol: Tolerances, item: tuple, rebuild: bool = True
) -> Comparison | None:
    """The record of an alias (held ``item``) of a pair whose record is ``first``.

    ``None`` when ``first`` is (the pair differs: the caller compares it alone). Same values,
    so the same record; only the tolerances (``allclose``) may differ by tag: then, with
    ``rebuild``, the record of an identical pair is
    :func:`~parity_tracker.compare.core.identical_record` with the alias's own tolerances,
    else None.
    """
    if first is None:
        return None
    tag, dtype, shape = item[0], item[1], item[2]
    pair = (None, None) if mode == "equal" else tol.resolve(tag, dtype, dtype)
    if pair == (first.rtol, first.atol):
        return first
    if not rebuild:
        return None
    counts = (first.ref_nan, first.ref_inf)
    return identical_record(mode, shape, dtype, pair, first.ref_hash, counts)


def compare_small(
    refs: Sequence[torch.Tensor],
    cands: Sequence[torch.Tensor],
    tags: Sequence[str | None],
    mode: str,
    tolerances: Tolerances | None = None,
) -> list[Comparison | None]:
    """:meth:`HeldPairs.compare` of the pairs ``zip(refs, cands)`` (tags ``tags``).

    Raises:
        ValueError: a pair :meth:`HeldPairs.add` does not hold (another dtype, shape, device,
            layout or size class); check with :func:`bulk_eligible`.
    """
    held = HeldPairs()
    for i, (r, c, tag) in enumerate(zip(refs, cands, tags, strict=True)):
        if not held.add(i, tag, r, c):
            raise ValueError(f"compare_small: pair {i} ({tag}) cannot be held; see bulk_eligible")
    return held.compare(mode, tolerances)


def bulk_eligible(ref: Any, cand: Any) -> bool:
    """Whether :meth:`HeldPairs.add` holds the pair (same test, nothing copied)."""
    return (
        _readable(ref)
        and _readable(cand)
        and cand.dtype == ref.dtype
        and cand.shape == ref.shape
        and ref.numel() * ref.element_size() <= BULK_MAX_BYTES
    )
