"""The twin: the reference computed the way PyTorch computes it at the candidate's precision.

Issue 15. The twin is the denominator of the error budget
(:mod:`parity_tracker.compare.budget`): how far PyTorch itself lands from the float64 golden
at the candidate's compute dtype. It is the
reference as the user wrote it (its in-forward casts kept), with its floating parameters and
buffers cast to the candidate's compute dtype. When the candidate computes in the reference's
dtype (another implementation: SDPA, compiled, ONNX, sharded), the twin is the reference
itself. A caller may pass its own twin (e.g. a fake-quantized reference for an int8 candidate).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._pytree import tree_map

from parity_tracker.capture.copies import cast_copy
from parity_tracker.compare.tolerances import as_dtype
from parity_tracker.errors import InputError


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
        (floating parameters and buffers cast, integer ones kept; twice the memory at most),
        built by :func:`parity_tracker.capture.copies.cast_copy` without a copy at the
        reference's own dtype.

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
    return cast_copy(reference, dtype)


_QUANTIZED_MODULES = (
    "torch.ao.nn.quantized",
    "torch.nn.quantized",
    "torch.ao.nn.intrinsic.quantized",
)
_LOW_BIT = frozenset(
    {torch.int8, torch.uint8, torch.qint8, torch.quint8, torch.qint32, torch.quint4x2}
    | {d for d in vars(torch).values() if isinstance(d, torch.dtype) and "float8" in str(d)}
)


def is_quantized(module: Any) -> bool:
    """True when a model holds quantized weights.

    Quantized: a submodule from ``torch.ao.nn.quantized`` (``quantize_dynamic``'s Linear and
    its packed params, static quantized modules), or a parameter/buffer that is a quantized
    tensor or of an int8/uint8/float8 dtype. A non-module candidate is not inspected (False).
    """
    if not isinstance(module, torch.nn.Module):
        return False
    for sub in module.modules():
        if type(sub).__module__.startswith(_QUANTIZED_MODULES):
            return True
    tensors = [*module.parameters(), *module.buffers()]
    return any(t.is_quantized or t.dtype in _LOW_BIT for t in tensors)


def budget_infeasible(reference: Any, candidate: Any, *, twin: Any = None) -> str | None:
    """Why a float64-golden error budget cannot be run for this pair, or ``None`` if it can.

    ``mode="auto"`` falls back to ``allclose`` with this reason; an explicit ``budget`` raises
    it as an :class:`~parity_tracker.errors.InputError`. Random ops are found only by running
    the golden (:attr:`parity_tracker.capture.golden.Float64Mode.random_ops`).

    Reasons: the reference is not a ``torch.nn.Module`` (no golden can be built from it); the
    reference lives on an MPS device (no float64 there); the candidate holds quantized weights
    and no twin is given (PyTorch's own error at int8 is the caller's fake-quantized twin).
    """
    if not isinstance(reference, torch.nn.Module):
        return (
            f"the reference is a {type(reference).__name__}, not a torch.nn.Module: no float64 "
            "golden can be built from it"
        )
    devices = {t.device.type for t in [*reference.parameters(), *reference.buffers()]}
    if "mps" in devices:
        return "the reference is on MPS, which has no float64: move it to the CPU for a budget run"
    if twin is None and is_quantized(candidate):
        return (
            "the candidate holds quantized (int8/float8) weights and no twin was given: pass "
            "twin= (e.g. a fake-quantized reference) for an error budget"
        )
    return None
