"""The twin: the reference computed the way PyTorch computes it at the candidate's precision.

Issue 15. The twin is the denominator of the error budget (:mod:`parity_tracker.budget`): how
far PyTorch itself lands from the float64 golden at the candidate's compute dtype. It is the
reference as the user wrote it (its in-forward casts kept), with its floating parameters and
buffers cast to the candidate's compute dtype. When the candidate computes in the reference's
dtype (another implementation: SDPA, compiled, ONNX, sharded), the twin is the reference
itself. A caller may pass its own twin (e.g. a fake-quantized reference for an int8 candidate).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import torch
from torch.utils._pytree import tree_map

from parity_tracker.errors import InputError
from parity_tracker.tolerances import as_dtype


def compute_dtype(
    module: torch.nn.Module, override: torch.dtype | str | None = None
) -> torch.dtype | None:
    """The floating dtype a module computes in: the dominant dtype of its floating parameters.

    Dominant: the dtype holding the most elements (ties: the first met in ``parameters()``
    order). Floating buffers count only when the module has no floating parameter.

    Args:
        module: the model (candidate or reference).
        override: a dtype (or name) to return instead, for a model whose parameters do not
            tell (int8 weights computing in bf16, a wrapper around an engine).

    Returns:
        The dtype, or ``None`` when the module holds no floating tensor and no override is
        given.

    Raises:
        InputError: when ``override`` is not a torch dtype name.
    """
    if override is not None:
        return as_dtype(override)
    for tensors in (module.parameters(), module.buffers()):
        counts: Counter[torch.dtype] = Counter()
        for t in tensors:
            if t.is_floating_point():
                counts[t.dtype] += t.numel()
        if counts:
            return counts.most_common(1)[0][0]
    return None


def cast_floating(tree: Any, dtype: torch.dtype) -> Any:
    """Cast every real floating tensor of a pytree to ``dtype``; others are kept as they are."""

    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
            return x.to(dtype)
        return x

    return tree_map(cast, tree)


def make_twin(
    reference: torch.nn.Module,
    candidate_dtype: torch.dtype | str | None,
    *,
    twin: torch.nn.Module | None = None,
) -> torch.nn.Module:
    """The twin of ``reference`` at ``candidate_dtype``.

    Args:
        reference: the reference model; never modified.
        candidate_dtype: the candidate's floating compute dtype (:func:`compute_dtype` of the
            candidate, or an override); ``None`` means the reference's own.
        twin: a caller's own twin, returned as given.

    Returns:
        ``twin`` when given; ``reference`` itself when ``candidate_dtype`` is ``None`` or the
        reference's compute dtype; else ``copy.deepcopy(reference).to(candidate_dtype)``
        (floating parameters and buffers cast, integer ones kept; twice the memory at most).

    Raises:
        InputError: when ``candidate_dtype`` is not a floating dtype.
    """
    if twin is not None:
        return twin
    if candidate_dtype is None:
        return reference
    dtype = as_dtype(candidate_dtype)
    if not dtype.is_floating_point:
        raise InputError(
            f"the twin needs a floating compute dtype, got {dtype}; pass the candidate's "
            "compute dtype (e.g. 'bfloat16') or your own twin (a fake-quantized reference)"
        )
    if compute_dtype(reference) in (None, dtype):
        return reference
    return copy.deepcopy(reference).to(dtype)
