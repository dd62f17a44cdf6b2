"""The arguments of a recorded op: its tensor inputs and its call with tensors left out.

Split out of :mod:`parity_tracker.capture.ops` (the recorder). An op's tensor inputs are
numbered in one order, :func:`tensors_in`'s: positional arguments, then keyword values, one
level of lists (``cat``'s ``Tensor[]``). :func:`arg_spec` records the call with each tensor
replaced by its :class:`TensorArg` number, so a reproducer can call the op again with its
saved inputs (``localize.keep``) and a root cause can name the non-tensor arguments that
differ (``localize.root_cause.argument_differences``). :func:`split_args` gives both in one
pass (issue 19: the recorder's per-op path).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

_TENSOR = torch.Tensor


def tensors_in(args: tuple, kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    """Tensor arguments in schema order (one level of lists, e.g. ``cat``)."""
    out: list[torch.Tensor] = []
    for value in itertools.chain(args, kwargs.values()):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


@dataclass(frozen=True)
class TensorArg:
    """Stands for the ``index``-th tensor argument (in :func:`tensors_in` order) of an op."""

    index: int


def arg_spec(args: tuple, kwargs: Mapping[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` with each tensor replaced by a :class:`TensorArg`.

    Tensors are numbered as :func:`tensors_in` lists them (one level of lists), so a
    reproducer can call the op again with its saved inputs.
    """
    return split_args(args, kwargs)[1]


def split_args(
    args: tuple, kwargs: Mapping[str, Any]
) -> tuple[list[torch.Tensor], tuple[tuple, dict[str, Any]]]:
    """``(tensors_in(args, kwargs), arg_spec(args, kwargs))`` in one pass over the arguments.

    Issue 19: the recorder needs both for every captured op; one loop instead of two walks and
    a closure per argument. A list or tuple argument is rebuilt with its own type (``list``,
    ``tuple``, ``torch.Size``), tensors replaced, as :func:`arg_spec` always did.
    """
    tensors: list[torch.Tensor] = []
    spec_args = tuple([_sub(a, tensors) for a in args])
    spec_kwargs = {k: _sub(v, tensors) for k, v in kwargs.items()} if kwargs else {}
    return tensors, (spec_args, spec_kwargs)


def _sub(value: Any, tensors: list[torch.Tensor]) -> Any:
    """``value`` with its tensors (itself, or one level of a list) numbered into ``tensors``."""
    if isinstance(value, _TENSOR):
        tensors.append(value)
        return _tensor_arg(len(tensors) - 1)
    if isinstance(value, (list, tuple)):
        items = []
        for v in value:
            if isinstance(v, _TENSOR):
                tensors.append(v)
                items.append(_tensor_arg(len(tensors) - 1))
            else:
                items.append(v)
        return type(value)(items)
    return value


_TENSOR_ARGS = tuple(TensorArg(i) for i in range(16))


def _tensor_arg(i: int) -> TensorArg:
    """``TensorArg(i)``; the first 16 shared (frozen, equal by value; issue 19: built once)."""
    return _TENSOR_ARGS[i] if i < len(_TENSOR_ARGS) else TensorArg(i)
