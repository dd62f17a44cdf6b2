"""The seed document's example (section 4, step 1), runnable.

Run it with ``python -m parity_tracker.examples.seed_demo``.

A small encoder with ``conv_in``, ``downsample`` (a ``Sequential`` whose item 1 is a conv) and
``conv_out``; the candidate is identical except for ``downsample.1``, an "engine" conv that
rounds its weights to bfloat16 inside its forward (as a quantized engine kernel would). The
weights themselves are identical, so the pre-flight passes and the printout shows, in order,
the seed's lines::

    TensorChecker: 2 tensors equal in checker_conv_in
    TensorChecker: 2 tensors equal in checker_conv_in_input_0
    TensorChecker: 2 tensors not equal in checker_downsample.1
    TensorChecker: 2 tensors equal in checker_conv_out

and the first divergence is ``checker_downsample.1``.
"""

from __future__ import annotations

import torch
from torch import nn

from parity_tracker.tensor_checker import (
    CheckResult,
    TensorChecker,
    module_register_tensor_checker,
    tensor_checker,
)


class EngineConv2d(nn.Conv2d):
    """A conv whose kernel computes with bfloat16-rounded weights (the candidate's bug)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Convolve ``x`` with the bfloat16-rounded weight (same shapes as ``nn.Conv2d``)."""
        weight = self.weight.to(torch.bfloat16).to(x.dtype)
        return self._conv_forward(x, weight, self.bias)


class Encoder(nn.Module):
    """Two heads over one stem: ``conv_out`` (full resolution) and ``downsample`` (half).

    Args:
        engine: use :class:`EngineConv2d` for ``downsample.1`` (the candidate).

    Input ``(N, 3, H, W)`` float32; outputs ``(N, 8, H, W)`` and ``(N, 8, H/2, W/2)``.
    """

    def __init__(self, engine: bool = False) -> None:
        super().__init__()
        conv = EngineConv2d if engine else nn.Conv2d
        self.conv_in = nn.Conv2d(3, 8, 3, padding=1)
        self.downsample = nn.Sequential(nn.SiLU(), conv(8, 8, 3, stride=2, padding=1))
        self.conv_out = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(conv_out(conv_in(x)), downsample(conv_in(x)))``."""
        h = self.conv_in(x)
        low = self.downsample(h)
        return self.conv_out(h), low


def build(seed: int = 0) -> tuple[Encoder, Encoder, torch.Tensor]:
    """The reference, the candidate (same weights) and an input ``(1, 3, 16, 16)``."""
    torch.manual_seed(seed)
    reference = Encoder().eval()
    candidate = Encoder(engine=True).eval()
    candidate.load_state_dict(reference.state_dict())
    return reference, candidate, torch.randn(1, 3, 16, 16)


def run(checker: TensorChecker | None = None, seed: int = 0) -> CheckResult:
    """Follow the seed's step 1 with ``checker`` (default: the shared instance)."""
    checker = tensor_checker if checker is None else checker
    reference, candidate, x = build(seed)
    with (
        module_register_tensor_checker(reference, checker),
        module_register_tensor_checker(candidate, checker),
        torch.no_grad(),
    ):
        reference(x)
        candidate(x.clone())
    try:
        return checker.check_equal()
    finally:
        checker.clear()


def main() -> int:
    """Run the demo; exit status 0 when the seeded divergence is found where expected."""
    result = run()
    first = result.first_divergence
    ok = first is not None and first.tag == "checker_downsample.1"
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
