"""The garbage collector around a run (issue 19): pre-run heap frozen, thresholds restored."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from parity_tracker.run.heap import YOUNG_THRESHOLD, frozen_heap


def test_heap_frozen_inside_and_restored_after(gc_state):
    gc.enable()
    gc.set_threshold(700, 10, 10)
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == (700, 10, 10)


def test_restored_when_the_block_raises(gc_state):
    gc.enable()
    gc.set_threshold(500, 7, 3)
    with pytest.raises(RuntimeError, match="boom"), frozen_heap():
        raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == (500, 7, 3)


def test_a_higher_threshold_is_kept(gc_state):
    gc.enable()
    gc.set_threshold(50_000, 10, 10)
    with frozen_heap():
        assert gc.get_threshold() == (50_000, 10, 10)
    assert gc.get_threshold() == (50_000, 10, 10)


def test_nothing_done_when_disabled_or_already_frozen(gc_state):
    gc.disable()
    gc.set_threshold(700, 10, 10)
    with frozen_heap():
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == (700, 10, 10)
    gc.enable()
    gc.freeze()  # someone else's freeze: unfreezing would thaw it
    frozen = gc.get_freeze_count()
    with frozen_heap():
        assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == frozen


def test_cycles_made_during_the_run_are_still_collected(gc_state):
    gc.enable()

    class Node:
        pass

    with frozen_heap():
        a, b = Node(), Node()
        a.other, b.other = b, a
        alive = __import__("weakref").ref(a)
        del a, b
        assert gc.collect() > 0
        assert alive() is None


def test_run_parity_leaves_the_collector_as_it_was(gc_state):
    from parity_tracker.run import run_parity

    gc.enable()
    gc.set_threshold(700, 10, 10)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    cand = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    cand.load_state_dict(model.state_dict())
    result = run_parity(model, cand, (torch.randn(2, 4),), mode="equal", dump_mode="not")
    assert set(result.modules.column("status").to_pylist()) == {"equal"}
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.isenabled()


def test_parallel_runs_freeze_once_and_restore(gc_state):
    import threading

    gc.enable()
    gc.set_threshold(700, 10, 10)
    inside, release = threading.Barrier(3), threading.Event()
    seen = []

    def work():
        with frozen_heap():
            inside.wait()
            seen.append(gc.get_threshold())
            release.wait()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    release.set()
    for t in threads:
        t.join()
    assert seen == [(YOUNG_THRESHOLD, 10, 10)] * 2
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == (700, 10, 10)
