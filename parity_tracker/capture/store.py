"""The one bounded store of captured tensors: a resident byte budget, the oldest spilled to disk.

:class:`BoundedStore` owns the budget rule for every capture path (the op recorder's captures,
the TensorChecker's module snapshots): entries are admitted with their byte size, and past
``max_resident_bytes`` the oldest resident entries are spilled (least recently admitted
first), so after every admission ``resident_bytes <= max_resident_bytes``. What "spilling" an
entry means is the owner's callback: it writes the tensor with :meth:`BoundedStore.write` and
swaps its own reference for the :class:`Spilled` record.

A tensor is written as the raw bytes of the storage span its view covers (``1 + sum((size - 1)
* stride)`` elements from its storage offset), so any strided view round-trips with its strides.
It is read back with ``torch.from_file(..., shared=False)``, a private memory map: pages are
read from disk only when touched and are never written back.
"""

from __future__ import annotations

import itertools
import mmap
import os
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import torch

from parity_tracker.capture import heap_trim
from parity_tracker.compare.hashing import bytes_in_place

__all__ = ["BoundedStore", "SpillCounters", "SpillDir", "Spilled", "span_elements"]


def span_elements(size: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Number of storage elements a non-empty view of ``size``/``stride`` covers."""
    return 1 + sum((s - 1) * st for s, st in zip(size, stride, strict=True))


class Spilled:
    """One tensor written to disk: its file and what is needed to rebuild the view.

    Attributes:
        path: the file (raw bytes of the view's storage span).
        size, stride: the view's shape and strides, in elements.
        dtype: the tensor's dtype.
        device: the device the tensor lived on when it was spilled.
        nbytes: bytes written.
        base: the record whose file this one reads (:meth:`alias`), kept alive by it; None
            for the record that wrote the file.
    """

    __slots__ = (
        "__weakref__", "_free", "base", "device", "dtype", "nbytes", "offset", "pack", "path",
        "size", "stride",
    )  # fmt: skip

    def __init__(self, path: Path, tensor: torch.Tensor, nbytes: int):
        self.path = path
        self.size, self.stride = tuple(tensor.shape), tuple(tensor.stride())
        self.dtype, self.device = tensor.dtype, tensor.device
        self.nbytes = nbytes
        self.base: Spilled | None = None
        #: the shared file this record lies in (``SpillDir.append``) and its byte offset there
        self.pack: _PackFile | None = None
        self.offset = 0
        self._free: weakref.finalize | None = None

    def alias(self, tensor: torch.Tensor) -> Spilled:
        """A record reading this file as ``tensor``'s view (a borrowed spill, issue 19).

        The caller has proved that ``tensor`` holds the same bytes as the span written here
        and that its own view (offset 0) covers no more than it. The new record keeps this one
        alive, so a file deleted when its record is collected (``weakref.finalize``) lives as
        long as either record; in a shared file it also holds the span itself, so ``delete``
        of either record leaves the other readable (a pooled file is written again once free:
        ``capture.spill_pool``, w10brk2).

        Raises:
            OSError: this record was deleted (its span may hold other bytes now).
        """
        out = Spilled(self.path, tensor, self.nbytes)
        out.base, out.pack, out.offset = self, self.pack, self.offset
        if self._free is not None:  # its own hold on the span: ``delete`` of either frees one
            if not self._free.alive:
                raise OSError(f"spill record of {self.path} was deleted")
            self.pack.live += 1
            out._free = weakref.finalize(out, self.pack.free, self.offset, self.nbytes)
        return out

    def load(self, *, to_device: bool = False) -> torch.Tensor:
        """The tensor, memory-mapped from its file (on CPU unless ``to_device``).

        Args:
            to_device: move it back to the device it was spilled from (a copy for non-CPU
                devices).

        Raises:
            OSError: the record was deleted (``delete``), or its file removed or cut.
        """
        if self._free is not None and not self._free.alive:  # its span may be written again
            raise OSError(f"spill record of {self.path} was deleted")
        if 0 in self.size:
            t = torch.empty_strided(self.size, self.stride, dtype=self.dtype)
        else:
            n = span_elements(self.size, self.stride)
            if self.pack is not None:
                flat = self.pack.view(self.offset, n, self.dtype)
            else:
                flat = torch.from_file(str(self.path), shared=False, size=n, dtype=self.dtype)
            t = flat.as_strided(self.size, self.stride, 0)
        if to_device and self.device.type != "cpu":
            t = t.to(self.device)
        return t

    def delete(self) -> None:
        """Remove the file (no error if it is gone already); in a shared file: free the span."""
        if self._free is not None:
            self._free()
        elif self.pack is None:
            self.path.unlink(missing_ok=True)


_PAGE = mmap.ALLOCATIONGRANULARITY
#: a spill file takes new records until it holds this many bytes (then the next one starts)
PACK_BYTES = 64 << 20


#: Guards a pack file's ``end``, ``size``, ``live`` and ``fd`` (``_PackFile.append`` / ``free``);
#: re-entrant, and nothing inside it allocates a GC-tracked object.
_PACK_LOCK = threading.RLock()


class _PackFile:
    """One spill file holding many records at page-aligned offsets, deleted with its last one.

    Issue 19: creating a file costs ≈ 0.4 ms on ext4, about what writing 1 MiB into an open
    one costs; a store spills hundreds of tensors per run. Spans are written once and never
    reused or cleared (a tensor loaded from a freed record may still be mapped: its pages must
    keep their bytes), so disk space comes back when the file goes: after ``PACK_BYTES`` a new
    file is started, and each file is deleted with its last record.
    """

    __slots__ = ("broken", "end", "fd", "live", "path", "size")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        self.end = self.live = self.size = 0  # size: where the last write ended
        self.broken = False

    def intact(self) -> bool:
        """Still linked and at least as long as written; once not, never again (sticky).

        A file cut and then written past its cut would read zeros (a hole) where spilled bytes
        were: so every append and load checks first (one ``fstat``, ≈ 1 µs).
        """
        if not self.broken:
            st = os.fstat(self.fd)
            self.broken = st.st_nlink == 0 or st.st_size < self.size
        return not self.broken

    def append(self, data: memoryview) -> int | None:
        """Write ``data`` (bytes) at the next page boundary; its offset, or None: file closed.

        The span is reserved (and the record counted) before the write, under
        :data:`_PACK_LOCK`: ``os.pwrite`` releases the GIL, so two threads appending at once
        read the same ``end`` and wrote one span twice, one record then reading the other's
        bytes (w10brk2). Nothing inside the lock makes a GC-tracked object, so no finalizer
        (``free``) runs there. A write that fails frees its reservation and raises.
        """
        n = data.nbytes
        with _PACK_LOCK:
            if self.fd < 0:  # its last record was freed meanwhile: closed and deleted
                return None
            offset = self.end
            self.end = -(-(offset + max(n, 1)) // _PAGE) * _PAGE
            self.live += 1
        pos = offset
        try:
            while data:
                k = os.pwrite(self.fd, data, pos)
                data, pos = data[k:], pos + k
        except BaseException:
            self.free(offset, n)  # no record was made
            raise
        with _PACK_LOCK:
            if pos > offset and pos > self.size:  # an empty record writes nothing
                self.size = pos
        return offset

    def view(self, offset: int, n: int, dtype: torch.dtype) -> torch.Tensor:
        """``n`` elements of ``dtype`` at ``offset``, mapped privately (never written back)."""
        length = n * dtype.itemsize
        if not self.intact():  # removed or cut by someone else: an error, never other bytes
            raise OSError(f"spill file {self.path} was removed or cut while the run lasted")
        prot = mmap.PROT_READ | mmap.PROT_WRITE  # private: a write copies the page
        mm = mmap.mmap(self.fd, length, flags=mmap.MAP_PRIVATE, prot=prot, offset=offset)
        return torch.frombuffer(mm, dtype=dtype, count=n)  # the tensor keeps the map alive

    def free(self, offset: int, nbytes: int) -> None:
        """One record less; the last one closes and deletes the file."""
        with _PACK_LOCK:  # counted with the reservations of ``append``
            self.live -= 1
            fd = self.fd if self.live <= 0 else -1
            if fd >= 0:
                self.fd = -1
        if fd >= 0:
            os.close(fd)  # a mapped view keeps its pages (and the inode) alive
            self.path.unlink(missing_ok=True)


class SpillCounters:
    """Read-only byte counters of an object whose ``_store`` keeps tensors within a budget.

    Shared by ``OpSession`` (op captures) and ``TensorChecker`` (module snapshots); all in bytes.
    """

    _store: object

    @property
    def resident_bytes(self) -> int:
        """Bytes of captured storage resident in memory now (the quantity the budget bounds)."""
        return self._store.current_bytes()

    @property
    def peak_resident_bytes(self) -> int:
        """The largest ``resident_bytes`` seen so far (since construction or ``clear``)."""
        return self._store.peak_resident_bytes

    @property
    def spilled_bytes(self) -> int:
        """Bytes written to the spill folder so far (since construction or ``clear``)."""
        return self._store.spilled_bytes


class SpillDir:
    """A spill folder, created on first use under ``root`` and removed by ``close``.

    Args:
        root: parent folder (created if missing); ``None``: the system temporary folder.
        prefix: prefix of the folder's name.
    """

    def __init__(self, root: str | os.PathLike[str] | None, prefix: str = "spill-"):
        self.root = Path(root) if root is not None else None
        self.prefix = prefix
        self.path: Path | None = None
        self._finalizer: weakref.finalize | None = None
        self._pack: _PackFile | None = None
        self._packs = itertools.count()

    def _folder(self) -> Path:
        if self.path is None:
            if self.root is not None:
                self.root.mkdir(parents=True, exist_ok=True)
            self.path = Path(tempfile.mkdtemp(prefix=self.prefix, dir=self.root))
            self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, True)
        return self.path

    def append(self, tensor: torch.Tensor) -> Spilled:
        """Write ``tensor``'s storage span into this folder's shared file (see ``_PackFile``).

        The record frees its span when it is collected (or deleted); the file goes
        with its last record.
        """
        flat = _flat_cpu(tensor)
        nbytes = flat.numel() * flat.element_size()
        data = _readonly_bytes(flat)
        offset = None
        while offset is None:  # a pack closed by its last free meanwhile: the next one
            pack = self._pack
            if pack is None or pack.fd < 0 or pack.end >= PACK_BYTES or not pack.intact():
                pack = self._pack = _PackFile(self._folder() / f"pack-{next(self._packs)}.bin")
            offset = pack.append(data)
        out = Spilled(pack.path, tensor, nbytes)
        out.pack, out.offset = pack, offset
        out._free = weakref.finalize(out, pack.free, offset, nbytes)
        return out

    def write(self, tensor: torch.Tensor, name: str) -> Spilled:
        """Write ``tensor``'s storage span to ``name`` in this folder.

        Args:
            tensor: any strided tensor (copied to CPU to be written).
            name: the file name, unique within this folder.

        Returns:
            The ``Spilled`` record (``load()`` reads it back).
        """
        path = self._folder() / name
        flat = _flat_cpu(tensor)
        nbytes = flat.numel() * flat.element_size()
        with open(path, "wb") as f:
            f.write(_readonly_bytes(flat))
        return Spilled(path, tensor, nbytes)

    def close(self) -> None:
        """Delete the folder and everything spilled into it."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self.path = None


def _flat_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s storage span as a contiguous 1-D CPU tensor (no copy for a CPU view)."""
    if tensor.numel() == 0:
        return torch.empty(0, dtype=tensor.dtype)
    n = span_elements(tuple(tensor.shape), tuple(tensor.stride()))
    flat = torch.as_strided(tensor, (n,), (1,), tensor.storage_offset())
    return flat.detach().cpu().contiguous()


def _readonly_bytes(flat: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, read in place without a copy (``bytes_in_place``).

    Read through ``const_data_ptr``: ``numpy()`` (and ``data_ptr()``) would first copy a
    copy-on-write storage (a ``torch._lazy_clone``, e.g. a TensorChecker snapshot, and its
    source) to give it a private one, ≈ 0.6 ms per MiB on top of the write (issue 19). The
    view is valid while ``flat`` is alive and unwritten (the caller writes it out at once).
    """
    return memoryview(bytes_in_place(flat)).cast("B")


class BoundedStore:
    """Resident entries within a byte budget; past it, the oldest are spilled to ``spill_dir``.

    Args:
        max_resident_bytes: the budget in bytes (0 spills every entry at once).
        spill_dir: parent of the spill folder (a fresh temporary folder inside it, deleted by
            :meth:`close`); ``None``: the system temporary folder.
        on_spill: ``on_spill(key, payload) -> bool`` writes the entry (with :meth:`write`) and
            returns whether anything was written (False when the tensor is already gone).
        prefix: name prefix of the spill folder.

    Attributes (all bytes): ``resident_bytes`` now, ``peak_resident_bytes`` the largest seen,
    ``spilled_bytes`` written so far; ``spilled_count`` entries written so far.
    """

    def __init__(
        self,
        max_resident_bytes: float,
        spill_dir: str | os.PathLike[str] | None,
        on_spill: Callable[[Hashable, Any], bool],
        prefix: str = "spill-",
    ) -> None:
        self.max_resident_bytes = max_resident_bytes
        self._dir = SpillDir(spill_dir, prefix=prefix)
        self._on_spill = on_spill
        self._resident: OrderedDict[Hashable, tuple[int, Any]] = OrderedDict()
        self.resident_bytes = self.peak_resident_bytes = 0
        self.spilled_bytes = self.spilled_count = 0
        heap_trim.trimmer.arm()  # trims only past the process's peak so far (issue 19)

    def admit(self, key: Hashable, nbytes: int, payload: Any = None) -> None:
        """Count ``nbytes`` resident under ``key``; spill the oldest entries past the budget.

        Also counts ``nbytes`` into :data:`parity_tracker.capture.heap_trim.trimmer` (freed heap
        memory returned to the OS every few MiB admitted).
        """
        self._resident[key] = (nbytes, payload)
        self.resident_bytes += nbytes
        if self.resident_bytes > self.max_resident_bytes:
            self._make_room()
        if self.resident_bytes > self.peak_resident_bytes:
            self.peak_resident_bytes = self.resident_bytes
        heap_trim.trimmer.admitted(nbytes)  # freed heap pages back to the OS (issue 19)

    def _make_room(self) -> None:
        """Spill the oldest resident entries until ``resident_bytes`` is within the budget."""
        while self.resident_bytes > self.max_resident_bytes and self._resident:
            old_key, (n, old) = self._resident.popitem(last=False)
            self.resident_bytes -= n
            if self._on_spill(old_key, old):
                self.spilled_bytes += n
                self.spilled_count += 1

    def current_bytes(self) -> int:
        """``resident_bytes``, exact now (a store that over-counts between recounts recounts)."""
        return self.resident_bytes

    def spill(self, key: Hashable) -> bool:
        """Spill the resident entry ``key`` now (before the budget asks); whether it was written."""
        entry = self._resident.pop(key, None)
        if entry is None:
            return False
        n, payload = entry
        self.resident_bytes -= n
        if not self._on_spill(key, payload):
            return False
        self.spilled_bytes += n
        self.spilled_count += 1
        return True

    def get(self, key: Hashable) -> Any:
        """The payload of a resident entry, or None."""
        entry = self._resident.get(key)
        return None if entry is None else entry[1]

    def discard(self, key: Hashable) -> bool:
        """Stop counting ``key`` (no spill); returns whether it was resident."""
        entry = self._resident.pop(key, None)
        if entry is None:
            return False
        self.resident_bytes -= entry[0]
        return True

    def write(self, tensor: torch.Tensor) -> Spilled:
        """Write ``tensor`` to the spill folder's shared file (:meth:`SpillDir.append`).

        The record frees its bytes when collected (or deleted).
        """
        return self._dir.append(tensor)

    def payloads(self) -> list[Any]:
        """Payloads of the resident entries, oldest first."""
        return [p for _, p in self._resident.values()]

    def close(self, *, reset_counters: bool = False) -> None:
        """Forget every entry (no spill) and delete the spill folder."""
        self._resident = OrderedDict()
        self.resident_bytes = 0
        if reset_counters:
            self.peak_resident_bytes = self.spilled_bytes = self.spilled_count = 0
        self._dir.close()


class SmallCopies:
    """Small held copies (``compare.batch.HeldBytes``) counted per round, not one entry each.

    Issue 19: a store entry per small copy (a weak reference with a callback, an ordered-dict
    entry, its release) cost ≈ 1.5–3 µs per captured small tensor. Here each admission appends
    ``(weak reference, capture)`` and adds the copy's bytes to :attr:`counted`, once per copy
    (``HeldBytes.owner`` marks a copy already counted this round). Nothing is told when a copy
    is released: :attr:`counted` is an upper bound of the bytes of the copies still held by a
    capture, made exact by :meth:`recount` (a copy counts while some capture's ``value`` is
    it), which the owning store calls before it spills anything, when asked for its resident
    bytes, and whenever the list has doubled since the last recount (amortized: at most one
    look at each entry per entry admitted). So the store's budget rule holds as before: what
    is resident is at most what is counted, and what is counted stays within the budget.

    Attributes:
        entries: ``(weak reference to the copy, capture)`` per admission, oldest first.
        counted: bytes counted (an upper bound of the live copies' bytes).
    """

    __slots__ = ("_kept", "_next_recount", "counted", "entries", "token")

    #: entries admitted before the first automatic recount (then twice the live entries)
    RECOUNT_MIN = 4096

    def __init__(self) -> None:
        self.entries: list[tuple[weakref.ref, Any]] = []
        self.counted = 0
        self.token = object()  # HeldBytes.owner of the copies counted since the last recount
        self._next_recount = self.RECOUNT_MIN
        self._kept = 0  # entries kept by the last recount

    def admit(self, copy: Any, cap: Any) -> int:
        """Count ``copy`` (held by ``cap``); the bytes newly counted (0: counted already)."""
        self.entries.append((weakref.ref(copy), cap))  # no callback: the same ref every time
        if copy.owner is self.token:
            return 0
        copy.owner = self.token
        n = len(copy.data)
        self.counted += n
        return n

    def due(self) -> bool:
        """Whether the entries have grown enough since the last recount to recount now."""
        return len(self.entries) >= self._next_recount

    def stale(self) -> bool:
        """Whether enough was admitted since the last recount for a spill to recount first.

        At least :data:`RECOUNT_MIN` entries and a quarter of those kept at the last recount:
        a store spilling at every admission (its budget full) recounts at most once per that
        many admissions, not at each one (w8brk2: 6,000 small copies past a 128 KiB budget
        took 23 s recounting every live copy per admission). Between recounts ``counted`` is
        an upper bound, so a spill decided on it spills early, never late.
        """
        return len(self.entries) - self._kept >= max(self.RECOUNT_MIN, self._kept >> 2)

    def live(self) -> dict[int, tuple[Any, list[Any]]]:
        """``{id(copy): (copy, [captures holding it])}`` of the copies a capture still holds."""
        found: dict[int, tuple[Any, list[Any]]] = {}
        for ref, cap in self.entries:
            copy = ref()
            if copy is not None and cap.value is copy:
                got = found.get(id(copy))
                if got is None:
                    found[id(copy)] = (copy, [cap])
                else:
                    got[1].append(cap)
        return found

    def recount(self) -> int:
        """Drop released copies; returns the bytes no longer counted (``counted`` is exact)."""
        live = self.live()
        self.token = token = object()
        self.entries = [(weakref.ref(c), cap) for c, caps in live.values() for cap in caps]
        before, self.counted = self.counted, 0
        for copy, _ in live.values():
            copy.owner = token
            self.counted += len(copy.data)
        self._kept = len(self.entries)
        self._next_recount = max(self.RECOUNT_MIN, 2 * self._kept)
        return before - self.counted

    def take_all(self) -> list[tuple[Any, list[Any]]]:
        """Every live copy with its captures, oldest first; the pool is left empty."""
        live = list(self.live().values())
        self.entries, self.counted, self.token = [], 0, object()
        self._next_recount = self.RECOUNT_MIN
        self._kept = 0
        return live
