"""The model pairs the harness measures: identical copies, eval mode, fixed seeds.

- ``transformer_pair``: ``nn.TransformerEncoder`` (the issue's "realistic shape": 8 layers,
  d_model 512, sequence 256, batch 2; smaller under ``--quick``).
- ``vae_tiny_pair``: the built-in ``vae-tiny`` target
  (``parity_tracker.builtin_targets.vae_tiny``) with
  inputs made here at the measured resolution.
- ``deep_pair``: a deep stack of cheap elementwise blocks whose per-op activations add up to
  gigabytes, for the peak-memory measurement.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class Pair:
    """A reference/candidate pair with its positional inputs and a label for the table."""

    reference: nn.Module
    candidate: nn.Module
    inputs: tuple[Any, ...]
    label: str


def transformer_pair(layers: int, d_model: int, seq: int, batch: int, seed: int = 0) -> Pair:
    """Two identical ``nn.TransformerEncoder`` copies (eval, dropout off) and one input.

    ``enable_nested_tensor=False`` keeps the forward on the ordinary path (the fast path would
    still run per-layer modules, but nested tensors are not what an engine team compares).
    """
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(
        d_model, nhead=8, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True
    )
    reference = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()
    candidate = copy.deepcopy(reference).eval()
    x = torch.randn(batch, seq, d_model)
    label = f"transformer {layers}×{d_model}, seq {seq}, batch {batch}"
    return Pair(reference, candidate, (x,), label)


def vae_tiny_pair(size: int, batch: int | None = None) -> Pair:
    """The ``vae-tiny`` target's models with a ``size``×``size`` input built here.

    The target decides its own input resolution; the harness keeps its models and makes the
    input at ``size``×``size`` (the issue: 256×256): the target's own photographs resized
    (``vae_tiny.photographs(size=...)``), or uniform noise in [-1, 1] of the same batch,
    channels and dtype when the target has no such helper. ``batch`` keeps the first images
    (default: the target's batch).

    Raises:
        ImportError: ``parity_tracker.builtin_targets.vae_tiny`` does not exist.
    """
    from parity_tracker.builtin_targets import vae_tiny

    case = vae_tiny.build({})
    if case.inputs is None:
        raise ValueError("vae-tiny returned a drive()-style case; the harness needs inputs")
    first = case.inputs[0]
    if not isinstance(first, torch.Tensor) or first.dim() != 4:
        raise ValueError(f"vae-tiny input 0 is not an image batch: {type(first).__name__}")
    batch = batch or first.shape[0]
    if hasattr(vae_tiny, "photographs"):  # the target's own images, at the measured size
        names = tuple(getattr(vae_tiny, "IMAGES", ()))[:batch] or None
        x = vae_tiny.photographs(names, size=size) if names else vae_tiny.photographs(size=size)
        x = x[:batch].to(first.dtype)
    else:
        torch.manual_seed(0)
        x = torch.rand(batch, first.shape[1], size, size, dtype=first.dtype) * 2 - 1
    inputs = (x, *case.inputs[1:])
    label = f"vae-tiny {size}×{size}, batch {x.shape[0]}"
    return Pair(case.reference.eval(), case.candidate.eval(), inputs, label)


class ElementwiseBlock(nn.Module):
    """``tanh(x * scale + shift)``: three aten ops, each producing a tensor the size of ``x``."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.scale = nn.Parameter(1 + 0.01 * torch.randn(1, generator=g), requires_grad=False)
        self.shift = nn.Parameter(0.01 * torch.randn(1, generator=g), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.scale + self.shift)


OPS_PER_BLOCK = 3


def deep_pair(depth: int, numel: int) -> Pair:
    """Two identical stacks of ``depth`` elementwise blocks on a float32 input of ``numel``.

    Captured activations per side: ``depth × 3 × numel × 4`` bytes (each block's mul, add and
    tanh outputs), while the plain forward holds only about two of them at a time.
    """
    reference = nn.Sequential(*[ElementwiseBlock(i) for i in range(depth)]).eval()
    candidate = copy.deepcopy(reference).eval()
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    return Pair(reference, candidate, (x,), f"deep {depth} blocks × {numel * 4 >> 20} MiB")


def captured_bytes(depth: int, numel: int) -> int:
    """Bytes of per-op activations one side of ``deep_pair(depth, numel)`` produces."""
    return depth * OPS_PER_BLOCK * numel * 4


def plain_forwards(pair: Pair) -> None:
    """The baseline: one reference forward and one candidate forward, no_grad, no hooks."""
    with torch.no_grad():
        pair.reference(*pair.inputs)
        pair.candidate(*pair.inputs)
