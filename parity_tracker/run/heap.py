"""The cyclic garbage collector during a run: the heap that existed before it is frozen.

A run keeps a few GC-tracked objects per captured tensor alive until its check (captures,
groups, weak references, comparison records), so a long run crosses CPython's threshold for a
full collection (``long_lived_pending > long_lived_total / 4``, CPython 3.11
``Modules/gcmodule.c``), and a full collection walks the whole heap: with transformers
imported, ≈ 450,000 objects, ≈ 230–330 ms of a 1 s decode loop of 64 steps (issue 19,
measured with ``gc.callbacks``). ``frozen_heap`` moves every object that exists when the run
starts to the permanent generation (``gc.freeze``), so collections during the run walk only
what the run made, and moves them back (``gc.unfreeze``) when it ends. Nothing is disabled:
cyclic garbage made during the run is still collected; cyclic garbage made of pre-run objects
waits until the run ends (the next collection finds it). The youngest generation's threshold is
raised to at least ``YOUNG_THRESHOLD`` allocations for the run (CPython's default is 700;
restored after): a 64-step decode then makes ≈ 10 young collections instead of ≈ 190
(≈ 25 ms instead of ≈ 55–85 ms); cyclic garbage waits at most that many container allocations
longer. A module-level run (no op recording) raises it further, to ``MODULE_YOUNG_THRESHOLD``
(:func:`raise_young`): the run's own records live until its end, so collecting them early only
walks live objects, and a module-level run makes almost no cyclic garbage of its own (≈ 15
objects in a 16-step llama-tiny decode, against ≈ 20,000 in the same run recording ops); its
checker's holder refers to it weakly once it is done (``run.run._unlink``), so its records are
freed without the collector.

It does nothing when the collector is disabled or when something else already froze objects
(``gc.get_freeze_count() > 0``: unfreezing would thaw them too).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The youngest generation's collection threshold during a run (allocations minus deallocations
#: of GC-tracked objects; CPython's default 700).
YOUNG_THRESHOLD = 10_000

#: The youngest threshold during a module-level run (:func:`raise_young`): a 16-step llama-tiny
#: decode makes ≈ 27,000 GC-tracked allocations, a 64-step one ≈ 110,000–200,000; with 10,000
#: the 64-step run spent 41–49 ms of ≈ 500 in 12 collections, with 200,000 none (issue 19,
#: measurement 10). Cost: cyclic garbage made during such a run (a model's own reference
#: cycles) waits up to this many container allocations instead of ``YOUNG_THRESHOLD``.
MODULE_YOUNG_THRESHOLD = 200_000

#: The thresholds ``frozen_heap`` saved, while a block that froze the heap is open (else None)
_SAVED: list[tuple[int, ...] | None] = [None]

#: Makes "nobody froze, so freeze" one step across threads (runs in parallel threads: the first
#: one freezes, the others find the heap frozen and leave it alone).
_LOCK = threading.Lock()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the current heap out of the collector's walks for the ``with`` block.

    Also raises the youngest generation's threshold (``YOUNG_THRESHOLD``). Usable as a
    decorator (``@frozen_heap()``). Always unfreezes and restores the thresholds, also when
    the block raises.
    """
    with _LOCK:
        mine = gc.isenabled() and not gc.get_freeze_count()
        if mine:
            thresholds = _SAVED[0] = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
    if not mine:
        yield
        return
    try:
        yield
    finally:
        with _LOCK:
            _SAVED[0] = None
            gc.set_threshold(*thresholds)
            gc.unfreeze()


def raise_young(threshold: int) -> None:
    """Raise the youngest generation's threshold to ``threshold`` until the open block ends.

    Only inside a :func:`frozen_heap` block that froze the heap (it restores the thresholds it
    saved when it ends); elsewhere, and when the threshold is already higher, nothing changes.
    """
    with _LOCK:
        if _SAVED[0] is not None:
            now = gc.get_threshold()
            if now[0] < threshold:
                gc.set_threshold(threshold, *now[1:])
