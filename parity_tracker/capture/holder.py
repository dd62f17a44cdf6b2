"""What the TensorChecker does with each captured tensor: hold a snapshot, or compare at once.

Deferred path: a counted snapshot (parameters pinned: ``Snapshotter.pin``). Eager path
(``TensorChecker(eager_mode=...)``): when the second side's tensor of a tag arrives it is compared
with the held one and both are released, unless the planned dump needs them (``DumpMode``), so peak
memory is one side's activations. Split out of ``parity_tracker.tensor_checker`` (the seed facade).
"""

from __future__ import annotations

from typing import Any

import torch

from parity_tracker.capture.modules import Capture, Group
from parity_tracker.capture.store import Spilled
from parity_tracker.compare.core import Comparison
from parity_tracker.compare.pairing import RELEASED, load, unreadable
from parity_tracker.compare.results import DumpMode
from parity_tracker.statuses import BUDGET, WEIGHT_KINDS, is_failing


class Holder:
    """What the checker does with each captured tensor: hold a snapshot, or compare it at once.

    Deferred path: a counted snapshot (parameters pinned: ``Snapshotter.pin``). Eager path: when the
    second side's tensor of a tag arrives it is compared with the held one and both are released,
    unless the planned dump needs them. Also writes the dumps of a check.
    """

    def __init__(self, checker: Any) -> None:  # the TensorChecker facade that owns it
        self.c = checker
        self.eager_first: dict[bool, Group] = {}

    def on_tensor(self, g: Group, cap: Capture, value: torch.Tensor, alias: bool) -> None:
        """Take ``value``, just captured as ``cap`` of group ``g``: reduce, hold or compare it."""
        c = self.c
        if c.reduce_to is not None:
            cap.value = c.reduce_to(g.tag, g.step, value)
            return
        # the first capture of a group has nothing to be compared with (issue 19: no call)
        ref_i = None if len(g.captures) < 2 else self._eager_reference(g, cap.side)
        if ref_i is None:
            self._keep(cap, value, alias)
            return
        self._eager_compare(g, ref_i, len(g.captures) - 1, value, alias)

    def _keep(self, cap: Capture, value: torch.Tensor, alias: bool) -> None:
        """Hold ``value`` in ``cap``: parameters pinned (``Snapshotter.pin``), the rest counted."""
        if alias:
            cap.value = self.c._snap.pin(value)
            return
        cap.value = copy = self.c._snap.take(value)
        self.c._store.admit(copy, cap)

    def _eager_reference(self, g: Group, side: int) -> int | None:
        """Index of the capture the new one is compared against now, or None to hold it."""
        if self.c.eager_mode is None:
            return None
        i = g.ref_index if g.ref_index is not None else 0
        if len(g.captures) < 2:
            return None
        held = g.captures[i]
        if held.side == side or not isinstance(held.value, (torch.Tensor, Spilled)):
            return None
        return i

    def _eager_compare(self, g: Group, held_i: int, new_i: int, value: Any, alias: bool) -> None:
        held = g.captures[held_i]
        new = g.captures[new_i]
        new_is_ref = new.side < held.side
        ref_i, cand_i = (new_i, held_i) if new_is_ref else (held_i, new_i)
        try:
            held_value = held.value if isinstance(held.value, torch.Tensor) else load(held.value)
        except (OSError, RuntimeError) as exc:  # a spill file removed or cut during the run
            held_value, comp = None, unreadable(g.tag, self.c.eager_mode, exc)
        if g.kind == "param" and held_value is not None:  # the weight, not its copy (unpin)
            held_value = held.value = self.c._snap.unpin(held_value)
        ref, cand = (value, held_value) if new_is_ref else (held_value, value)
        if held_value is not None:
            budget = self.c.eager_mode == BUDGET
            pairs = self.c.budget.for_step(g.step) if budget else self.c._pairs
            comp = pairs.compare(g.tag, ref, cand, self.c.eager_mode, self.c._eager_tol, g.step)
            comp = self.c._snap.verified(g.tag, ref, cand, comp)  # copy-on-write snapshots
        g.ref_index = ref_i
        g.pairs[cand_i] = comp
        if self._eager_keep(g, comp):
            self._keep(new, value, alias)
            if g.kind == "param":  # kept for a dump: its values of now, pinned again
                held.value = self.c._snap.pin(held.value)
        else:
            new.value = held.value = RELEASED

    def _eager_keep(self, g: Group, comp: Comparison) -> bool:
        """Whether the planned dump needs this group's tensors after an eager comparison."""
        mode = self.c.dump_mode
        if mode is DumpMode.NOT:  # the runs' default: nothing is dumped, nothing kept
            return False
        failed = is_failing(comp.status)
        if mode is DumpMode.ALL:
            return True
        if mode is DumpMode.NOT_EQUAL:
            return failed
        if mode is DumpMode.FIRST_NOT_EQUAL and failed:
            weight = g.kind in WEIGHT_KINDS
            best = self.eager_first.get(weight)
            key = (g.captures[g.ref_index].exec_order, g.step)
            if best is not None and (best.captures[best.ref_index].exec_order, best.step) <= key:
                return False
            if best is not None:
                for c in best.captures:
                    if c.is_tensor:
                        c.value = RELEASED
            self.eager_first[weight] = g
            return True
        return False
