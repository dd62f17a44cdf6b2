"""Leaves of what a module sees: flatten inputs/outputs to tagged leaves, own tensors.

The tag strings come from :mod:`parity_tracker.capture.tags`; this module only walks the
structures (tuples, lists, mappings, dataclasses) and names each leaf's slot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from parity_tracker.capture.tags import (
    ROOT_NAME,
    input_tag,
    module_display_name,
    output_tag,
)
from parity_tracker.compare.convert import as_tensor  # re-exported: capture.as_tensor
from parity_tracker.errors import InputError

_MAX_DEPTH = 32


class NonTensor:
    """A leaf of an input or output structure that is neither a tensor nor ``None``.

    A tensor on one side against something else on the other is a structure difference; two
    non-tensor leaves are not compared but get a ``skipped`` row naming both types; one present
    on one side only is a structure difference (``missing_*``). Numbers are not NonTensor: they
    are compared as 0-d tensors.

    Attributes:
        type_name: the leaf's type name, e.g. ``"int"`` or ``"DynamicCache"``.
    """

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


def is_scalar(obj: Any) -> bool:
    """True for Python ``bool``/``int``/``float``/``complex`` and numpy scalars (0-d values)."""
    return isinstance(obj, _SCALARS)


#: :func:`is_scalar`'s types, as a tuple (``isinstance`` with a tuple: ≈ 0.28 µs less than with
#: the ``X | Y`` union on a non-scalar, issue 19: asked of every structured leaf)
_SCALARS = (bool, int, float, complex, np.generic)


def scalar_leaf(obj: Any) -> Any:
    """A scalar as the 0-d tensor it is compared as, or a :class:`NonTensor` when it has none.

    Python numbers keep their exact value (``compare.convert.scalar_tensor``: float64 for a
    float); numpy scalars keep their dtype. An int outside int64, or a numpy scalar without a
    torch dtype (``numpy.str_``, datetimes), is a non-tensor leaf named with its type.
    """
    kind = type(obj)
    if (kind is bool or (kind is int and -_SHARED_INTS <= obj <= _SHARED_INTS)) and _plain_mode():
        return _shared_scalar(kind, obj)
    try:
        return as_tensor(obj)
    except (InputError, TypeError, ValueError, RuntimeError):
        return NonTensor(f"{type(obj).__name__} (no torch dtype holds {obj!r})")


#: Python ints in ``[-N, N]`` (and both bools) share one 0-d tensor per value (flags such as
#: ``is_causal`` or ``use_cache`` and small counts recur at every module call).
_SHARED_INTS = 1024
_SHARED: dict[tuple[type, int], torch.Tensor] = {}


def _shared_scalar(kind: type, value: int) -> torch.Tensor:
    """The shared 0-d tensor of a bool or small int, re-made unless it still holds ``value``.

    ``torch.tensor`` costs ≈ 5 µs a call; the shared tensor is checked instead (version counter
    untouched and ``item()`` equal to ``value``: ≈ 1 µs), so a capture never carries a value
    that differs from the one the module received. Captures never hand it to the model, and
    every holder that keeps it past the comparison keeps a snapshot (a copy).
    """
    key = (kind, value)
    t = _SHARED.get(key)
    if t is None or t.is_inference() or t._version != 0 or t.item() != value:
        t = as_tensor(value)
        if type(t) is torch.Tensor and t.is_cpu and not t.is_inference():
            _SHARED[key] = t
    return t


def _plain_mode() -> bool:
    """True when ``torch.tensor`` would make a plain CPU tensor here.

    No torch function mode (``torch.device(...)`` blocks, a default device) and no dispatch
    mode (fake tensors, tracing) is active.
    """
    return not torch._C._is_torch_function_mode_enabled() and _get_current_dispatch_mode() is None


def is_tensor_like(obj: Any) -> bool:
    """True for torch tensors, numpy arrays and objects exposing ``__dlpack__``."""
    return isinstance(obj, (torch.Tensor, np.ndarray)) or hasattr(obj, "__dlpack__")


def flatten(obj: Any, path: tuple[str, ...] = (), depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Yield ``(key path, leaf)`` for every leaf of a nested structure, in a stable order.

    Tuples and lists are keyed by index, mappings by ``str(key)`` (insertion order), dataclass
    instances (Hugging Face ``ModelOutput`` included, so ``None`` fields are kept) by field
    name. A leaf is a tensor-like object, ``None``, a number or numpy scalar as a 0-d tensor
    (:func:`scalar_leaf`), or a :class:`NonTensor` marker naming any other type.

    Args:
        obj: the structure (an output, an input, a keyword argument).
        path: the key path of ``obj`` itself.
        depth: recursion depth so far; structures deeper than 32 levels become a leaf.

    Yields:
        ``(path, leaf)`` with the path's keys joined by ``.`` (``""`` for ``obj`` itself).
    """
    kind = type(obj)
    # exactly a tuple or list is never a dataclass or a Mapping: no ABC check (issue 19)
    if (kind is tuple or kind is list) and depth < _MAX_DEPTH:
        for i, v in enumerate(obj):
            if v is None or isinstance(v, torch.Tensor):  # the child's one leaf, directly
                yield ".".join((*path, str(i))), v
            else:
                yield from flatten(v, (*path, str(i)), depth + 1)
        return
    key = ".".join(path)
    if obj is None or is_tensor_like(obj):
        yield key, obj
    elif is_scalar(obj):
        yield key, scalar_leaf(obj)
    elif depth >= _MAX_DEPTH:
        yield key, NonTensor(type(obj).__name__)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for name in field_names(obj):
            v = getattr(obj, name, None)
            if v is None or isinstance(v, torch.Tensor):  # the child's one leaf, directly
                yield ".".join((*path, name)), v
            else:
                yield from flatten(v, (*path, name), depth + 1)
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from flatten(v, (*path, str(k)), depth + 1)
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from flatten(v, (*path, str(i)), depth + 1)
    else:
        yield key, NonTensor(type(obj).__name__)


#: ``id(__dataclass_fields__) -> (that dict, its length, field names)``, see :func:`field_names`
_FIELD_NAMES: dict[int, tuple[dict, int, tuple[str, ...]]] = {}


def field_names(obj: Any) -> tuple[str, ...]:
    """The names of ``dataclasses.fields(obj)``, in order, listed once per dataclass.

    ``dataclasses.fields`` filters the class's ``__dataclass_fields__`` on every call (≈ 1 µs
    for a Hugging Face ``ModelOutput``, met at every decoding step, issue 19); the names are
    kept by that dict's identity and length (the entry holds the dict, so its id is never
    reused while kept). At most 256 classes are kept.
    """
    fields = obj.__dataclass_fields__  # what dataclasses.fields reads
    got = _FIELD_NAMES.get(id(fields))
    if got is None or got[0] is not fields or got[1] != len(fields):
        if len(_FIELD_NAMES) >= 256:
            _FIELD_NAMES.clear()
        names = tuple(f.name for f in dataclasses.fields(obj))
        got = _FIELD_NAMES[id(fields)] = (fields, len(fields), names)
    return got[2]


def output_leaves(base: str, output: Any) -> list[tuple[str, str, Any]]:
    """``(tag, slot, leaf)`` for a module output.

    A single tensor (or ``None``) is ``checker_{base}`` with slot ``output``; anything else is
    flattened to ``checker_{base}_output_{path}`` with slot ``output.{path}``.
    """
    if output is None or is_tensor_like(output):
        return [(output_tag(base), "output", output)]
    if is_scalar(output):
        return [(output_tag(base), "output", scalar_leaf(output))]
    kind = type(output)
    if kind is tuple or kind is list:  # flatten's leaves, its tensor children directly
        out = []
        for i, v in enumerate(output):
            if v is None or isinstance(v, torch.Tensor):
                p = str(i)
                out.append((output_tag(base, p), f"output.{p}", v))
            else:
                nested = flatten(v, (str(i),), 1)
                out += [(output_tag(base, p), f"output.{p}", x) for p, x in nested]
        return out
    return [(output_tag(base, p), f"output.{p}", leaf) for p, leaf in flatten(output)]


#: Python numbers: no ``__dlpack__``, so :func:`flatten` makes each one :func:`scalar_leaf`
PY_NUMBERS = frozenset({bool, int, float, complex})


def input_leaves(
    base: str, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None
) -> list[tuple[str, str, Any]]:
    """``(tag, slot, leaf)`` for a call's positional and keyword inputs, positional first.

    Positional input ``i`` is ``checker_{base}_input_{i}``, keyword input ``name`` is
    ``checker_{base}_input_{name}``; a structured input appends its key path with ``.``.
    """
    names = input_names(base, len(args), kwargs.keys() if kwargs else ())
    values = (*args, *kwargs.values()) if kwargs else args
    leaves: list[tuple[str, str, Any]] = []
    for (name, tag, slot), value in zip(names, values, strict=True):
        value_leaves(base, name, tag, slot, value, leaves)
    return leaves


def input_names(base: str, nargs: int, keys: Iterable[str]) -> list[tuple[str, str, str]]:
    """``(name, tag, slot)`` of each top-level input of a call, positional first.

    The name of positional input ``i`` is ``str(i)``, a keyword input's is its keyword; the tag
    is :func:`parity_tracker.capture.tags.input_tag` and the slot ``input.{name}``. The hooks
    keep this list per call signature (issue 19: formatted once per module, not per call).
    """
    names = [str(i) for i in range(nargs)]
    names += [str(k) for k in keys]
    return [(name, input_tag(base, name), f"input.{name}") for name in names]


def value_leaves(base: str, name: str, tag: str, slot: str, value: Any, out: list) -> None:
    """Append the ``(tag, slot, leaf)`` of one top-level input ``name`` to ``out``.

    ``tag`` and ``slot`` are the input's own (:func:`input_names`); a structured value is
    flattened (:func:`flatten`) and each leaf appends its key path to the name.
    """
    if value is None or isinstance(value, torch.Tensor):  # flatten's one leaf, directly
        out.append((tag, slot, value))
        return
    kind = type(value)
    if kind in PY_NUMBERS:  # flatten's one leaf too (use_cache flags, issue 19)
        out.append((tag, slot, scalar_leaf(value)))
        return
    if kind is tuple or kind is list:  # flatten's leaves, its tensor children directly
        for i, v in enumerate(value):
            if v is None or isinstance(v, torch.Tensor):  # position_embeddings (cos, sin)
                suffix = f"{name}.{i}"
                out.append((input_tag(base, suffix), f"input.{suffix}", v))
            else:
                for p, leaf in flatten(v, (str(i),), 1):
                    suffix = f"{name}.{p}"
                    out.append((input_tag(base, suffix), f"input.{suffix}", leaf))
        return
    for p, leaf in flatten(value):
        suffix = f"{name}.{p}" if p else name
        out.append((input_tag(base, suffix), f"input.{suffix}", leaf))


def opaque_leaf(obj: Any) -> NonTensor | None:
    """:func:`flatten`'s one leaf for ``obj`` when it is neither walked nor converted, else None.

    The same tests as :func:`flatten`, in its order (tensor-like, number, dataclass instance,
    ``Mapping``, tuple or list): None when any holds (``obj`` is a tensor-like leaf, a scalar or
    a structure, see :func:`flatten`); otherwise the :class:`NonTensor` naming ``type(obj)``,
    which is what :func:`flatten` yields for ``obj`` at any depth below 32 (a ``DynamicCache``
    input, say). Asked again at every call: none of these tests is decided by the type alone
    (``__dlpack__`` may be an instance attribute, ``Mapping`` registrations change).
    """
    if obj is None or is_tensor_like(obj) or isinstance(obj, _SCALARS):
        return None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return None
    if isinstance(obj, (Mapping, tuple, list)):
        return None
    return NonTensor(type(obj).__name__)


def planned_value_leaves(
    plans: dict, base: str, name: str, tag: str, slot: str, value: Any, out: list
) -> None:
    """:func:`value_leaves` of a structured input, with the input's plan kept in ``plans``.

    ``plans`` (one dict per module call signature, ``ModuleSite.sig``) keeps, per input name,
    the ``(tag, slot)`` of each child of a tuple or list input (``(type, length, names)``:
    formatted once, used while the input is a tuple/list of that exact type and length). What
    each child is (a tensor or ``None`` taken directly, anything else flattened as
    :func:`value_leaves` does) and whether a non-sequence input is an opaque leaf
    (:func:`opaque_leaf`) are tested at every call; any other input goes through
    :func:`value_leaves`. The leaves, tags and slots are :func:`value_leaves`'.
    """
    kind = type(value)
    if kind is tuple or kind is list:
        plan = plans.get(name)
        n = len(value)
        if plan is None or plan[0] is not kind or plan[1] != n:
            plan = plans[name] = (kind, n, _child_names(base, name, n))
        for (ctag, cslot, i), v in zip(plan[2], value):  # noqa: B905 (one name a child)
            if v is None or isinstance(v, torch.Tensor):  # position_embeddings (cos, sin)
                out.append((ctag, cslot, v))
            else:
                for p, leaf in flatten(v, (i,), 1):
                    s = f"{name}.{p}"
                    out.append((input_tag(base, s), f"input.{s}", leaf))
        return
    leaf = opaque_leaf(value)
    if leaf is not None:  # flatten's key "": the input's own tag and slot
        out.append((tag, slot, leaf))
        return
    value_leaves(base, name, tag, slot, value, out)


def _child_names(base: str, name: str | None, n: int) -> tuple[tuple[str, str, str], ...]:
    """``(tag, slot, index)`` of children ``0 … n-1`` of input ``name`` (None: of the output)."""
    if name is None:
        return tuple((output_tag(base, str(i)), f"output.{i}", str(i)) for i in range(n))
    return tuple((input_tag(base, f"{name}.{i}"), f"input.{name}.{i}", str(i)) for i in range(n))


def planned_output_leaves(
    plan: tuple | None, base: str, output: Any
) -> tuple[list[tuple[str, str, Any]], tuple | None]:
    """:func:`output_leaves` of a structured output, and the plan for the site's next call.

    ``plan`` (the last one returned for this module and call index, or None) keeps the
    ``(tag, slot)`` of each child: ``(type, length, names)`` for a tuple or list output,
    ``(type, field names, names)`` for a dataclass output (a Hugging Face ``ModelOutput``),
    used only while the output is of that exact type and length / field-name tuple. Tested at
    every call, in :func:`flatten`'s order: tensor-like, number, tuple/list, dataclass
    instance; each child is a tensor or ``None`` (taken directly), an opaque leaf
    (:func:`opaque_leaf`, under the child's own tag) or walked by :func:`flatten`. Anything
    else goes through :func:`output_leaves` (no plan). The leaves, tags and slots are
    :func:`output_leaves`'.
    """
    if output is None or is_tensor_like(output) or isinstance(output, _SCALARS):
        return output_leaves(base, output), None
    kind = type(output)
    if kind is tuple or kind is list:
        key: Any = len(output)
        values: Any = output
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        key = field_names(output)
        values = [getattr(output, f, None) for f in key]
    else:
        return output_leaves(base, output), None
    if plan is None or plan[0] is not kind or plan[1] != key:
        if kind is tuple or kind is list:
            names = _child_names(base, None, key)
        else:
            names = tuple((output_tag(base, f), f"output.{f}", f) for f in key)
        plan = (kind, key, names)
    out: list[tuple[str, str, Any]] = []
    for (ctag, cslot, path), v in zip(plan[2], values):  # noqa: B905 (one name a child)
        if v is None or isinstance(v, torch.Tensor):
            out.append((ctag, cslot, v))
            continue
        leaf = opaque_leaf(v)
        if leaf is not None:  # flatten(v, (path,), 1) yields (path, leaf)
            out.append((ctag, cslot, leaf))
        else:
            out += [(output_tag(base, p), f"output.{p}", x) for p, x in flatten(v, (path,), 1)]
    return out, plan


def own_tensors(
    model: torch.nn.Module,
    root: str = ROOT_NAME,
    walk: Iterable[tuple[str, torch.nn.Module]] | None = None,
    classes: dict[type, bool] | None = None,
) -> dict[int, list[tuple[str, str, str, str]]]:
    """Each module object's own parameters and buffers under every qualified name.

    Args:
        model: the hooked model.
        root: the root's display name (:func:`root_name`).
        walk: ``model.named_modules(remove_duplicate=False)`` when the caller has listed it
            already (the hooks' install walks the model once, issue 19).
        classes: the memo of :func:`has_packed_params` for this walk.

    Returns:
        ``{id(module): [(qualified name, owner module display name, local name, kind), ...]}``
        where kind is ``"param"`` or ``"buffer"``. A module reachable under several names (a
        shared submodule) lists its tensors under each name, once per qualified name.
    """
    table: dict[int, list[tuple[str, str, str, str]]] = {}
    seen: set[str] = set()
    if walk is None:
        walk = model.named_modules(remove_duplicate=False)
    for mname, mod in walk:
        entries = table.setdefault(id(mod), [])
        owner = module_display_name(mname, root)  # once per module (issue 19)
        for kind, store in (("param", mod._parameters), ("buffer", mod._buffers)):
            if not store:
                continue
            # the slot's value as read_own reads it (TorchScript's store lists its values
            # through items() too); a slot holding None has no tensor
            for local, value in list(store.items()):
                qname = f"{mname}.{local}" if mname else local
                if value is None or qname in seen:
                    continue
                seen.add(qname)
                entries.append((qname, owner, local, kind))
        for local in packed_names(mod, classes):
            qname = f"{mname}.{local}" if mname else local
            if qname not in seen:
                seen.add(qname)
                entries.append((qname, owner, local, PACKED))
    return table


#: The ``own_tensors`` kind of a packed quantized weight/bias (captured as kind ``param``).
PACKED = "packed"


def packed_names(mod: torch.nn.Module, classes: dict[type, bool] | None = None) -> list[str]:
    """``["weight", "bias"]`` for a packed quantized module, else ``[]``.

    Packed modules (``torch.ao.nn.quantized`` and ``.dynamic`` Linear/Conv*, quantized
    Embedding) keep their weight in a ``_packed_params`` object with no tensor attribute; they
    expose it through the methods ``weight()`` / ``bias()`` (``torch/ao/nn/quantized/modules``).
    Only modules whose class defines those as methods count, so the ``LinearPackedParams``
    holder inside a quantized Linear is not reported twice. ``classes``: see
    :func:`has_packed_params`.
    """
    if not has_packed_params(mod, classes):
        return []
    return [n for n in ("weight", "bias") if callable(getattr(type(mod), n, None))]


def has_packed_params(mod: torch.nn.Module, classes: dict[type, bool] | None = None) -> bool:
    """``hasattr(mod, "_packed_params")`` without raising inside ``nn.Module.__getattr__``.

    For a module class with the standard attribute lookup, the attribute can only live in the
    instance dict, the class, ``_parameters``, ``_buffers`` or ``_modules``; when it is in none
    of them the answer is False (≈ 0.5 µs instead of the ≈ 1.3 µs of building the
    AttributeError; asked twice per module per side when hooks are installed). Any other case
    asks ``hasattr``.

    Args:
        mod: the module.
        classes: a memo of the class's part of the test (standard lookup, no class attribute
            ``_packed_params``) for one walk over a model (issue 19: ≈ 0.3 µs per module).
    """
    cls = type(mod)
    plain = None if classes is None else classes.get(cls)
    if plain is None:
        plain = (
            cls.__getattr__ is torch.nn.Module.__getattr__
            and cls.__getattribute__ is object.__getattribute__
            and not hasattr(cls, "_packed_params")
        )
        if classes is not None:
            classes[cls] = plain
    if (
        plain
        and "_packed_params" not in mod.__dict__
        and "_packed_params" not in mod._modules
        and "_packed_params" not in mod._parameters
        and "_packed_params" not in mod._buffers
    ):
        return False
    return hasattr(mod, "_packed_params")


def read_own(mod: torch.nn.Module, local: str, kind: str) -> Any:
    """The tensor ``local`` of ``mod`` for an ``own_tensors`` entry, or None.

    ``param``/``buffer``: read from the module's store (TorchScript's store has no ``.get``).
    ``packed``: unpacked by calling ``mod.weight()`` / ``mod.bias()``; the weight comes back as
    a quantized tensor (compared dequantized, scale and zero point kept), the bias as float.
    """
    if kind == PACKED:
        try:
            return getattr(mod, local)()
        except Exception:  # a packed module that cannot unpack (backend missing): no tensor
            return None
    store = mod._parameters if kind == "param" else mod._buffers
    return store[local] if local in store else None  # noqa: SIM401
