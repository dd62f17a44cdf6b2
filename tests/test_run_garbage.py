"""A run's records are freed at its end, not left to the collector (issue 19, measurement 10)."""

from __future__ import annotations

import gc

import torch
from torch import nn

from parity_tracker.run import run_parity


def _pair(depth: int = 30) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    ref = nn.Sequential(*[nn.Linear(4, 4) for _ in range(depth)])
    cand = nn.Sequential(*[nn.Linear(4, 4) for _ in range(depth)])
    cand.load_state_dict(ref.state_dict())
    return ref, cand


def _drive(seen: list | None = None, steps: int = 6):
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))

    def drive(model, rec):
        for k in range(steps):
            rec(k)
            if seen is not None:
                seen.append(gc.get_threshold()[0])
            model(x + k)

    return drive


def test_a_module_level_run_leaves_no_cycles_of_its_records(gc_state):
    ref, cand = _pair()
    run_parity(ref, cand, drive=_drive(), mode="equal", dump_mode="not")  # first-use objects
    gc.collect()
    gc.disable()  # nothing collected behind the test's back: count what the run left
    result = run_parity(ref, cand, drive=_drive(), mode="equal", dump_mode="not")
    left = gc.collect()
    # 6 steps x (30 Linear layers + the root) x (input, output) + 30 x (weight, bias) rows,
    # each with a group and a capture per side (main left ≈ 13 objects per row in cycles);
    # the checker's own few objects and its store's weak references may remain
    rows = 6 * 31 * 2 + 60
    assert result.modules.num_rows == rows
    assert set(result.modules.column("status").to_pylist()) == {"equal"}
    assert left < rows, f"{left} objects of the run were left for the collector"


def test_young_threshold_during_module_and_op_level_runs(gc_state):
    from parity_tracker.run.heap import MODULE_YOUNG_THRESHOLD, YOUNG_THRESHOLD

    gc.enable()
    gc.set_threshold(700, 10, 10)
    ref, cand = _pair(3)
    module_level: list[int] = []
    run_parity(ref, cand, drive=_drive(module_level, 2), mode="equal", dump_mode="not")
    op_level: list[int] = []
    run_parity(
        ref, cand, drive=_drive(op_level, 2), mode="equal", dump_mode="not", capture_ops=True
    )
    assert module_level == [200_000] * 4 == [MODULE_YOUNG_THRESHOLD] * 4
    assert op_level == [10_000] * 4 == [YOUNG_THRESHOLD] * 4
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_raise_young_only_inside_a_block_that_froze_the_heap(gc_state):
    from parity_tracker.run.heap import frozen_heap, raise_young

    gc.enable()
    gc.set_threshold(700, 10, 10)
    raise_young(123_456)  # no block open: nothing changes
    assert gc.get_threshold() == (700, 10, 10)
    with frozen_heap():
        raise_young(123_456)
        assert gc.get_threshold() == (123_456, 10, 10)
        raise_young(1_000)  # never lowered
        assert gc.get_threshold() == (123_456, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)
    gc.disable()  # a block that froze nothing saves nothing: raise_young leaves it alone
    with frozen_heap():
        raise_young(123_456)
        assert gc.get_threshold() == (700, 10, 10)
