"""The checks ``run_parity`` makes on its arguments before anything runs."""

from __future__ import annotations

from typing import Any

from parity_tracker.capture.compiled import is_compiled
from parity_tracker.capture.hooks import refuse_shared, shared_modules
from parity_tracker.errors import InputError


def validate(
    reference: Any,
    candidate: Any,
    inputs: Any,
    drive: Any,
    cand_drive: Any,
    *,
    walk_shared: bool = False,
    twin: Any = None,
) -> bool:
    """Check run_parity's arguments; returns whether the candidate is an ``nn.Module``.

    ``walk_shared``: walk both models for shared module objects here (a budget run: its golden
    forward runs before the hooks' install would refuse them; ``run.budget``), and the caller's
    budget ``twin`` with the candidate.

    Raises:
        InputError: (exit 2) neither or both of ``inputs`` and a drive; a reference that is
            not an ``nn.Module``; a non-module candidate without ``cand_drive``; a candidate
            sharing a module object with the reference or the budget ``twin``
            (:func:`~parity_tracker.capture.hooks.refuse_shared`); a ``twin`` that is not an
            ``nn.Module``.
    """
    import torch

    if (inputs is None) == (drive is None and cand_drive is None):
        raise InputError("run_parity needs exactly one of `inputs` or `drive`/`candidate_drive`")
    if not isinstance(reference, torch.nn.Module):
        raise InputError(f"the reference must be a torch.nn.Module, got {type(reference).__name__}")
    cand_is_module = isinstance(candidate, torch.nn.Module)
    if not cand_is_module and cand_drive is None:
        raise InputError(
            f"candidate {type(candidate).__name__} is not a torch.nn.Module: pass candidate_drive"
            "(model, rec) that registers its tensors with rec.register(tag, tensor)"
        )
    if cand_is_module and (walk_shared or is_compiled(reference) or is_compiled(candidate)):
        # the hooks' install checks every other model (from its install plan, no walk): a
        # compiled one is hooked by its graph and lists no modules there (issue 19: a walk of
        # both models per run cost ≈ 0.3 µs a row on measurement 9)
        refuse_shared(shared_modules(reference.modules(), candidate.named_modules()))
    if twin is not None:
        _check_twin(twin, reference, candidate if cand_is_module and walk_shared else None)
    return cand_is_module


def _check_twin(twin: Any, reference: Any, candidate: Any) -> None:
    """A budget ``twin`` is a module of its own: refuse another type, or modules it shares."""
    import torch

    if not isinstance(twin, torch.nn.Module):
        raise InputError(
            f"twin must be a torch.nn.Module (PyTorch at the candidate's precision, e.g. a "
            f"fake-quantized copy of the reference), got {type(twin).__name__}; pass twin=None "
            "to cast a copy of the reference to the candidate's compute dtype"
        )
    if candidate is not None and twin is not reference:
        refuse_shared(shared_modules(twin.modules(), candidate.named_modules()), other="twin")
