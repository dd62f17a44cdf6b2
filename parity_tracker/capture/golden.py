"""The float64 golden: run a model so that every floating op computes in float64 (issue 15).

A budget comparison (:mod:`parity_tracker.compare.budget`) measures each side's error against the
reference computed in float64. Converting the parameters (``module.double()``) is not enough:
a model that casts inside its forward (``x.to(torch.bfloat16)``, ``.half()``, a
``torch.autocast`` region, ``softmax(..., dtype=torch.float32)``) would pull the golden back to
low precision, or crash when a cast output meets float64 weights. :class:`Float64Mode`, a
``TorchDispatchMode`` (``torch/utils/_python_dispatch.py``; the pattern of
``torch/utils/_debug_mode.py``), rewrites every aten call it sees:

- floating tensor arguments are promoted to float64 (complex to complex128); integer and bool
  tensors are kept; arguments the op writes to (in-place ``self``, ``out=``) are left as they
  are, since a promoted copy would lose the write;
- every ``ScalarType`` argument naming a floating dtype (``aten._to_copy(dtype=bfloat16)``
  behind ``.to``/``.half()``/autocast casts, ``arange``/``zeros``/``full``/``empty`` ``dtype=``,
  ``sum(dtype=)``) becomes float64 (complex: complex128): downcasts are no-ops that keep
  float64; integer dtypes are kept;
- ``half_to_float=True`` (``aten._softmax``/``_log_softmax`` under autocast) becomes False;
- a floating output of another dtype that aliases no input is promoted (safety net).

:func:`golden_mode` also sets the default dtype to float64 for its duration, so factories
without a dtype (``torch.zeros(3)``, ``torch.tensor([0.1])``) build float64 directly rather
than float32 values promoted afterwards. Autocast does not cast float64 tensors (its
``is_eligible`` rule), so autocast regions leave the golden in float64.

Random ops: float64 draws different numbers than float32, so a golden run that calls one
(an aten op tagged ``torch.Tag.nondeterministic_seeded``: ``native_dropout``/``bernoulli_``
from dropout in train mode, ``randn``, ``multinomial``, ...) cannot be compared by budget after
that op. The mode records each such call in :attr:`Float64Mode.random_ops`; the caller refuses
(explicit ``budget``: :func:`require_deterministic`, an ``InputError`` naming the op) or falls
back to ``allclose`` with the reason (``auto``). Calls whose dropout probability is 0 or whose
``train``/``training`` flag is False (SDPA with ``dropout_p=0``, RNNs in eval) are not random.

The golden needs float64 support on its device: run it on the CPU (MPS has no float64).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map

from parity_tracker.capture.copies import cast_copy
from parity_tracker.errors import InputError

_NOT_RANDOM_WHEN_ZERO = frozenset({"dropout_p", "dropout"})
_NOT_RANDOM_WHEN_FALSE = frozenset({"train", "training"})
_WIDE = frozenset({torch.float64, torch.complex128})


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """The golden dtype of ``dtype``: float64 for floating, complex128 for complex, else itself."""
    if dtype.is_complex:
        return torch.complex128
    if dtype.is_floating_point:
        return torch.float64
    return dtype


def _promote(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
        wide = wide_dtype(x.dtype)
        return x if x.dtype == wide else x.to(wide)
    return x


def promote(tree: Any) -> Any:
    """Promote every floating tensor of a pytree (args, kwargs, nested lists/dicts) to float64.

    Complex tensors become complex128; integer and bool tensors and non-tensors are kept.
    Tensors already of the golden dtype are returned as they are (no copy).
    """
    return tree_map(_promote, tree)


def golden_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of ``module``: ``copy.deepcopy`` then ``.double()``.

    Built by :func:`parity_tracker.capture.copies.cast_copy` (the same module, without copying
    the weights at their own dtype first).

    ``.double()`` converts floating parameters and buffers (integer buffers are kept); the
    original module is untouched. Costs twice the module's float32 memory. Safe to call
    inside :func:`golden_mode`: the copy runs with dispatch modes disabled (``deepcopy``
    rebuilds tensors with ``new_empty`` + ``set_``, which a float64 rewrite would break).

    Every submodule of the copy also promotes its floating inputs to float64 (a forward
    pre-hook): composite ops such as ``conv2d`` check their argument dtypes before a dispatch
    mode sees them, so a float32 tensor from outside (a drive's inputs, a closure) must be
    promoted before the module runs.
    """
    with _disable_current_modes():
        golden = cast_copy(module, torch.float64)
    for sub in golden.modules():
        if not isinstance(sub, torch.jit.ScriptModule):
            sub.register_forward_pre_hook(_promote_inputs, with_kwargs=True)
    return golden


_ATOMS = frozenset({type(None), bool, int, float, str})


def _already_wide(values) -> bool:
    """True when every value is a plain tensor not to promote, or a ``None``/number/string."""
    for v in values:
        kind = type(v)
        if kind is torch.Tensor:
            if (v.is_floating_point() or v.is_complex()) and v.dtype not in _WIDE:
                return False
        elif kind not in _ATOMS:  # a container, a tensor subclass...: the full tree_map
            return False
    return True


def _promote_inputs(_module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple | None:
    if _already_wide(args) and _already_wide(kwargs.values()):
        return None  # the call keeps its arguments: promote would rebuild them unchanged
    return promote(args), promote(kwargs)


def _value(arg, i: int, args: tuple, kwargs: dict) -> Any:
    """The value an argument has in this call: given, else the schema's default, else None."""
    if arg.name in kwargs:
        return kwargs[arg.name]
    if i < len(args) and not arg.kwarg_only:
        return args[i]
    return arg.default_value if arg.has_default_value() else None


def _random_call(func, args: tuple, kwargs: dict) -> bool:
    """True when ``func`` draws random numbers in this call (module docstring gives the rule)."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    for i, arg in enumerate(func._schema.arguments):
        value = _value(arg, i, args, kwargs)
        if arg.name in _NOT_RANDOM_WHEN_ZERO and value is not None and float(value) == 0.0:
            return False
        if arg.name in _NOT_RANDOM_WHEN_FALSE and value is False:
            return False
    return True


def _written(arg) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def _rewrite(arg, value: Any) -> Any:
    """One argument of a call, rewritten for float64 (module docstring gives the rules)."""
    if _written(arg):
        return value
    if isinstance(value, torch.dtype):
        return wide_dtype(value)
    if arg.name == "half_to_float" and value is True:
        return False
    return tree_map(_promote, value)


def _rewrite_call(func, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    schema = func._schema.arguments
    by_name = {a.name: a for a in schema}
    new_args = tuple(
        _rewrite(schema[i], v) if i < len(schema) else promote(v) for i, v in enumerate(args)
    )
    new_kwargs = {
        name: _rewrite(by_name[name], v) if name in by_name else promote(v)
        for name, v in kwargs.items()
    }
    return new_args, new_kwargs


@dataclass(frozen=True)
class _Plan:
    """What the mode must do for one op overload, read once from its schema."""

    seeded: bool  # tagged nondeterministic_seeded: check whether this call draws
    rewrite: bool  # has a ScalarType or half_to_float argument: always rewrite
    aliased: bool  # an output aliases an input: never replace the output


@functools.cache
def _plan(func) -> _Plan:
    schema = func._schema
    # ScalarType arguments show as int in the Python schema types: read the schema text
    rewrite = "ScalarType" in str(schema) or any(
        a.name == "half_to_float" for a in schema.arguments
    )
    return _Plan(
        seeded=torch.Tag.nondeterministic_seeded in func.tags,
        rewrite=rewrite,
        aliased=any(r.alias_info is not None for r in schema.returns),
    )


def _narrow(values: Any) -> bool:
    """True when a flat sequence holds a floating tensor (or a list of them) not yet wide."""
    for v in values:
        if isinstance(v, torch.Tensor):
            if (v.is_floating_point() or v.is_complex()) and v.dtype not in _WIDE:
                return True
        elif isinstance(v, (list, tuple)) and _narrow(v):
            return True
    return False


@dataclass
class RandomCall:
    """One random op called during the golden run.

    Attributes:
        op: the overload's name, e.g. ``"aten.native_dropout.default"``.
        index: its position among the aten calls of the run (0-based).
    """

    op: str
    index: int


class Float64Mode(TorchDispatchMode):
    """Computes every floating aten op in float64 (module docstring gives the rewrite rules).

    Attributes:
        random_ops: the random calls seen, in call order (:class:`RandomCall`).
        calls: how many aten calls the mode handled.
    """

    def __init__(self) -> None:
        super().__init__()
        self.random_ops: list[RandomCall] = []
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        plan = _plan(func)
        if plan.seeded and _random_call(func, args, kwargs):
            self.random_ops.append(RandomCall(str(func), self.calls))
        self.calls += 1
        if plan.rewrite or _narrow(args) or _narrow(kwargs.values()):
            args, kwargs = _rewrite_call(func, args, kwargs)
        out = func(*args, **kwargs)
        if plan.aliased or not _narrow(out if isinstance(out, (list, tuple)) else (out,)):
            return out
        return promote(out)


@contextmanager
def golden_mode() -> Iterator[Float64Mode]:
    """Run the block as the float64 golden: :class:`Float64Mode` plus default dtype float64.

    Yields:
        The active :class:`Float64Mode` (read ``random_ops`` after the block).

    With the op recorder of :mod:`parity_tracker.capture.ops`, enter this mode inside
    the recording block: it then handles each call first and the recorder sees the float64
    call and its result, while the recorder's own bookkeeping ops stay out of the rewrite
    (both orders were checked to record the same float64 outputs).
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with Float64Mode() as mode:
            yield mode
    finally:
        torch.set_default_dtype(previous)


@dataclass
class GoldenRun:
    """The outputs of a golden run and the random calls it made.

    Attributes:
        output: the module's output (floating tensors in float64).
        random_ops: :attr:`Float64Mode.random_ops` of the run.
    """

    output: Any
    random_ops: list[RandomCall] = field(default_factory=list)


def run_golden(module: torch.nn.Module, *args: Any, **kwargs: Any) -> GoldenRun:
    """Run ``module`` (already a :func:`golden_copy`, or any module) as the float64 golden.

    Floating inputs are promoted to float64, integer inputs kept; the forward runs under
    :func:`golden_mode` and ``torch.no_grad()``.

    Returns:
        A :class:`GoldenRun` with the output and the random calls made.
    """
    with torch.no_grad(), golden_mode() as mode:
        output = module(*promote(args), **promote(kwargs))
    return GoldenRun(output, list(mode.random_ops))


def require_deterministic(random_ops: list[RandomCall], what: str = "the golden run") -> None:
    """Refuse a budget comparison after random ops (explicit ``mode="budget"``).

    Raises:
        InputError: (exit 2) naming the first random op, when ``random_ops`` is not empty.
    """
    if not random_ops:
        return
    first = random_ops[0]
    more = f" (and {len(random_ops) - 1} more random calls)" if len(random_ops) > 1 else ""
    raise InputError(
        f"{what} calls the random op {first.op} (aten call #{first.index}){more}: float64 draws "
        "different random numbers than the candidate's precision, so an error budget is "
        "meaningless after it. If it is dropout, put the model in eval mode (model.eval()); "
        "otherwise use mode='allclose' (mode='auto' falls back to allclose by itself)"
    )


def fallback_reason(random_ops: list[RandomCall]) -> str | None:
    """Why ``mode="auto"`` falls back to ``allclose`` for random ops, or ``None`` if it need not."""
    if not random_ops:
        return None
    return (
        f"budget not used: the float64 golden run calls the random op {random_ops[0].op}; "
        "compared by allclose instead"
    )
