"""Spill captured tensors to disk and read them back memory-mapped.

Shared by the op-capture store (``parity_tracker.ops``) and the TensorChecker's snapshot store
(``parity_tracker.tensor_checker``): both keep at most a resident byte budget of captured
tensors and write the oldest ones beyond it here.

A tensor is written as the raw bytes of the storage span its view covers (``1 + sum((size - 1)
* stride)`` elements from its storage offset), so any strided view round-trips with its strides.
It is read back with ``torch.from_file(..., shared=False)``, a private memory map: pages are
read from disk only when touched and are never written back.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

import torch

__all__ = ["SpillDir", "Spilled", "span_elements"]


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
        flat.view(torch.uint8).numpy().tofile(path)
        return Spilled(path, tensor, flat.numel() * flat.element_size())

    def close(self) -> None:
        """Delete the folder and everything spilled into it."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self.path = None
