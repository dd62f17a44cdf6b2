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

import ctypes
import os
import shutil
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import torch

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
    """

    __slots__ = ("__weakref__", "device", "dtype", "nbytes", "path", "size", "stride")

    def __init__(self, path: Path, tensor: torch.Tensor, nbytes: int):
        self.path = path
        self.size, self.stride = tuple(tensor.shape), tuple(tensor.stride())
        self.dtype, self.device = tensor.dtype, tensor.device
        self.nbytes = nbytes

    def load(self, *, to_device: bool = False) -> torch.Tensor:
        """The tensor, memory-mapped from its file (on CPU unless ``to_device``).

        Args:
            to_device: move it back to the device it was spilled from (a copy for non-CPU
                devices).
        """
        if 0 in self.size:
            t = torch.empty_strided(self.size, self.stride, dtype=self.dtype)
        else:
            n = span_elements(self.size, self.stride)
            flat = torch.from_file(str(self.path), shared=False, size=n, dtype=self.dtype)
            t = flat.as_strided(self.size, self.stride, 0)
        if to_device and self.device.type != "cpu":
            t = t.to(self.device)
        return t

    def delete(self) -> None:
        """Remove the file (no error if it is gone already)."""
        self.path.unlink(missing_ok=True)


class SpillCounters:
    """Read-only byte counters of an object whose ``_store`` keeps tensors within a budget.

    Shared by ``OpSession`` (op captures) and ``TensorChecker`` (module snapshots); all in bytes.
    """

    _store: object

    @property
    def resident_bytes(self) -> int:
        """Bytes of captured storage resident in memory now (the quantity the budget bounds)."""
        return self._store.resident_bytes

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

    def write(self, tensor: torch.Tensor, name: str) -> Spilled:
        """Write ``tensor``'s storage span to ``name`` in this folder.

        Args:
            tensor: any strided tensor (copied to CPU to be written).
            name: the file name, unique within this folder.

        Returns:
            The ``Spilled`` record (``load()`` reads it back).
        """
        if self.path is None:
            if self.root is not None:
                self.root.mkdir(parents=True, exist_ok=True)
            self.path = Path(tempfile.mkdtemp(prefix=self.prefix, dir=self.root))
            self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, True)
        path = self.path / name
        if tensor.numel() == 0:
            flat = torch.empty(0, dtype=tensor.dtype)
        else:
            n = span_elements(tuple(tensor.shape), tuple(tensor.stride()))
            flat = torch.as_strided(tensor, (n,), (1,), tensor.storage_offset())
        flat = flat.detach().cpu().contiguous()
        nbytes = flat.numel() * flat.element_size()
        with open(path, "wb") as f:
            f.write(_readonly_bytes(flat, nbytes))
        return Spilled(path, tensor, nbytes)

    def close(self) -> None:
        """Delete the folder and everything spilled into it."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self.path = None


def _readonly_bytes(flat: torch.Tensor, nbytes: int) -> memoryview:
    """The ``nbytes`` bytes of a contiguous CPU tensor, read in place without a copy.

    Read through ``const_data_ptr``: ``numpy()`` (and ``data_ptr()``) would first copy a
    copy-on-write storage (a ``torch._lazy_clone``, e.g. a TensorChecker snapshot, and its
    source) to give it a private one, ≈ 0.6 ms per MiB on top of the write (issue 19). The
    view is valid while ``flat`` is alive and unwritten (the caller writes it out at once).
    """
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(flat.const_data_ptr())).cast("B")


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

    def admit(self, key: Hashable, nbytes: int, payload: Any = None) -> None:
        """Count ``nbytes`` resident under ``key``; spill the oldest entries past the budget."""
        self._resident[key] = (nbytes, payload)
        self.resident_bytes += nbytes
        while self.resident_bytes > self.max_resident_bytes and self._resident:
            old_key, (n, old) = self._resident.popitem(last=False)
            self.resident_bytes -= n
            if self._on_spill(old_key, old):
                self.spilled_bytes += n
                self.spilled_count += 1
        self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)

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

    def write(self, tensor: torch.Tensor, name: str) -> Spilled:
        """Write ``tensor`` to the spill folder (:meth:`SpillDir.write`)."""
        return self._dir.write(tensor, name)

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
