"""A copy of a module with its floating tensors in another dtype, without copying them first.

The golden (:func:`parity_tracker.capture.golden.golden_copy`: float64) and the twin
(:func:`parity_tracker.capture.twin.make_twin`: the candidate's dtype) of a budget run are
``copy.deepcopy(module)`` followed by a conversion (``.double()`` / ``.to(dtype)``). Copying
every parameter at its own dtype only to convert (and drop) it right after costs one extra
pass over the weights and the memory of a second copy. :func:`cast_copy` gives the same module
by seeding ``deepcopy``'s memo with the converted tensors (the ``memo`` argument of
:func:`copy.deepcopy`, Python's documented way to pre-empt the copy of given objects), so each
weight is read once and written once, at the target dtype.

Same result as ``copy.deepcopy(module)`` then ``Module._apply`` of the conversion: the
converted tensors are new leaves (``nn.Parameter`` with the original ``requires_grad``; plain
tensors for buffers), a tensor registered twice (tied weights) stays one object, integer and
bool tensors are copied by ``deepcopy`` as before, and the conversion is applied afterwards as
well (a no-op on the converted tensors; it also converts what the memo could not cover).
Anything the fast path cannot reproduce exactly (a ``Parameter`` or buffer subclass, a complex
tensor, a non-leaf tensor, a buffer that requires grad, a quantized or non-strided tensor)
makes it fall back to ``deepcopy`` then the conversion.
"""

from __future__ import annotations

import copy
from itertools import chain

import torch


def _plain(t: torch.Tensor) -> bool:
    """True for a tensor whose converted copy is exactly what ``deepcopy`` + convert gives."""
    param = isinstance(t, torch.nn.Parameter)
    return (
        type(t) is (torch.nn.Parameter if param else torch.Tensor)
        and (param or not t.requires_grad)  # .double() of such a buffer records a graph
        and t.is_leaf
        and t.layout == torch.strided
        and not t.is_quantized
        and not t.is_complex()
        and not t.__dict__
    )


def _memo(module: torch.nn.Module, dtype: torch.dtype) -> dict[int, torch.Tensor] | None:
    """``{id(tensor): converted copy}`` of the floating params and buffers, or None (fall back)."""
    memo: dict[int, torch.Tensor] = {}
    for t in chain(module.parameters(), module.buffers()):
        if id(t) in memo or not (t.is_floating_point() or t.is_complex()):
            continue
        if not _plain(t):
            return None
        new = t.detach().to(dtype, copy=True)
        if isinstance(t, torch.nn.Parameter):
            new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
        memo[id(t)] = new
    return memo


def cast_copy(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A deep copy of ``module`` with its floating parameters and buffers converted to ``dtype``.

    Equal to ``copy.deepcopy(module).double()`` for ``torch.float64`` (the golden's
    conversion: complex tensors stay complex) and to ``copy.deepcopy(module).to(dtype)``
    otherwise (the twin's); the module docstring gives the rule and the fallback. ``module`` is
    never modified.

    Args:
        module: the module to copy.
        dtype: a floating dtype.

    Returns:
        The converted copy.
    """
    memo = _memo(module, dtype)
    # ids in the memo stay valid: the originals are alive in ``module`` throughout
    out = copy.deepcopy(module) if memo is None else copy.deepcopy(module, memo)
    # .double() keeps complex tensors complex, as golden_copy always did; .to(dtype) is
    # make_twin's conversion (complex tensors never take the fast path)
    return out.double() if dtype == torch.float64 else out.to(dtype)
