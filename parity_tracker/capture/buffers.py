"""Reusable memory for module snapshots: a bounded pool of anonymous memory maps (issue 19).

Why: a module-level run holds the reference's activations until the candidate reaches them
(≈ 113 MiB on the 8×512 transformer). Held as copy-on-write clones they are the forward's
own buffers, so the forward must allocate fresh memory for every later activation; glibc
returns that memory to the kernel after the run (heap trimming), and the next run faults every
page in again: ≈ 29 k minor faults, ≈ 55–60 ms of system time per run (``benchmarks/README.md``,
"Issue 19 — module-level at full size"). Copying each snapshot into a buffer of this pool
instead lets the forward reuse its own memory as in a plain forward, and the pool's buffers
stay mapped from one run to the next: nothing is faulted in again. The process's malloc
settings are left alone: the pool maps and unmaps its own memory (``mmap``), separate from
the heap.

A buffer is handed out as a tensor over a fresh numpy array of the mapping
(``torch.from_numpy``); the tensor's storage holds that array, and every view, ``numpy()``
array or spill of the tensor holds the storage. The buffer returns to the pool only when the
array dies (a weak-reference callback), that is when nothing can read the bytes any more: a
buffer is never handed out while anything still sees its old contents.

Bound and release (the memory this costs): at most :data:`POOL_MAX_BYTES` of FREE buffers are
kept, process-wide (a buffer freed past the bound is unmapped at once); buffers in use are the
snapshots themselves, which the run holds anyway. A buffer that stayed free through a whole
round of capture (between two :meth:`BufferPool.new_round` calls that saw takes in between:
one ``TensorChecker`` round, i.e. one run) is unmapped at the next round's start, so the cache
follows the working set of the latest run. :func:`release_snapshot_buffers` unmaps every free
buffer at once; ``POOL_MAX_BYTES = 0`` turns the pool off.
"""

from __future__ import annotations

import mmap
import threading
import weakref

import numpy as np
import torch

__all__ = ["POOL", "POOL_MAX_BYTES", "POOL_MIN_BYTES", "BufferPool", "release_snapshot_buffers"]

#: Most bytes of free snapshot buffers kept mapped between uses, process-wide (issue 19:
#: the 8×512 transformer's reference holds ≈ 113 MiB). 0 turns the pool off.
POOL_MAX_BYTES = 256 << 20
#: Smallest snapshot (bytes) copied into a pooled buffer; smaller ones are cloned (glibc's
#: heap serves them from its free lists without faults) — the same bound as copy-on-write.
POOL_MIN_BYTES = 64 << 10
_PAGE = mmap.PAGESIZE
#: Buffers at least this large are advised to use transparent huge pages (one fault per
#: 2 MiB instead of 512 when a buffer is first touched), where the kernel offers them.
_HUGE = 2 << 20
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


class _Buffer:
    """One anonymous mapping and the round it was last handed out in."""

    __slots__ = ("map", "round", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.map = mmap.mmap(-1, size)
        if size >= _HUGE and _MADV_HUGEPAGE is not None:
            try:
                self.map.madvise(_MADV_HUGEPAGE)
            except OSError:  # a kernel without transparent huge pages: ordinary pages
                pass
        self.round = 0

    def unmap(self) -> None:
        try:
            self.map.close()
        except BufferError:  # still exported (cannot happen for a free buffer): left to gc
            pass


class BufferPool:
    """Free snapshot buffers by size (whole pages), reused by the next copy of that size.

    Args:
        max_free_bytes: a callable giving the bound on free bytes kept (read at every free,
            so a change of :data:`POOL_MAX_BYTES` applies at once).
    """

    def __init__(self, max_free_bytes) -> None:
        self._max = max_free_bytes
        self._free: dict[int, list[_Buffer]] = {}
        self._lent: dict[int, tuple[weakref.ref, _Buffer]] = {}
        self._lock = threading.RLock()  # a release may run in a collection inside a copy
        self.free_bytes = 0
        self._round = 0
        self._taken = False  # any copy since the last round started

    def usable(self) -> bool:
        """False when :data:`POOL_MAX_BYTES` is 0 (the pool is off)."""
        return self._max() > 0

    def copy(self, src: torch.Tensor) -> torch.Tensor:
        """A C-order contiguous copy of ``src`` (a plain strided CPU tensor) in a pooled buffer.

        Returns:
            A tensor of ``src``'s shape and dtype, contiguous, holding ``src``'s values, whose
            storage is the pooled buffer (``untyped_storage().nbytes()`` = ``src``'s bytes).
        """
        nbytes = src.numel() * src.element_size()
        buf = self._take(-(-nbytes // _PAGE) * _PAGE)
        arr = np.frombuffer(buf.map, dtype=np.uint8, count=nbytes)
        key = id(arr)
        with self._lock:
            self._lent[key] = (weakref.ref(arr, self._returned(key)), buf)
        out = torch.from_numpy(arr).view(src.dtype).view(src.shape)
        out.copy_(src)
        return out

    def _take(self, size: int) -> _Buffer:
        with self._lock:
            self._taken = True
            stack = self._free.get(size)
            if stack:
                buf = stack.pop()
                self.free_bytes -= size
                buf.round = self._round
                return buf
        buf = _Buffer(size)
        buf.round = self._round
        return buf

    def _returned(self, key: int):
        def callback(ref: weakref.ref) -> None:
            with self._lock:
                entry = self._lent.get(key)
                if entry is None or entry[0] is not ref:
                    return
                del self._lent[key]
                self._keep(entry[1])

        return callback

    def _keep(self, buf: _Buffer) -> None:
        if self.free_bytes + buf.size > self._max():
            buf.unmap()
            return
        self._free.setdefault(buf.size, []).append(buf)
        self.free_bytes += buf.size

    def new_round(self) -> None:
        """Start a round: unmap the free buffers the previous round (one with takes) never used."""
        with self._lock:
            if not self._taken:
                return
            self._taken = False
            last, self._round = self._round, self._round + 1
            for size, stack in list(self._free.items()):
                keep = [b for b in stack if b.round >= last]
                for b in stack:
                    if b.round < last:
                        b.unmap()
                        self.free_bytes -= size
                if keep:
                    self._free[size] = keep
                else:
                    del self._free[size]

    def release(self) -> None:
        """Unmap every free buffer now (buffers in use return to the kernel when freed)."""
        with self._lock:
            for stack in self._free.values():
                for b in stack:
                    b.unmap()
            self._free.clear()
            self.free_bytes = 0


#: The process's pool (module snapshots of every TensorChecker).
POOL = BufferPool(lambda: POOL_MAX_BYTES)


def release_snapshot_buffers() -> None:
    """Return every free pooled snapshot buffer to the kernel now (see the module docstring)."""
    POOL.release()
