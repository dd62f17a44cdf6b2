"""The checks ``run_parity`` makes on its arguments before anything runs."""

from __future__ import annotations

from typing import Any

from parity_tracker.errors import InputError


def validate(reference: Any, candidate: Any, inputs: Any, drive: Any, cand_drive: Any) -> bool:
    """Check run_parity's arguments; returns whether the candidate is an ``nn.Module``.

    Raises:
        InputError: (exit 2) neither or both of ``inputs`` and a drive; a reference that is
            not an ``nn.Module``; a non-module candidate without ``cand_drive``; a candidate
            sharing a module object with the reference (:func:`refuse_shared_modules`).
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
    if cand_is_module:
        refuse_shared_modules(reference, candidate)
    return cand_is_module


def refuse_shared_modules(reference: Any, candidate: Any) -> None:
    """Refuse a candidate that contains one of the reference's module objects.

    Both sides' hooks would sit on that one object: each forward records it on both sides,
    so its rows compare a forward with itself (``equal`` whatever the candidate computes)
    and gain ``@1`` tags the forward never made (w8brk2: ``run_parity(model, model)``).

    Raises:
        InputError: (exit 2) naming the shared module(s) and the fix (a ``copy.deepcopy``).
    """
    ids = set(map(id, reference.modules()))
    shared = [name or "<root>" for name, m in candidate.named_modules() if id(m) in ids]
    if shared:
        listed = ", ".join(shared[:5]) + (f" and {len(shared) - 5} more" if len(shared) > 5 else "")
        raise InputError(
            f"the candidate shares module objects with the reference ({listed}): both sides' "
            "hooks would record them in both forwards; pass copy.deepcopy(candidate) (or "
            "deep-copy the shared submodules) so that each side has its own modules"
        )
