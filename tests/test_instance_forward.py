"""A module whose ``forward`` is assigned to the instance is called, so it is hooked (w11brk1:
it was taken for a container; its weight was captured only at the root's end, after a later
write, and read ``equal``)."""

from __future__ import annotations

import torch
from torch import nn

from parity_tracker import run_parity
from parity_tracker.tensor_checker import DumpMode


def _scaled(value: float, assign: bool = True) -> nn.Sequential:
    root = nn.Sequential(nn.Module(), nn.Identity())
    inner = root[0]
    inner.w = nn.Parameter(torch.full((4,), value))
    if assign:
        inner.forward = lambda x: x * inner.w
    return root


def _rows(ref, cand):
    res = run_parity(ref, cand, (torch.ones(4),), mode="equal", dump_mode=DumpMode.NOT)
    return {(r["tag"], r["kind"]): r for r in res.modules.to_pylist()}


def test_the_instance_forward_is_hooked_and_its_rows_are_right():
    rows = _rows(_scaled(1.0), _scaled(2.0))
    out = rows[("checker_0", "output")]  # x * 1 vs x * 2, x = ones(4): all 4 differ by 1
    assert (out["status"], out["mismatch_count"], out["max_abs_diff"]) == ("mismatch", 4, 1.0)
    inp = rows[("checker_0_input_0", "input")]
    assert inp["status"] == "equal"
    assert rows[("checker_0.w", "param")]["status"] == "mismatch"


class Maybe(nn.Module):
    """Calls ``inner`` only once a forward was assigned to it."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.inner = nn.Module()
        self.inner.w = nn.Parameter(torch.full((4,), value))

    def forward(self, x):
        return self.inner(x) if "forward" in vars(self.inner) else x


def test_a_forward_assigned_after_a_first_run_is_hooked_in_the_next():
    """The install plan kept from the first run must not be reused as it is."""
    ref, cand = Maybe(3.0), Maybe(5.0)
    first = _rows(ref, cand)
    assert ("checker_inner", "output") not in first  # not called, not hooked
    for m in (ref, cand):
        m.inner.forward = lambda x, m=m: x * m.inner.w
    out = _rows(ref, cand)[("checker_inner", "output")]  # 3 vs 5 on ones(4): all differ by 2
    assert (out["status"], out["mismatch_count"], out["max_abs_diff"]) == ("mismatch", 4, 2.0)
