"""Op-store spill files kept open for the next spill once free, not deleted (issue 19, wave 10).

An op-level run writes its op captures past the resident budget into pack files
(:class:`~parity_tracker.capture.store.SpillDir`): ≈ 200 MiB a run on the 8×512 transformer,
≈ 330 MiB on vae-tiny 256×256. Each file used to be deleted with its last record, so every run
wrote into page-cache pages the kernel had to allocate again. On a virtual machine whose
balloon reports free pages to the host (virtio ``VIRTIO_BALLOON_F_REPORTING``, Linux
``mm/page_reporting.c``: free blocks of ``page_reporting_order`` are reported about 2 s after
they are freed and the host discards them), each such page is faulted in by the host again:
``pwrite`` into a new file cost 0.8–1.6 ms/MiB after a 3 s pause on the 2-core machine, into a
file whose pages were written before 0.06–0.10 ms/MiB (benchmarks/README.md, "op-level spill
files kept for reuse, wave 10"): ≈ 0.2 s of system time per full-size transformer run.

:class:`PooledSpillDir` is a ``SpillDir`` whose pack files, once they hold no live record and
no memory map of them is alive, go back to a process-wide :class:`SpillPool`; the next pack
file is taken from the pool and written again from offset 0, over the same pages. What a pack
file promises is unchanged: a span is never written while a record or a loaded view could read
it (the pool takes a file back only when both counts are zero), and a removed or cut file is an
error at the next append or load, never other bytes (``_PackFile.intact``; such a file is
never pooled again).

Cost: the pool keeps up to :data:`POOL_BYTES` of free spill files (disk space, and page cache
the kernel may write back) in a folder ``parity-spill-pool-<pid>-*`` of the system temporary
folder (or of an explicit spill root outside it) until the process exits (removed then; the
folder of a process that was killed is removed by the next process that makes one: its owner
holds an ``fcntl.flock`` on the folder's lock file for as long as it lives, so a live owner in
another pid namespace sharing the folder keeps it) or a run
spills into another folder. A forked child never writes its parent's files.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import mmap
import os
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

import torch

from parity_tracker.capture.store import PACK_BYTES, SpillDir, Spilled, _PackFile

__all__ = ["POOL_BYTES", "PooledSpillDir", "SpillPool", "pool"]

POOL_BYTES = 512 << 20
"""Most bytes of free spill files kept open for reuse (512 MiB: a full-size vae-tiny op-level
run spills ≈ 330 MiB; free files beyond it are closed, as before)."""


class _PooledPack(_PackFile):
    """A pack file that counts its live memory maps and goes back to the pool when idle."""

    __slots__ = ("disk", "maps", "owner", "pid", "pool")

    def __init__(self, path: Path, pool: SpillPool) -> None:
        super().__init__(path)
        self.pid = os.getpid()  # a forked child never deletes its parent's file (w10brk2)
        self.maps = 0  # live ``mmap`` views of this file (``view``)
        self.disk = 0  # the file's length when it was last pooled (it never shrinks)
        self.pool = pool
        #: the PooledSpillDir writing into it now; False: its writer moved on; None: pooled
        self.owner: object = None

    def view(self, offset: int, n: int, dtype: torch.dtype) -> torch.Tensor:
        """``n`` elements of ``dtype`` at ``offset``, mapped privately; the map is counted."""
        if not self.intact():  # removed or cut by someone else: an error, never other bytes
            raise OSError(f"spill file {self.path} was removed or cut while the run lasted")
        prot = mmap.PROT_READ | mmap.PROT_WRITE  # private: a write copies the page
        mm = mmap.mmap(self.fd, n * dtype.itemsize, mmap.MAP_PRIVATE, prot, offset=offset)
        with self.pool.lock:
            self.maps += 1
        weakref.finalize(mm, self._unmapped)  # the tensor (and its views) keep ``mm`` alive
        return torch.frombuffer(mm, dtype=dtype, count=n)

    def _unmapped(self) -> None:
        with self.pool.lock:
            self.maps -= 1
        self.idle()

    def free(self, offset: int, nbytes: int) -> None:
        """One record less; with no record and no map left, the file goes back to the pool."""
        with self.pool.lock:
            self.live -= 1
        self.idle()

    def idle(self) -> None:
        """To the pool if nothing reads it and its writer moved on or is done with it."""
        if self.live <= 0 and self.maps <= 0 and self.fd >= 0:
            self.pool.put(self)

    def close(self) -> None:
        """Close and delete the file (a mapped view keeps its pages and inode alive)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.pid == os.getpid():
            self.path.unlink(missing_ok=True)


class SpillPool:
    """The free pack files of one process, in one folder at a time.

    Args:
        limit: most bytes of free files kept (their lengths on disk); more are deleted.
    """

    def __init__(self, limit: int = POOL_BYTES) -> None:
        self.limit = limit
        self.lock = threading.RLock()
        self._free: list[_PooledPack] = []
        self._bytes = 0
        self._base: str | None = None  # the folder the pool's own folder is made in
        self._folder: Path | None = None  # the pool's own folder (``parity-spill-pool-*``)
        self._numbers = itertools.count()
        self._pid = os.getpid()
        #: descriptors of the lock files of this process's pool folders (``_own_folder``)
        self._lock_fds: list[int] = []
        self.reused = self.created = 0  # pack files taken from the pool / made new

    @property
    def free_bytes(self) -> int:
        """Bytes on disk of the free files kept now."""
        return self._bytes

    def take(self, base: str, owner: object) -> _PooledPack:
        """A pack file under ``base`` for ``owner`` to write from offset 0: a free one, or new."""
        with self.lock:
            if self._pid != os.getpid():  # forked: the parent's files are the parent's
                self._forget()
            if base != self._base:
                self.drain()
                self._base, self._folder = base, None
            pack = None
            while self._free and pack is None:
                pack = self._free.pop()
                self._bytes -= pack.disk
                if not pack.intact():
                    pack.close()
                    pack = None
            if pack is None:
                pack = _PooledPack(self._new_path(base), self)
                self.created += 1
            else:
                self.reused += 1
                pack.end = pack.live = pack.size = 0
            pack.owner = owner
            return pack

    def put(self, pack: _PooledPack) -> None:
        """``pack`` holds nothing any more: keep it for the next ``take``, or delete it."""
        with self.lock:
            if pack.owner is None or pack.fd < 0:  # pooled already, or closed
                return
            pack.owner = None
            keep = self._pid == os.getpid() and pack.path.parent == self._folder
            if keep and pack.intact():
                pack.disk = os.fstat(pack.fd).st_size
                keep = self._bytes + pack.disk <= self.limit
            else:
                keep = False
            if keep:
                self._free.append(pack)
                self._bytes += pack.disk
            else:
                pack.close()

    def drain(self) -> None:
        """Delete every free file."""
        with self.lock:
            for pack in self._free:
                pack.close()
            self._free, self._bytes = [], 0

    def _new_path(self, base: str) -> Path:
        if self._folder is None or not self._folder.is_dir():
            _remove_orphans(base)
            self._folder, fd = _own_folder(base)
            self._lock_fds.append(fd)
            # at exit at the latest; never by a forked child (the folder is its parent's)
            weakref.finalize(self, _remove_own, self._folder, fd, os.getpid())
        return self._folder / f"pack-{next(self._numbers)}.bin"

    def _forget(self) -> None:
        for pack in self._free:
            os.close(pack.fd)  # this process's copy of the descriptor; the file is the parent's
            pack.fd = -1
        # the parent's lock descriptors stay open (closing them is harmless in a forked child,
        # but the last descriptor of a lock releases it): its folders stay locked while either
        # process lives
        self._free, self._bytes, self._base, self._folder = [], 0, None, None
        self._lock_fds = []
        self._pid = os.getpid()


_PREFIX = "parity-spill-pool-"
#: the lock file of a pool folder, ``flock``-ed by its owner for as long as it lives
LOCK_NAME = ".owner.lock"


def _own_folder(base: str) -> tuple[Path, int]:
    """A new pool folder ``parity-spill-pool-<pid>-*`` in ``base``, and its locked descriptor.

    The folder is made under another prefix, its :data:`LOCK_NAME` file created and locked
    (``fcntl.flock``, exclusive), then renamed to the pool prefix (``rename`` is atomic):
    every pool folder another process can see already has its owner's lock. The lock lives
    as long as the descriptor (this process, or a forked child that still holds it). Where
    the file system has no ``flock``, no lock file and descriptor -1 (:func:`_locked`).
    """
    work = tempfile.mkdtemp(prefix=f"parity-spill-new-{os.getpid()}-", dir=base)
    lock = os.path.join(work, LOCK_NAME)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fd = _locked(fd, lock)
        folder = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base)
        os.replace(work, folder)  # over the empty folder just made: a name nobody else takes
    except BaseException:
        if fd >= 0:
            os.close(fd)
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Path(folder), fd


def _locked(fd: int, lock: str) -> int:
    """``fd`` with its exclusive ``flock`` taken; -1 (lock file removed) where flock fails.

    A file system without ``flock`` (Lustre mounted ``noflock``: ENOSYS; NFS without lock
    daemon: ENOLCK) leaves the folder without a lock file, like an earlier version's: the
    sweep then falls back to ``kill(pid, 0)`` (:func:`_remove_if_orphan`), as before the lock
    existed, instead of every spill raising (w11brk1).
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # a fresh file nobody else opened: never EWOULDBLOCK, flock unsupported
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(lock)
        return -1
    return fd


def _remove_own(folder: Path, fd: int, pid: int) -> None:
    """Remove this process's pool ``folder``, then release its lock (not in a forked child)."""
    if os.getpid() != pid:
        return
    shutil.rmtree(folder, ignore_errors=True)
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def _remove_orphans(base: str) -> None:
    """Delete the pool folders in ``base`` of this user's processes that no longer exist.

    An owner is alive while the :data:`LOCK_NAME` file of its folder is locked
    (:func:`_remove_if_orphan`): that holds across pid namespaces sharing the folder, where
    ``kill(pid, 0)`` of another namespace's pid says nothing (w11trust). A folder without a
    lock file (made by an earlier version) falls back to that ``kill`` test.
    """
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            pid = entry.name[len(_PREFIX) :].split("-", 1)[0]
            if not entry.name.startswith(_PREFIX) or not pid.isdigit():
                continue
            if entry.stat(follow_symlinks=False).st_uid == os.getuid():
                _remove_if_orphan(entry.path, int(pid))


def _remove_if_orphan(path: str, pid: int) -> None:
    """Remove the pool folder ``path`` (named for ``pid``) when its owner is gone.

    Gone: a non-blocking exclusive ``flock`` of its :data:`LOCK_NAME` file succeeds (the
    lock is held while removing, so a second scanner finds it locked, or the folder gone).
    """
    try:
        flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO: no wait
        fd = os.open(os.path.join(path, LOCK_NAME), flags)
    except FileNotFoundError:  # no lock file: an earlier version's folder
        if not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
        return
    except OSError:  # not readable (or a link): left alone
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # locked: its owner (or a child that inherited the lock) is alive
        os.close(fd)
        return
    try:
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # exists, someone else's; or no pid at all: left alone
        return True
    return True


#: The process's pool of free spill files (every ``PooledSpillDir`` takes from it).
pool = SpillPool()


def pool_folder(root: str | os.PathLike[str] | None) -> str | None:
    """Where pooled files of spill root ``root`` are made, or None when they are not pooled.

    The system temporary folder when ``root`` is None or inside it (``run_parity``'s per-run
    roots, ``run/spill.py``). An explicit root elsewhere is the caller's folder, left empty
    when its store closes (``OpSession.close``): its files are not pooled.
    """
    tmp = os.path.realpath(tempfile.gettempdir())
    if root is None:
        return tmp
    return tmp if os.path.commonpath([os.path.realpath(root), tmp]) == tmp else None


class PooledSpillDir(SpillDir):
    """A :class:`SpillDir` whose pack files come from, and go back to, :data:`pool`.

    Records, loads, borrowing (``Spilled.alias``) and the removed-or-cut checks are
    ``SpillDir``'s; only where a pack file comes from and where it goes when free differ.
    Nothing is written under ``root`` unless :func:`pool_folder` says its files are not pooled
    (then it is a plain ``SpillDir``).
    """

    def __init__(self, root: str | os.PathLike[str] | None, prefix: str = "spill-") -> None:
        super().__init__(root, prefix)
        self._pool_base = pool_folder(root)

    def append(self, tensor: torch.Tensor) -> Spilled:
        """Write ``tensor``'s storage span into the current pooled pack file (see ``SpillDir``).

        One append at a time in the process (the pool's lock): two threads appending into one
        pack would read the same ``end`` and write one span twice (w10brk2).
        """
        if self._pool_base is None:
            return super().append(tensor)
        with pool.lock:  # one append at a time: ``end`` and ``live`` are read, then set
            return self._append(tensor)

    def _append(self, tensor: torch.Tensor) -> Spilled:
        pack = self._pack
        if (
            not isinstance(pack, _PooledPack)
            or pack.owner is not self
            or pack.fd < 0
            or pack.end >= PACK_BYTES
            or not pack.intact()
        ):
            if isinstance(pack, _PooledPack) and pack.owner is self:
                pack.owner = False  # full or cut: pooled (or closed) once its records go
                pack.idle()
            self._pack = pack = pool.take(self._pool_base, self)
        # pinned while it is written: a record freed meanwhile (a gc pass, another
        # thread) must not pool the file this append writes into (w10brk2)
        pack.maps += 1
        try:
            return super().append(tensor)
        except BaseException:
            if pack.live <= 0:  # nothing recorded in it: back to the pool (closed if cut)
                pack.owner = False
                self._pack = None
            raise
        finally:
            pack.maps -= 1
            pack.idle()
