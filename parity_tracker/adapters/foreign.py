"""The public adapter for a foreign engine: named intermediate values plus a name map.

Any engine that can return the values it computed under its own names (ONNX Runtime with every
intermediate marked as a graph output, TensorRT with marked layers, a C++ engine's debug dump)
takes part in a parity run module by module through three pieces:

1. :func:`probe_reference` runs the reference once with the checker's hooks and lists the tags
   it produces (:class:`ProbedTag`: module, kind, slot, shape, dtype), so an adapter knows
   which tags exist and whether a module's output is one tensor or a structure;
2. a :class:`NameMap` says, per reference tag, which engine value holds it, or why no engine
   value can (``not_observable``: fused away, folded, no node kept);
3. :class:`ForeignCandidate` is the candidate: its ``drive`` runs the engine once per step,
   registers every mapped value under its tag (``rec.register``) and marks every unmapped tag
   not observable (``rec.mark_not_observable``: a ``skipped`` row with the reason, never
   ``missing_candidate``, never passing).

Adding an engine: write a class with ``run(step_inputs) -> {value name: array}`` (every value
named in the map) and build its :class:`NameMap` from the engine's own naming (see
:mod:`parity_tracker.adapters.onnx` for ONNX Runtime); then
``run_parity(reference, ForeignCandidate(engine, name_map, steps), drive=...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from parity_tracker.capture.hooks import HookHandle, install
from parity_tracker.capture.modules import CaptureLog
from parity_tracker.capture.ops import suspended
from parity_tracker.compare.convert import as_tensor
from parity_tracker.errors import InputError


@dataclass(frozen=True)
class ProbedTag:
    """One tag the reference registers (from :func:`probe_reference`).

    Attributes:
        tag: e.g. ``checker_encoder.conv_in`` or ``checker_model_input_0``.
        module: the module's display name (``model``/``root`` for the root).
        kind: ``input`` | ``output`` | ``param`` | ``buffer``.
        slot: ``output``, ``output.{path}``, ``input.{i}``, or the local parameter name.
        call_index: k for the k-th call of the module in its step.
        step: the step.
        shape: the tensor's shape, ``None`` for a non-tensor leaf.
        dtype: e.g. ``"torch.float32"``, ``None`` for a non-tensor leaf.
    """

    tag: str
    module: str | None
    kind: str
    slot: str
    call_index: int
    step: int
    shape: tuple[int, ...] | None
    dtype: str | None


class _ProbeRecorder:
    """The ``rec`` a drive function gets while the reference is probed (a capture log, side 0).

    Only tags, shapes and dtypes are wanted: tensors are not kept (``on_tensor`` does nothing).
    """

    def __init__(self, log: CaptureLog) -> None:
        self.log = log

    @property
    def step(self) -> int:
        return self.log.step

    def __call__(self, step: int) -> _ProbeRecorder:
        self.log.step = int(step)
        return self

    def __enter__(self) -> _ProbeRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def register(self, tag: str, tensor: Any) -> None:
        log = self.log
        with suspended():
            group = log.capture(
                tag,
                as_tensor(tensor, tag),
                side=0,
                kind="manual",
                module=log.active_module(0),
                slot="manual",
                call_index=0,
                step=log.step,
            )
            log.commit([group])

    def mark_cache_hit(self, module: str) -> None:
        self.log.cache_hits.add((module, self.log.step, 0))

    def mark_not_observable(self, tag: str, reason: str) -> None:
        return None

    def note(self, key: str, value: Any) -> None:
        return None


def probe_reference(reference: torch.nn.Module, drive: Callable[..., Any]) -> list[ProbedTag]:
    """Run ``reference`` once under ``drive`` with every module hooked; list its tags in order.

    The hooks are the capture layer's (:func:`parity_tracker.capture.modules.install`, the ones
    ``run_parity`` and ``TensorChecker`` install), so the tags are exactly those a run records.

    Args:
        reference: the reference module (run in eval mode, restored after, under
            ``torch.no_grad()``).
        drive: ``drive(model, rec)`` as in ``run_parity`` (``rec(k)`` sets the step).

    Returns:
        One :class:`ProbedTag` per tag and step, in registration order.

    Raises:
        InputError: ``reference`` is not a ``torch.nn.Module``.
    """
    if not isinstance(reference, torch.nn.Module):
        raise InputError(
            f"the reference must be a torch.nn.Module to be probed, got {type(reference).__name__}"
        )
    log = CaptureLog(lambda group, capture, tensor, alias: None)
    handle = HookHandle(log, log.claim_side(0), reference)
    flags = [(m, m.training) for m in reference.modules()]
    reference.eval()
    try:
        install(reference, log, handle)
        log.handles.append(handle)
        with torch.no_grad():
            drive(reference, _ProbeRecorder(log))
    finally:
        handle.remove()
        for m, flag in flags:
            m.training = flag
    probed = []
    for g in log.groups.values():
        shape, dtype, _ = g.captures[0].meta or (None, None, None)
        where = (g.module, g.kind, g.slot, g.call_index, g.step)
        probed.append(ProbedTag(g.tag, *where, shape, dtype))
    return probed


@dataclass
class NameMap:
    """Which engine value holds each reference tag, and why the others have none.

    Keys are tags without a step: the same map serves every step of a multi-step run.

    Attributes:
        values: ``{tag: engine value name}``.
        not_observable: ``{tag: reason}`` for tags the engine cannot expose.
        weights: the tags of ``values`` that are parameters or buffers: registered at step 0
            only (the reference registers weights once, at step 0).
    """

    values: dict[str, str] = field(default_factory=dict)
    not_observable: dict[str, str] = field(default_factory=dict)
    weights: set[str] = field(default_factory=set)

    def names(self) -> list[str]:
        """The engine value names the map needs, each once, in map order."""
        return list(dict.fromkeys(self.values.values()))


class ForeignEngine(Protocol):
    """What :class:`ForeignCandidate` needs from an engine."""

    def run(self, inputs: Sequence[torch.Tensor]) -> Mapping[str, Any]:
        """Run one forward on ``inputs`` and return ``{value name: array}`` for mapped values."""
        ...


class ForeignCandidate:
    """A foreign engine as a ``run_parity`` candidate, module by module.

    Args:
        engine: the engine (:class:`ForeignEngine`).
        name_map: the tags it can and cannot show (:class:`NameMap`).
        steps: the positional inputs of each step (one tuple per forward).
        notes: run params recorded with the run (e.g. the ONNX export's settings).

    Attributes:
        drive: ``drive(model, rec)`` for the candidate (``candidate_drive``).
        reference_drive: the same steps for the reference (``drive``).
    """

    def __init__(
        self,
        engine: ForeignEngine,
        name_map: NameMap,
        steps: Sequence[tuple[Any, ...]],
        notes: Mapping[str, Any] | None = None,
    ) -> None:
        self.engine, self.name_map, self.steps = engine, name_map, list(steps)
        self.notes = dict(notes or {})

    def reference_drive(self, model: Any, rec: Any) -> None:
        """Run ``model`` on each step's inputs (step ``k`` = the k-th tuple)."""
        for k, inputs in enumerate(self.steps):
            rec(k)
            model(*inputs)

    def drive(self, model: Any, rec: Any) -> None:
        """Run the engine on each step's inputs and register what the map names."""
        del model
        for k, inputs in enumerate(self.steps):
            rec(k)
            register_values(rec, self.engine.run(inputs), self.name_map)
        for key, value in {**self.notes, **getattr(self.engine, "notes", {})}.items():
            rec.note(key, value)
        rec.note("foreign_tags_mapped", len(self.name_map.values))
        rec.note("foreign_tags_not_observable", len(self.name_map.not_observable))


def register_values(rec: Any, values: Mapping[str, Any], name_map: NameMap) -> None:
    """Register ``values`` under their tags for the current step; mark the rest not observable.

    Args:
        rec: the run's ``StepRecorder`` (or anything with ``register`` / ``mark_not_observable``).
        values: ``{engine value name: tensor or array}`` from one engine run.
        name_map: the map of tags to value names.
    """
    for tag, name in name_map.values.items():
        if tag in name_map.weights and rec.step != 0:
            continue
        if name in values:
            rec.register(tag, values[name])
        else:
            rec.mark_not_observable(tag, f"the engine returned no value named {name!r}")
    for tag, reason in name_map.not_observable.items():
        rec.mark_not_observable(tag, reason)
