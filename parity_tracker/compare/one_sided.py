"""One-sided tags: why a tag has a value on one side only (missing, structure, cache hit, ...).

Pure functions over the capture log's records (duck-typed, as :mod:`compare.pairing`, which
calls :func:`missing` for a group captured on one side and :func:`cache_hit` for every row):
the missing side, a structure difference at a parent key path, a cache hit, a module that takes
no hooks, a keyword given on one side only, and the next captured boundary.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from parity_tracker.compare.core import Comparison
from parity_tracker.statuses import WEIGHT_KINDS


def leaf_desc(value: Any) -> str:
    """``None``, ``a non-tensor {type}`` or ``a tensor of shape {shape}`` (messages)."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    type_name = getattr(value, "type_name", None)  # capture.leaves.NonTensor
    if type_name is not None:
        return f"a non-tensor {type_name}"
    return f"a tensor of shape {value.size}"  # a spilled snapshot (capture.store.Spilled)


def reference_index(g: Any) -> int:
    """Index of a group's reference capture.

    Set by the eager path, else the first capture of the lowest side.
    """
    if g.ref_index is not None:
        return g.ref_index
    low = min(c.side for c in g.captures)
    return next(i for i, c in enumerate(g.captures) if c.side == low)


def missing(log: Any, g: Any, mode: str, present: int, ref_side: int) -> Comparison:
    """The comparison of a tag captured on one side only: missing, structure or cache hit."""
    absent = "candidate" if present == ref_side else "reference"
    cap = next((c for c in g.captures if c.is_tensor), None)
    shape, dtype, device = (cap.meta if cap is not None else None) or (None, None, None)
    side_fields = (
        dict(ref_shape=shape, ref_dtype=dtype, ref_device=device)
        if absent == "candidate"
        else dict(cand_shape=shape, cand_dtype=dtype, cand_device=device)
    )
    numel = None if shape is None else math.prod(shape)
    absent_sides = {ref_side} if absent == "reference" else (log.sides - {present}) or {1}
    hidden = log.not_observable.get((g.tag, g.step))
    if absent == "candidate" and hidden is not None:  # a compiled/foreign engine (adapters)
        status, message = "skipped", f"not observable: {hidden}"
    elif cache_hit(log, g, absent_sides):
        status = "skipped"
        message = (
            f"module {g.module!r} was skipped by a cache at step {g.step} (cache hit); "
            f"the {absent} has no tensor for {g.tag}"
        )
    elif (reason := unhooked_reason(log, g, absent_sides)) is not None:
        status = "skipped"
        message = not_captured_message(log, g, absent, reason)
    elif _defaulted_keyword(g, shape, cap):
        status = "skipped"
        message = (
            f"keyword input {g.slot.split('.', 2)[1]!r} of module {g.module!r} was given on "
            f"the {'reference' if absent == 'candidate' else 'candidate'} only (the {absent} "
            "left it to its default): not compared; the module's outputs are"
        )
    elif cap is None:  # a non-tensor leaf on one side only: a structure difference
        leaf = next(c.value for c in g.captures if c.value is not None)
        status = f"missing_{absent}"
        message = (
            f"structure differs at {g.tag}: the {absent} has no such leaf, the other side "
            f"has {leaf_desc(leaf)} (not compared)"
        )
    else:
        structure = structure_gap(log, g, present)
        status = "shape_mismatch" if structure else f"missing_{absent}"
        message = structure or missing_message(log, g, absent, present)
    return Comparison(status=status, mode=mode, numel=numel, message=message, **side_fields)


def _defaulted_keyword(g: Any, shape: tuple[int, ...] | None, cap: Any) -> bool:
    """A one-sided keyword input that is a flag or number (0-d) or a non-tensor leaf.

    ``f(x, use_cache=False)`` against ``f(x)`` is the same call when False is the default;
    such a leaf is reported (``skipped``, named), not failed. One-sided tensor keywords and
    positional inputs stay structure differences.
    """
    if g.kind != "input" or not g.slot.startswith("input."):
        return False
    name = g.slot.split(".", 2)[1]
    return not name.isdigit() and (cap is None or shape == ())


def structure_gap(log: Any, g: Any, present: int) -> str | None:
    """A message when the absent side holds a non-tensor leaf at a parent key path.

    E.g. the reference's ``hidden_states`` is ``None`` while the candidate's is a tuple of
    tensors: ``..._output_hidden_states.0`` exists on the candidate only.
    """
    if g.kind not in ("input", "output"):
        return None
    tag = g.tag
    while "." in tag:
        tag = tag.rsplit(".", 1)[0]
        parent = log.groups.get((tag, g.step))
        if parent is None:
            continue
        other = next((c for c in parent.captures if c.side != present), None)
        if other is not None and not other.is_tensor:
            side = "reference" if other.side < present else "candidate"
            return (
                f"structure differs at {g.tag}: the {side} has {leaf_desc(other.value)} "
                f"at {tag}, the other side a tensor of shape {g.captures[0].meta[0]}"
            )
    return None


def missing_message(log: Any, g: Any, absent: str, present: int) -> str:
    """Why a tag has no tensor on the ``absent`` side (module not called, no such slot, ...)."""
    msg = f"no {absent} tensor registered for {g.tag}"
    if g.module is None or g.kind in WEIGHT_KINDS:
        return msg
    other = [s for s in log.hooked if s != present]
    if not other:
        return msg
    calls = max(log.calls.get((s, g.step, g.module), 0) for s in other)
    if calls:
        return (
            f"{msg}: module {g.module!r} ran {calls} time(s) on the {absent} at step "
            f"{g.step}, this is call {g.call_index}"
            if g.call_index >= calls
            else f"{msg}: the {absent}'s module {g.module!r} has no such {g.kind} ({g.slot})"
        )
    if any(g.module in log.hooked[s] for s in other):
        return f"{msg}: module {g.module!r} exists on the {absent} but was not called there"
    return f"{msg}: the {absent} has no module named {g.module!r} (one-sided name)"


def unhooked_reason(log: Any, g: Any, absent: set[int]) -> str | None:
    """Why ``g``'s module (or a module enclosing it) takes no hooks on an absent side, or None.

    ``log.unhooked`` maps side -> {module display name: reason} (TorchScript submodules,
    modules whose hook registration raised): such a module exists but is not captured.
    """
    if g.module is None or g.kind in WEIGHT_KINDS:
        return None
    for side in absent:
        for name, reason in getattr(log, "unhooked", {}).get(side, {}).items():
            if g.module == name or g.module.startswith(name + "."):
                return f"is inside {name!r}, which {reason}" if name != g.module else reason
    return None


def not_captured_message(log: Any, g: Any, absent: str, reason: str) -> str:
    """The message of a tag whose module exists on ``absent`` but takes no hooks.

    For an output, names the next captured boundary (the first paired input, in the
    reference's execution order, of a module called after this one at the same step): the
    module's output is compared there as that module's input.
    """
    msg = (
        f"not captured: module {g.module!r} exists on the {absent} but {reason}; "
        f"{g.tag} is not compared"
    )
    if g.kind != "output":
        return msg
    nxt = next_boundary(log, g)
    if nxt is None:
        return msg + " (no captured boundary follows it)"
    return msg + f"; its output is read at the next captured boundary, {nxt.tag}"


def next_boundary(log: Any, g: Any) -> Any:
    """The first input group captured on both sides after ``g`` (reference order), or None."""
    after = g.captures[0].exec_order
    best = None
    for other in log.groups.values():
        if other.step != g.step or other.kind != "input" or len(other.captures) < 2:
            continue
        if len({c.side for c in other.captures}) < 2 or not any(
            c.is_tensor for c in other.captures
        ):
            continue
        if other.module == g.module or (other.module or "").startswith(g.module + "."):
            continue
        order = other.captures[reference_index(other)].exec_order
        if order > after and (best is None or order < best[0]):
            best = (order, other)
    return None if best is None else best[1]


def cache_hit(log: Any, g: Any, absent: set[int] | None = None) -> bool | None:
    """Whether a cache skipped ``g``'s module at its step (``None``: no cache in play).

    A mark covers the module and its submodules (the root's name covers all). With
    ``absent`` given, only marks for one of those sides (or for no side) count.
    """
    if not log.cache_hits:
        return None
    if g.module is None:
        return False
    roots = log.roots
    for module, step, side in log.cache_hits:
        if step != g.step or (absent is not None and side is not None and side not in absent):
            continue
        if module in roots or g.module == module or g.module.startswith(module + "."):
            return True
    return False
