"""An in-test target whose candidate output holds NaN and inf (issue 13, item 3).

``TRUST_NONFINITE=1`` makes the candidate write ``inf`` and ``nan`` into its output; otherwise
the pair is bitwise equal. Used as the ``trust_targets:nonfinite`` spec.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from parity_tracker.pipeline.case import ParityCase


class Blow(nn.Module):
    """Identity, or (candidate with TRUST_NONFINITE=1) inf at [0, 0] and NaN at [0, 1]."""

    def __init__(self, blow: bool) -> None:
        super().__init__()
        self.blow = blow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        if self.blow and os.environ.get("TRUST_NONFINITE") == "1":
            y[0, 0], y[0, 1] = float("inf"), float("nan")
        return y


def _model(blow: bool) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), Blow(blow))


def nonfinite(settings: dict[str, str]) -> ParityCase:
    """Two copies of a seeded Linear; the candidate's output may hold inf and NaN."""
    inputs = (torch.linspace(-1, 1, 8).reshape(2, 4),)
    return ParityCase(_model(False), _model(True), inputs=inputs, settings={"candidate": "copy"})


nonfinite.SETTINGS = {"quantization": ["none"]}
