"""Small in-test targets for the CLI tests, used as ``module:function`` specs.

``tiny`` builds two copies of one seeded ``nn.Sequential`` (Linear → ReLU → Linear → Tanh). With
``perturb=fc2`` the candidate's ``2.weight`` moves by 1e-3 (a real, visible divergence in that
module and every module after it); with ``perturb=none`` the pair is bitwise equal.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from parity_tracker.pipeline.case import ParityCase

SETTINGS = {"perturb": ["none", "fc2"], "quantization": ["none", "bf16"]}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Tanh())


def tiny(settings: dict[str, str]) -> ParityCase:
    """Two copies of a seeded MLP; ``perturb=fc2`` (or $PARITY_TEST_PERTURB=fc2) moves layer 2."""
    reference, candidate = _model(), _model()
    perturb = settings.get("perturb", "none")
    if perturb == "fc2" or os.environ.get("PARITY_TEST_PERTURB") == "fc2":
        with torch.no_grad():
            candidate[2].weight.add_(1e-3)
    if settings.get("quantization") == "bf16":
        candidate = candidate.to(torch.bfloat16)
        inputs = (torch.linspace(-1, 1, 24).reshape(3, 8),)
        candidate.register_forward_pre_hook(lambda m, a: tuple(t.to(torch.bfloat16) for t in a))
        return ParityCase(reference, candidate, inputs=inputs, settings={"candidate": "bf16"})
    inputs = (torch.linspace(-1, 1, 24).reshape(3, 8),)
    return ParityCase(reference, candidate, inputs=inputs, settings={"candidate": "copy"})


tiny.SETTINGS = SETTINGS


class _Interrupt(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise KeyboardInterrupt


def interrupting(settings: dict[str, str]) -> ParityCase:
    """The candidate's last module raises KeyboardInterrupt (as Ctrl-C would mid-forward)."""
    inputs = (torch.linspace(-1, 1, 24).reshape(3, 8),)
    candidate = nn.Sequential(*_model(), _Interrupt())
    return ParityCase(_model(), candidate, inputs=inputs)


def broken(settings: dict[str, str]) -> ParityCase:
    """A target whose build raises (for the error paths)."""
    raise RuntimeError("weights file missing")


def loose(settings: dict[str, str]) -> ParityCase:
    """No SETTINGS (any setting accepted). The candidate's ``2.weight`` moves by 1e-3 when
    setting ``a`` holds a comma, or setting ``k`` is listed in $PARITY_TEST_FAIL_K (``1,3``)."""
    reference, candidate = _model(), _model()
    failing = os.environ.get("PARITY_TEST_FAIL_K", "").split(",")
    if "," in settings.get("a", "") or settings.get("k", "-") in failing:
        with torch.no_grad():
            candidate[2].weight.add_(1e-3)
    return ParityCase(reference, candidate, inputs=(torch.linspace(-1, 1, 24).reshape(3, 8),))
