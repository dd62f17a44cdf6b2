"""The target contract: what a target builder returns (design.md, "Targets")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ParityCase:
    """One model pair and the way to run it.

    A target is a callable ``build(settings: dict) -> ParityCase``.

    Attributes:
        reference: the model whose outputs are the truth (usually the PyTorch model).
        candidate: the second implementation. A ``torch.nn.Module`` is hooked like the
            reference; anything else (an ONNX session wrapper, a foreign engine) must take part
            through manual ``register_tensor`` calls made by ``drive``.
        inputs: positional inputs of one forward, the same tuple for both sides
            (each side gets its own clone, so an in-place op cannot leak across).
        drive: for multi-step runs, ``drive(model, step_recorder)``; it calls
            ``step_recorder(k)`` (or uses it as ``with step_recorder(k):``) before step ``k`` so
            every capture carries its step. Exactly one of ``inputs`` and ``drive`` is set.
        candidate_drive: optional separate driver for the candidate (e.g. a KV-cache decode
            loop against a full recompute); defaults to ``drive``.
        settings: the settings the case was built with (recorded as MLflow params).
        notes: free text shown in the report (what the candidate is, which int8 scheme, ...).
        tolerances: optional per-tag tolerance overrides ``{glob: (rtol, atol)}``.
        align: optional ``align(tag, reference, candidate) -> (reference, candidate)`` applied
            before each comparison, for pairs that see the same positions in different layouts
            (a KV-cache decode step against a full recompute: slice the recompute's last
            position). Returning ``None`` keeps the pair as it is.
        twin: optional error-budget twin (issue 15): PyTorch at the candidate's precision,
            e.g. a fake-quantized reference for an int8 candidate; default: the reference cast
            to the candidate's compute dtype.
        budgets: optional per-tag error-budget factors ``{glob: k}`` (default k = 2).
    """

    reference: Any
    candidate: Any
    inputs: tuple[Any, ...] | None = None
    drive: Callable[..., Any] | None = None
    candidate_drive: Callable[..., Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    notes: str = ""
    tolerances: dict[str, tuple[float, float]] | None = None
    align: Callable[[str, Any, Any], tuple[Any, Any] | None] | None = None
    twin: Any = None
    budgets: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if (self.inputs is None) == (self.drive is None and self.candidate_drive is None):
            raise ValueError(
                "ParityCase needs exactly one of `inputs` (a tuple of positional inputs) or "
                "`drive` (a callable drive(model, step_recorder)); got "
                f"inputs={'set' if self.inputs is not None else 'None'}, "
                f"drive={'set' if self.drive is not None else 'None'}"
            )
        if self.inputs is not None and not isinstance(self.inputs, tuple):
            self.inputs = (
                (self.inputs,) if isinstance(self.inputs, torch.Tensor) else tuple(self.inputs)
            )
