"""The op recorder's bounded store: op outputs held copy-on-write, spilled past a budget.

Split out of :mod:`parity_tracker.capture.ops` (the recorder), which holds every output it
records in an :class:`OpStore`: a :class:`~parity_tracker.capture.store.BoundedStore` keyed by
storage address (``_ptr``, read without un-sharing a copy-on-write storage), so a module
snapshot of the same buffer can borrow its spill (``OpStore.lend``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from parity_tracker.capture.address_ranges import AddressRanges
from parity_tracker.capture.spill_pool import PooledSpillDir
from parity_tracker.capture.store import BoundedStore, Spilled, span_elements
from parity_tracker.compare.convert import tensor_version
from parity_tracker.compare.hashing import content_hash_in_place, digestible, storage_digest


def _capturable(t: Any) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.layout == torch.strided
        and not t.is_meta
        and not t.is_quantized
    )


def _ptr(t: torch.Tensor) -> int:
    """The data pointer of ``t``'s storage (0 for an empty storage or a non-strided tensor).

    A wrapper tensor subclass (``DTensor``, ...) has no storage of its own (touching it raises
    "invalid python storage"): 0, and its captures are private copies (:func:`_own`).
    """
    # issue 19: an exact ``torch.Tensor`` is no subclass, so no wrapper subclass (the same
    # conditions as below, without ``is_traceable_wrapper_subclass``'s Python call)
    if type(t) is _TENSOR:
        if t.layout != _STRIDED or t.is_meta or t.is_quantized:
            return 0
    elif not _capturable(t) or is_traceable_wrapper_subclass(t):
        return 0
    storage = t.untyped_storage()
    if not storage.nbytes():
        return 0
    # issue 19: ``torch._C._data_address`` reads the same address without materializing a
    # copy-on-write storage (``TensorChecker`` snapshots are ``torch._lazy_clone``s): the
    # storage's ``data_ptr()`` copied the storage, which moved it to a new address, so the
    # producer of every snapshotted tensor was lost and the store's index went stale.
    return _DATA_ADDRESS(t) if _DATA_ADDRESS is not None else storage.data_ptr()


_TENSOR, _STRIDED = torch.Tensor, torch.strided
_DATA_ADDRESS = getattr(torch._C, "_data_address", None)


def _own(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached; a private copy for a wrapper subclass, which copy-on-write cannot track."""
    t = t.detach()
    # issue 19: an exact ``torch.Tensor`` is no wrapper subclass (no Python call to ask)
    return t if type(t) is _TENSOR or not is_traceable_wrapper_subclass(t) else t.clone()


def guarded(t: torch.Tensor) -> tuple[torch.Tensor, str | None]:
    """What the recorder holds of an op output ``t``, and its content hash (or None).

    Captures are references, so a write that bypasses dispatch after the op ran (through a
    ``.numpy()`` or DLPack view, ctypes, ``data_ptr()``) changes them unseen by
    :meth:`OpStore.before_write`. So a CPU output is held with its
    :func:`~parity_tracker.compare.hashing.content_hash` taken now (xxh3-64, read in place),
    which ``localize.op_compare`` checks against the hash its comparison computes: bytes that
    changed are reported as an ``error``, never compared (issue 13's rule). An output on
    another device (hashing it would copy it to the CPU) or a wrapper subclass (no storage of
    its own) is held as a private copy instead, which nobody else can write: no hash.

    A dense CPU output that is not contiguous (an elementwise op on a transposed input keeps
    its strides) is hashed in storage order instead
    (:func:`~parity_tracker.compare.hashing.storage_digest`, an ``int``, no contiguous copy),
    and checked by hashing it again the same way.

    Returns:
        ``(tensor, digest)``: ``t`` detached with its hash (``str``: the comparison's
        ``content_hash``; ``int``: a storage digest), or a private copy and None.
    """
    if type(t) is not _TENSOR and is_traceable_wrapper_subclass(t):
        return t.detach().clone(), None
    t = t.detach()
    if not t.is_cpu:
        return _flat_span(t).clone().as_strided(tuple(t.shape), t.stride(), 0), None
    if not t.is_contiguous() and digestible(t):
        return t, storage_digest(t)
    return t, content_hash_in_place(t)


def _seal(t: torch.Tensor, digest: str | int | None) -> bool:
    """Whether ``t``, about to be spilled, still hashes to ``digest`` (taken when its op ran).

    ``digest`` (:func:`guarded`): a ``content_hash`` (``str``) checked on a plain contiguous CPU
    tensor, whose spilled span (``capture.store``: its ``numel`` elements from its storage
    offset) is its C-order bytes; or a ``storage_digest`` (``int``) of a dense non-contiguous
    one, whose spilled span is exactly the bytes that digest reads. The file is written right
    after this check, in this thread, so a sealed file holds the bytes the op produced (up to
    an xxh3-64 collision, the risk ``compare_tensors`` accepts for every ``equal``):
    ``localize.settle`` may then settle the pair without reading the file back. A private copy
    (``None``) or any other tensor: False.
    """
    if type(t) is not _TENSOR or not t.is_cpu or t.numel() == 0:
        return False
    if isinstance(digest, str):
        return t.is_contiguous() and content_hash_in_place(t) == digest
    return isinstance(digest, int) and storage_digest(t) == digest


def _layout(t: torch.Tensor) -> tuple:
    """What :meth:`OpStore.sealed_spill` requires unchanged besides the address and bytes."""
    return (
        t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t.is_conj(), t.is_neg(),
    )  # fmt: skip


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s storage (its elements for a wrapper subclass, which has none)."""
    if type(t) is not _TENSOR and is_traceable_wrapper_subclass(t):  # issue 19: exact first
        return t.numel() * t.element_size()
    return t.untyped_storage().nbytes()


def _span(t: torch.Tensor) -> int:
    """Storage elements spanned by ``t`` from its storage offset (0 for an empty tensor)."""
    return 0 if t.numel() == 0 else span_elements(tuple(t.shape), t.stride())


def _flat_span(t: torch.Tensor) -> torch.Tensor:
    return torch.as_strided(t, (_span(t),), (1,), t.storage_offset())


# ---------------------------------------------------------------------------------------------
# The capture store: resident budget, spill to disk, copy-on-write


class Held:
    """One captured tensor: resident (a reference or a private copy) or spilled to disk."""

    __slots__ = (
        "counted", "device", "digest", "dtype", "id", "nbytes", "ptr", "sealed", "size",
        "spilled", "stride", "tensor",
    )  # fmt: skip

    def __init__(self, hid: int, tensor: torch.Tensor, counted: bool):
        self.id = hid
        #: the tensor's hash when it was held (:func:`guarded`: ``str`` its ``content_hash``,
        #: ``int`` its ``storage_digest``); None: a private copy nobody else can write
        self.digest: str | int | None = None
        self.tensor: torch.Tensor | None = tensor
        self.counted = counted
        self.spilled: Spilled | None = None
        #: spilled, and the bytes written hashed to ``digest`` (a ``content_hash``) right
        #: before the write (:meth:`OpStore._spill_entry`): the file holds the op's output
        self.sealed = False
        self.ptr = 0  # ``_ptr(tensor)`` while resident and indexed (``OpStore._index``)
        self.size, self.stride = tuple(tensor.shape), tensor.stride()
        self.dtype, self.device = tensor.dtype, tensor.device
        self.nbytes = _nbytes(tensor) if counted else 0

    def get(self) -> torch.Tensor:
        """The tensor, read back memory-mapped if it was spilled."""
        if self.tensor is not None:
            return self.tensor
        assert self.spilled is not None
        return self.spilled.load()


class OpStore(BoundedStore):
    """Op captures within ``max_resident_bytes`` (the oldest spilled), with copy-on-write.

    Captures are references to the op outputs, indexed by storage pointer so that an in-place
    write into a held storage first gives each holder a private copy (:meth:`before_write`),
    and by the byte range of that storage, so that a write through another storage object
    aliasing any of its bytes (a DLPack or ``from_numpy`` view of a slice) does too.
    Uncounted holdings (parameters, storages a counted capture already holds) never spill.
    """

    def __init__(self, max_resident_bytes: int, spill_dir: str | os.PathLike[str] | None):
        super().__init__(max_resident_bytes, spill_dir, self._spill_entry, "ops-spill-")
        # issue 19 (wave 10): pack files reused once free, not written fresh every run
        self._dir = PooledSpillDir(spill_dir, prefix="ops-spill-")
        self._by_ptr: dict[int, list[Held]] = {}
        #: the byte range ``[ptr, ptr + storage nbytes)`` of every key of ``_by_ptr``, counted
        #: or not (the largest storage seen at that address while the key lives)
        self._ranges = AddressRanges()
        self._ids = itertools.count()
        #: ``Held.id`` -> ``watcher(h, address, version)`` calls made when it is spilled
        self._lent: dict[int, list[Callable[[Held, int, int], None]]] = {}
        #: data address -> (capture, version, layout) of a sealed spill of a dense
        #: non-contiguous output (:meth:`sealed_spill`; w9lend)
        self._sealed: dict[int, tuple[Held, int, tuple]] = {}

    def hold(
        self,
        tensor: torch.Tensor,
        *,
        counted: bool = True,
        ptr: int | None = None,
        digest: str | int | None = None,
    ) -> Held:
        """Keep a reference to ``tensor`` (counted captures may later be spilled).

        A wrapper subclass (``DTensor``) is never spilled: kept resident, outside the budget.
        ``ptr``: ``_ptr(tensor)`` when the caller has it already (issue 19: read once).
        ``digest``: ``tensor``'s content hash now (:func:`guarded`), kept on ``Held.digest``.
        """
        plain = type(tensor) is _TENSOR  # no subclass, so no wrapper subclass
        counted = counted and (plain or not is_traceable_wrapper_subclass(tensor))
        h = Held(next(self._ids), tensor, counted)
        h.digest = digest
        self._index(h, ptr)
        if counted:
            self.admit(h.id, h.nbytes, h)
        return h

    def lend(self, address: int, nbytes: int, dtype: torch.dtype) -> Held | None:
        """A resident counted capture that IS the whole storage at ``address`` now, or None.

        Issue 19: a module snapshot of an op-level run borrows such a capture's spill file
        instead of writing the same bytes again (``capture.snapshot.SnapshotStore``). Two live
        tensors at one data address share one buffer, so the bytes are the same bytes; the
        capture must cover all ``nbytes`` from offset 0 in ``dtype`` (the file then is the
        whole storage).
        """
        if _DATA_ADDRESS is None:
            return None
        for h in self._by_ptr.get(address, ()):
            t = h.tensor
            if (
                h.counted
                and t is not None
                and t.dtype == dtype
                and h.nbytes == nbytes
                and t.storage_offset() == 0
                and _span(t) * t.element_size() == nbytes
                and self.get(h.id) is h
                and _DATA_ADDRESS(t) == address
            ):
                return h
        return None

    def sealed_spill(self, t: torch.Tensor) -> Spilled | None:
        """A record reading the sealed spill file of ``t``'s bytes now, or None.

        Issue 19 (w9lend): a permuted (channels-last) module output of an op-level run is the
        output of its last op, which this store captured and, past its budget, wrote to a
        sealed file (:func:`_seal`). ``Snapshotter.take`` snapshots it as that file instead of
        a C-order copy written again. Only when the file provably holds ``t``'s bytes: a
        sealed capture spilled from ``t``'s data address, with ``t``'s storage offset, shape,
        strides, dtype and conjugate/negative bits, ``t``'s version counter as it was at the
        write, and ``t``'s storage digest (xxh3-64 of its span, read now: ≈ 3 ms per 32 MiB)
        equal to the digest the file was sealed with. A capture still resident that is ``t``'s
        view (:meth:`_resident_output`) is spilled now, so its file holds ``t``'s bytes of now
        (and is sealed only if they still hash as the op's output). The file is never written
        again, so a later write to ``t`` does not change what the record reads. Cost: such
        captures leave the resident budget early (read back memory-mapped by the comparison).
        """
        if type(t) is not _TENSOR or _DATA_ADDRESS is None:
            return None
        address = _DATA_ADDRESS(t)
        h = self._resident_output(t, address) if address in self._by_ptr else None
        if h is not None:  # still resident: written now, from the very buffer ``t`` is
            if not self.spill(h.id) or not h.sealed or h.spilled is None:
                return None
            return h.spilled.alias(t)
        entry = self._sealed.get(address)
        if entry is None:
            return None
        h, version, layout = entry
        spilled = h.spilled
        if spilled is None or not h.sealed or _layout(t) != layout:
            return None
        if tensor_version(t) != version or storage_digest(t) != h.digest:
            return None
        return spilled.alias(t)

    def _resident_output(self, t: torch.Tensor, address: int) -> Held | None:
        """The resident counted capture of a dense non-contiguous output that IS ``t``'s view.

        Same data address and :func:`_layout` (so the same bytes in the same places): spilling
        it now writes ``t``'s bytes of now, sealed if they are still the op's output.
        """
        for h in self._by_ptr.get(address, ()):
            ht = h.tensor
            if (
                h.counted
                and ht is not None
                and isinstance(h.digest, int)
                and self.get(h.id) is h
                and _DATA_ADDRESS(ht) == address
                and _layout(ht) == _layout(t)
            ):
                return h
        return None

    def watch(self, h: Held, watcher: Callable[[Held, int, int], None]) -> None:
        """Call ``watcher(h, address, version)`` right after ``h`` is written to disk.

        ``address`` and ``version``: the data address and version counter of the tensor that
        was written, read while it is still alive.
        """
        self._lent.setdefault(h.id, []).append(watcher)

    def counts(self, ptr: int) -> bool:
        """Whether a counted, resident capture holds the storage at ``ptr``."""
        return any(h.counted for h in self._by_ptr.get(ptr, ()))

    def _index(self, h: Held, ptr: int | None = None) -> None:
        t = h.tensor
        assert t is not None
        if ptr is None:
            ptr = _ptr(t)  # once (issue 19: a storage object per call)
        h.ptr = ptr
        if ptr:
            self._by_ptr.setdefault(ptr, []).append(h)
            # the storage's whole byte range (an uncounted holding too: ``Held.nbytes`` is 0)
            self._ranges.add(ptr, ptr + t.untyped_storage().nbytes())

    def _unindex(self, h: Held) -> None:
        ptr = 0 if h.tensor is None else h.ptr  # h.tensor's storage, set by _index
        if not ptr:
            return
        lst = self._by_ptr.get(ptr)
        if lst is not None:
            with contextlib.suppress(ValueError):
                lst.remove(h)
            if not lst:
                del self._by_ptr[ptr]
                self._ranges.discard(ptr)

    def before_write(self, tensor: torch.Tensor) -> None:
        """Copy every held tensor whose storage shares a byte with ``tensor``'s before a write.

        The held storages are found by byte range, not only by address: ``tensor`` may be
        another storage object over some of a held storage's bytes (``torch.from_numpy`` of a
        ``.numpy()`` view of a slice, ``torch.from_dlpack`` of a slice), or a held one may be
        such an alias of ``tensor``'s. Every storage overlapping ``[address, address + nbytes)``
        of ``tensor``'s storage is treated as written: each of its holders gets a private copy.
        ``O(log n + k)`` for ``n`` held storages, ``k`` of them overlapping
        (:class:`~parity_tracker.capture.address_ranges.AddressRanges`).
        """
        ptr = _ptr(tensor) if isinstance(tensor, torch.Tensor) else 0
        if not ptr:
            return
        ranges, holders = self._ranges, []
        for key in ranges.overlapping(ptr, ptr + tensor.untyped_storage().nbytes()):
            ranges.discard(key)
            holders += self._by_ptr.pop(key)
        for h in holders:
            # one copied before may have spilled another (``admit``): its file holds the bytes
            # as they are before this write, so it needs no copy
            if h.tensor is not None:
                self._copy_for_write(h)

    def _copy_for_write(self, h: Held) -> None:
        """Give ``h`` a private copy of its elements (re-indexed, counted from now on)."""
        assert h.tensor is not None
        copy = _flat_span(h.tensor).clone().as_strided(h.size, h.stride, 0)
        h.tensor = copy
        self._index(h)
        if h.counted:
            self.discard(h.id)
        h.counted, h.nbytes = True, copy.untyped_storage().nbytes()
        self.admit(h.id, h.nbytes, h)

    def _spill_entry(self, _key: int, h: Held) -> bool:
        t = h.tensor
        if t is None:
            return False
        self._unindex(h)
        # issue 19: a capture whose bytes still hash as when its op ran is sealed: its file
        # then holds exactly the op's output, which ``localize.op_compare`` may settle from
        # the digest without reading the file back (``sealed``)
        sealed = _seal(t, h.digest)
        # freed with the last record reading it (``Spilled.alias``: a borrower's)
        h.spilled, h.tensor, h.sealed = self.write(t), None, sealed
        if sealed and h.ptr and isinstance(h.digest, int):  # a dense non-contiguous output
            version = tensor_version(t)
            if version is not None:
                self._sealed[h.ptr] = (h, version, _layout(t))
        watchers = self._lent.pop(h.id, None)
        if watchers:
            address, version = _DATA_ADDRESS(t), tensor_version(t)  # t alive: the written buffer
            for watcher in watchers:
                watcher(h, address, version)
        return True

    def release(self, h: Held) -> None:
        """Forget ``h`` (resident reference dropped; its spill file deleted unless borrowed)."""
        self._unindex(h)
        self.discard(h.id)
        self._lent.pop(h.id, None)
        sealed = self._sealed.get(h.ptr)
        if sealed is not None and sealed[0] is h:
            del self._sealed[h.ptr]
        h.tensor = None
        h.spilled = None  # its bytes are freed once no borrowed record reads them

    def close(self) -> None:  # type: ignore[override]
        """Drop everything and delete the spill directory."""
        for h in self.payloads():
            self.release(h)
        self._by_ptr.clear()
        self._ranges.clear()
        self._sealed.clear()
        super().close()
