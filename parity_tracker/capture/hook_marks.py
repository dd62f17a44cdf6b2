"""Which forward hooks are parity_tracker's own capture hooks, and dropping them from a copy.

A hook registered on a module lives in the module's hook dictionaries, so ``copy.deepcopy``
(and :func:`parity_tracker.capture.copies.cast_copy`) copies it with the module; Python
functions are copied by reference, so a copied capture hook still records into the original
checker. The golden and twin copies of a budget run must not: their forwards would add a
third and fourth model to the checker the reference is registered on. Our capture hooks carry
the attribute :data:`MARK`; a user's own hooks do not and are kept (they are part of the
model's behaviour).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

MARK = "__parity_tracker_capture_hook__"
"""Attribute set (to True) on every forward hook function parity_tracker's capture adds."""

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks")
_FLAG_DICTS = (
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


def mark_capture_hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as a parity_tracker capture hook and return it (a plain function)."""
    setattr(fn, MARK, True)
    return fn


def is_capture_hook(fn: Any) -> bool:
    """True for a hook marked by :func:`mark_capture_hook` (a bound method reads its function)."""
    return getattr(fn, MARK, False) is True


def drop_capture_hooks(module: torch.nn.Module) -> int:
    """Remove parity_tracker's capture hooks from every submodule of ``module``, in place.

    Meant for a fresh copy (the golden, the twin): its hooks are the original's, by reference.
    Other hooks (the user's, the golden's input promotion) are kept in their order.

    Args:
        module: the copied module.

    Returns:
        The number of hooks removed.
    """
    removed = 0
    for sub in module.modules():
        for name in _HOOK_DICTS:
            hooks = getattr(sub, name, None)
            if not hooks:
                continue
            for hook_id in [k for k, fn in hooks.items() if is_capture_hook(fn)]:
                del hooks[hook_id]
                removed += 1
                for flags in _FLAG_DICTS:
                    getattr(sub, flags, {}).pop(hook_id, None)
    return removed
