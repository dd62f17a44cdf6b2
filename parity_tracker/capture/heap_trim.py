"""Freed heap memory handed back to the OS while a run holds and releases captures (issue 19).

A run holds copies and references of activations and drops them again (spilled, compared,
released), interleaved with the forward's own allocations. On glibc, a freed chunk inside the
heap stays resident until something calls ``malloc_trim``: glibc trims on its own only the top
of the heap (``M_TRIM_THRESHOLD``), and once it has raised its dynamic mmap threshold after the
first free of a large chunk (``mallopt(3)``: "M_MMAP_THRESHOLD ... dynamic adjustment"), the
1 MiB activations of a deep model are carved from that heap too. How much stays resident then
depends on the heap's layout (set by ASLR): measurement 5 gave 26–141 MiB of extra peak RSS at
depth 64 for one commit, from one child process to the next.

:class:`HeapTrimmer` is told of every byte admitted to a capture store
(``capture.store.BoundedStore.admit``). Every :data:`TRIM_EVERY_BYTES` admitted it reads the
resident set (``/proc/self/statm``, ≈ 10 µs) and, only when it has grown more than that much past
the largest resident set seen after a trim, calls ``malloc_trim(0)``: "since glibc 2.8 this
function frees memory in all arenas and in all chunks with whole free pages" (malloc_trim(3)),
by ``madvise``; it changes no allocator setting and frees nothing in use. The same call is the
known remedy of long-running services for memory the allocator keeps (Orthanc 1.11.3's
housekeeper, Icinga 2 PR #9998; Dask's "unmanaged memory" notes). A run whose resident set is
flat pays a read per 8 MiB and no trim; trimming at every period instead cost 4–12 % of a
full-size run (the forward refaults the returned pages at once), hence the growth condition.

Each new capture store arms the trimmer (:meth:`~HeapTrimmer.arm`) with the process's peak
resident set so far (:func:`_peak`): a trim is made only while the resident set is
more than ``every`` past that peak too, that is, while the run is about to make the process's
peak larger (the figure a user runs out of memory on). Memory the process has already used
once is not handed back just for the forward to fault it in again: a full-size transformer run
after a larger job in the same process (measurement 1 next to torchlens) trimmed at every run
and was 8 % slower for it (0.75 vs 0.69 s; benchmarks/README.md, "heap trim armed, wave 10").

Measured on the 2-core machine (benchmarks/README.md, "heap trim, wave 7"): measurement 5's
extra peak RSS at depths 8 / 32 / 64 went from 27 / 21–73 / 33–141 MiB (one child to the next)
to 14–19 / 15–22 / 16–23 MiB; the full-size module- and op-level runs of measurements 1 and 2
within ±1 % (noise) with and without trimming.

Where ``malloc_trim`` does not exist (musl, macOS, Windows) nothing is done. Set the
environment variable ``PARITY_TRACKER_MALLOC_TRIM=0`` to turn trimming off (read at each
trim).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable

__all__ = ["ENV", "TRIM_EVERY_BYTES", "HeapTrimmer", "trimmer"]

TRIM_EVERY_BYTES = 8 << 20
"""Bytes admitted between two looks at the resident set, and the growth past the largest one
seen after a trim that triggers the next trim (8 MiB: measurement 5's figure is flat from 8 to
64 layers of 1 MiB activations; 33–42 MiB at depth 64 with a 32 MiB period)."""

ENV = "PARITY_TRACKER_MALLOC_TRIM"
"""Environment variable: ``0`` turns trimming off."""

_UNRESOLVED = object()


def _libc_trim() -> Callable[[int], int] | None:
    """The C library's ``malloc_trim(size_t pad)`` (glibc), or None where it has none."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _peak() -> int:
    """This process's peak resident set so far (bytes), or -1 where unknown.

    ``getrusage(2)``'s ``ru_maxrss`` (kibibytes on Linux, bytes on macOS), or the resident set
    now when larger: Linux updates the high-water mark behind ``ru_maxrss`` only when the
    resident set shrinks, so a process still growing reads a smaller one.
    """
    try:
        import resource
    except ImportError:  # Windows
        return -1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(peak if sys.platform == "darwin" else peak << 10, _resident())


def _resident() -> int:
    """This process's resident set (bytes, ``/proc/self/statm``), or -1 where unreadable."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return -1


class HeapTrimmer:
    """Calls ``malloc_trim(0)`` when the resident set grows while captures come and go.

    Args:
        every: bytes admitted between two looks at the resident set, and the growth that
            triggers a trim (default :data:`TRIM_EVERY_BYTES`).
        trim: the function called with ``0``; default glibc's ``malloc_trim``, resolved at
            the first trim (None: none exists, nothing is called).
        resident: returns the resident set in bytes (-1: unknown); default
            ``/proc/self/statm``'s.
        peak: returns the process's peak resident set in bytes (-1: unknown), read by
            :meth:`arm`; default ``getrusage(2)``'s ``ru_maxrss``.

    Raises:
        ValueError: ``every`` is not a positive byte count.

    Attributes:
        trims: trims made so far; ``seconds``: their total wall-clock time (s).
    """

    def __init__(
        self,
        every: int = TRIM_EVERY_BYTES,
        trim: object = _UNRESOLVED,
        resident: Callable[[], int] | None = None,
        peak: Callable[[], int] | None = None,
    ) -> None:
        if every <= 0:
            raise ValueError(f"HeapTrimmer: every must be a positive byte count, got {every}")
        self.every = every
        self._trim = trim
        self._resident = resident or _resident
        self._peak = peak or _peak
        self._since = 0
        self._high = 0
        self._floor = 0  # the process's peak at the last arm()
        self.trims = 0
        self.seconds = 0.0

    def admitted(self, nbytes: int) -> None:
        """Count ``nbytes`` just admitted to a store; every ``every`` bytes, maybe trim.

        Trims only when the resident set has grown more than ``every`` past the largest
        resident set seen after a trim (:meth:`grown`): a run whose memory is flat pays one
        read of ``/proc/self/statm`` per ``every`` bytes and no trim.
        """
        self._since += nbytes
        if self._since >= self.every:
            self._since = 0
            if self.grown():
                self.trim()
                self._high = max(self._high, self._resident())

    def arm(self) -> None:
        """A run starts: trim only past the process's peak resident set as of now.

        Called by every new capture store (``capture.store.BoundedStore``); ≈ 14 µs (a
        ``getrusage`` and a read of ``/proc/self/statm``, measured w11fix). An
        unknown peak (-1) leaves the floor as it was.
        """
        self._floor = max(self._floor, self._peak())

    def grown(self) -> bool:
        """Whether the resident set is more than ``every`` bytes above the largest seen.

        The largest seen: the largest resident set after a trim, or the process's peak at the
        last :meth:`arm`, whichever is larger. False when the resident set cannot be read (no
        ``/proc``): then nothing is trimmed.
        """
        rss = self._resident()
        return rss >= 0 and rss > max(self._high, self._floor) + self.every

    def trim(self) -> bool:
        """Trim now (unless turned off or unavailable); whether ``malloc_trim`` was called."""
        if os.environ.get(ENV, "1").strip() == "0":
            return False
        if self._trim is _UNRESOLVED:
            self._trim = _libc_trim()
        if self._trim is None:
            return False
        start = time.perf_counter()
        self._trim(0)  # type: ignore[operator]
        self.seconds += time.perf_counter() - start
        self.trims += 1
        return True


#: The process's trimmer: every capture store of every run counts into it (the heap is the
#: process's, not a run's).
trimmer = HeapTrimmer()
