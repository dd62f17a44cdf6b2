"""Rows of modules no side ever called come out in the model's module order, every run.

They were once built from a set of names, so their order (and with it the row order of a
stored ``modules.parquet``) changed with ``PYTHONHASHSEED`` from one run to the next.
"""

from __future__ import annotations

import torch
from torch import nn

from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode


class Unused(nn.Module):
    """One used Linear and twenty-four submodules that forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(3, 3)
        self.spare = nn.ModuleList(nn.Identity() for _ in range(24))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_never_called_rows_follow_module_order():
    torch.manual_seed(0)
    ref = Unused().eval()
    cand = Unused().eval()
    cand.load_state_dict(ref.state_dict())
    out = run_parity(ref, cand, torch.randn(2, 3), mode="equal", dump_mode=DumpMode.NOT)
    rows = out.modules.to_pylist()
    skipped = [r["module"] for r in rows if r["status"] == "skipped" and r["kind"] == "output"]
    # the order nn.Module.named_modules gives, written out by hand: spare.0 … spare.23
    assert [m.rsplit(".", 1)[-1] for m in skipped] == [str(i) for i in range(24)]
