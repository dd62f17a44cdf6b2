"""parity_tracker.capture.heap_trim: freed heap memory returned to the OS during a run."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from parity_tracker.capture import heap_trim
from parity_tracker.capture.heap_trim import HeapTrimmer
from parity_tracker.capture.store import BoundedStore


def scripted(values: list[int]):
    it = iter(values)
    return lambda: next(it)


def test_trims_only_when_the_resident_set_grew_past_the_largest_seen(monkeypatch):
    monkeypatch.delenv(heap_trim.ENV, raising=False)
    calls: list[int] = []
    # looks at: 120 B admitted (rss 500 > 0 + 100: trim, then 300 after), 220 (350 <= 400: no),
    # 320 (450 > 400: trim, 420 after), 420 (480 <= 520: no)
    t = HeapTrimmer(every=100, trim=calls.append, resident=scripted([500, 300, 350, 450, 420, 480]))
    t.admitted(60)  # 60 < 100: no look
    assert calls == []
    for n in (60, 100, 100, 100):
        t.admitted(n)
    assert calls == [0, 0]
    assert t.trims == 2


def test_an_armed_trimmer_trims_only_past_the_process_peak(monkeypatch):
    """Hand-worked, every=100: armed at a process peak of 1000, looks reading 1050 (<= 1100:
    no trim, though far past the largest after a trim, 0), 1150 (> 1100: trim, 400 after),
    1050 (<= 1100: no); re-armed at a peak of 1500: 1550 (<= 1600: no), 1650 (> 1600: trim)."""
    monkeypatch.delenv(heap_trim.ENV, raising=False)
    calls: list[int] = []
    peaks = iter([1000, 1500])
    t = HeapTrimmer(
        every=100,
        trim=calls.append,
        resident=scripted([1050, 1150, 400, 1050, 1550, 1650, 600]),
        peak=lambda: next(peaks),
    )
    t.arm()
    for _ in range(3):
        t.admitted(100)
    assert t.trims == 1
    t.arm()
    for _ in range(2):
        t.admitted(100)
    assert calls == [0, 0] and t.trims == 2


def test_arm_keeps_its_floor_when_the_peak_is_unknown():
    t = HeapTrimmer(every=10, trim=[].append, resident=scripted([15, 25]), peak=lambda: -1)
    t.arm()  # -1: unknown, the floor stays 0
    t.admitted(10)
    assert t.trims == 1


def test_the_default_peak_is_at_least_the_resident_set():
    if sys.platform != "linux":
        pytest.skip("/proc/self/statm")
    assert heap_trim._peak() >= heap_trim._resident() > 0


def test_no_trim_when_turned_off_unavailable_or_resident_set_unknown(monkeypatch):
    calls: list[int] = []
    monkeypatch.setenv(heap_trim.ENV, "0")
    assert HeapTrimmer(every=1, trim=calls.append).trim() is False
    monkeypatch.delenv(heap_trim.ENV)
    assert HeapTrimmer(every=1, trim=None).trim() is False
    t = HeapTrimmer(every=1, trim=calls.append, resident=lambda: -1)
    t.admitted(10)
    assert calls == [] and t.trims == 0


def test_every_must_be_positive():
    with pytest.raises(ValueError, match="every must be a positive byte count"):
        HeapTrimmer(every=0)


def test_store_admissions_are_counted_by_the_process_trimmer(monkeypatch, tmp_path):
    seen: list[int] = []

    class Recorder:
        def admitted(self, nbytes: int) -> None:
            seen.append(nbytes)

        def arm(self) -> None:
            seen.append("arm")

    monkeypatch.setattr(heap_trim, "trimmer", Recorder())
    store = BoundedStore(25, tmp_path, on_spill=lambda key, payload: True)
    for key, n in enumerate((10, 20, 30)):  # the 2nd and 3rd admissions spill older entries
        store.admit(key, n)
    assert seen == ["arm", 10, 20, 30]  # a new store arms the trimmer first


_FRAGMENT = textwrap.dedent(
    """
    import ctypes, sys
    from parity_tracker.capture.heap_trim import HeapTrimmer, _resident
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    big, small = [], []
    for _ in range(2000):  # 2000 x 64 KiB (below glibc's 128 KiB mmap threshold: heap chunks)
        p = libc.malloc(64 << 10)
        ctypes.memset(p, 1, 64 << 10)  # touched: resident
        big.append(p)
        small.append(libc.malloc(32))  # kept: the freed chunks cannot merge into the top
    for p in big:
        libc.free(p)
    before = _resident()
    t = HeapTrimmer()
    assert t.trim()
    print(before - _resident())
    """
)


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim"
)
def test_a_trim_returns_freed_heap_chunks_to_the_os(monkeypatch):
    """125 MiB freed inside the heap (held in place by live 32-byte chunks) stay resident
    until the trim; after it, at least half of them are returned.

    glibc's automatic trim at ``free`` is turned off in the child (its trim threshold set past
    any heap, ``mallopt(3)``): where the 32-byte chunks came from older free space, the freed
    chunks merged into the top of the heap and ``free`` itself returned them, so the figure
    depended on what the interpreter had allocated before (36 KiB returned in a venv whose
    site-packages is reached through a ``.pth`` file)."""
    monkeypatch.delenv(heap_trim.ENV, raising=False)
    never = str(1 << 40)
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": never}
    env["GLIBC_TUNABLES"] = f"glibc.malloc.trim_threshold={never}"
    out = subprocess.run(
        [sys.executable, "-c", _FRAGMENT],
        capture_output=True, text=True, timeout=60, check=True, env=env,
    )  # fmt: skip
    returned = int(out.stdout.split()[-1])
    assert returned >= 2000 * (64 << 10) // 2, returned
