"""Small held copies counted per round (capture/store.py SmallCopies, issue 19): the budget holds.

The eager checker holds a small tensor as its bytes (``HeldBytes``); the store no longer hears
of each release, so it recounts. These tests pin what the budget rule promises: what is
counted never exceeds ``max_resident_bytes``, released copies stop counting, the counts read
are exact, and the bookkeeping stays bounded over a long run.
"""

from __future__ import annotations

import gc

import torch

from parity_tracker.compare.batch import HeldBytes
from parity_tracker.tensor_checker import TensorChecker

N = 1024  # elements of one small float32 tensor: 4 KiB, the largest held as bytes
ITEM = 4 * N
BUDGET = 32 * ITEM  # 128 KiB: the least budget whose bulk bound (1/16) holds two sides


def _pair(checker: TensorChecker, tag: str, value: float) -> None:
    checker.register_tensor(tag, torch.full((N,), value), side=0)
    checker.register_tensor(tag, torch.full((N,), value), side=1)


def test_released_copies_never_push_the_count_past_the_budget() -> None:
    budget = BUDGET  # 32 copies; 200 are held one at a time, each released by its pair
    checker = TensorChecker(verbose=False, eager_mode="equal", max_resident_bytes=budget)
    checker.register_tensor("first", torch.ones(N), side=0)
    assert type(checker._log.groups[("first", 0)].captures[0].value) is HeldBytes
    checker.register_tensor("first", torch.ones(N), side=1)
    for i in range(200):
        _pair(checker, f"t{i}", float(i))
        assert checker._store.resident_bytes <= budget  # the counter the budget rule reads
    assert checker.peak_resident_bytes <= budget
    assert checker.spilled_bytes == 0  # nothing live had to go to disk
    gc.collect()
    assert checker.resident_bytes == 0
    result = checker.check("equal")
    assert result.passed and len(result.results) == 201


def test_held_copies_past_the_budget_spill_oldest_first_with_their_values() -> None:
    budget = BUDGET
    checker = TensorChecker(verbose=False, eager_mode="equal", max_resident_bytes=budget)
    for i in range(40):  # 40 reference copies wait for their candidates: 8 must go to disk
        checker.register_tensor(f"t{i}", torch.full((N,), float(i)), side=0)
    held = [checker._log.groups[(f"t{i}", 0)].captures[0].value for i in range(40)]
    assert checker.peak_resident_bytes <= budget
    # by hand: 32 fit; the 33rd spills the oldest down to 7/8 of the budget (SMALL_SLACK):
    # 5 spilled, 28 held; copies 34-37 fill it again, the 38th spills 5 more: 10 spilled, 30 held
    assert checker.resident_bytes == 30 * ITEM
    assert checker.spilled_bytes == 10 * ITEM
    assert [type(v).__name__ for v in held] == ["Spilled"] * 10 + ["HeldBytes"] * 30
    for i in range(40):
        checker.register_tensor(f"t{i}", torch.full((N,), float(i if i != 2 else -1)), side=1)
    rows = {r["tag"]: r["status"] for r in checker.check("equal").to_rows()}
    assert rows == {f"t{i}": ("mismatch" if i == 2 else "equal") for i in range(40)}


def test_a_copy_shared_by_two_captures_counts_once() -> None:
    checker = TensorChecker(verbose=False, eager_mode="equal")
    t = torch.arange(N, dtype=torch.float32)
    checker.register_tensor("a", t, side=0)
    checker.register_tensor("b", t, side=0)  # the same bytes: one HeldBytes for both
    a = checker._log.groups[("a", 0)].captures[0].value
    b = checker._log.groups[("b", 0)].captures[0].value
    assert type(a) is HeldBytes and a is b
    assert checker.resident_bytes == ITEM
    checker.register_tensor("a", t, side=1)
    assert checker.resident_bytes == ITEM  # still held by "b"
    checker.register_tensor("b", t, side=1)
    gc.collect()
    assert checker.resident_bytes == 0


def test_bookkeeping_stays_bounded_over_a_long_run() -> None:
    checker = TensorChecker(verbose=False, eager_mode="equal")
    small = checker._store.small
    for i in range(20_000):
        _pair(checker, f"t{i}", float(i % 7))
    assert len(checker._store.small.entries) <= 2 * small.RECOUNT_MIN
    assert checker.resident_bytes == 0
    assert checker.check("equal").passed
