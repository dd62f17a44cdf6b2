"""What installing the capture hooks of one model needs from its structure, kept per model.

:func:`parity_tracker.capture.hooks.install` walks the model at every install: every module's
qualified names, own parameters and buffers (``capture.leaves.own_tensors``), class facts and
display names (≈ 1.1 ms per side for 300 small modules, issue 19; ``run_parity`` installs twice
per run). An :class:`InstallPlan` is that walk's result; :func:`plan_for` keeps it per model
(at most :data:`PLANS_KEPT` models, held weakly) and hands it out again only while the model's
structure is provably what the plan was made from (:meth:`InstallPlan.live`), checked at every
install in a few C-level passes (≈ 0.1 ms for 300 modules):

- the same module objects, each of the same class (a replaced, added or removed submodule, a
  swapped ``__class__``), none collected;
- every module's ``_modules`` with the same names in the same order and the same child objects
  (identity, not ``==``), and ``_modules``, ``_parameters`` and ``_buffers`` plain dicts;
- every ``_parameters`` / ``_buffers`` with the same names in the same order (an added,
  removed or renamed parameter or buffer); a slot that held ``None`` still holds ``None`` (one
  that gets a tensor must be captured); a slot that held a tensor is read at each capture
  anyway, so a reassigned parameter needs no new plan (a slot now ``None`` is skipped by the
  capture as a fresh walk would skip it);
- the facts of each class the walk read (``forward`` defined, ``nn.Module``'s hook
  registration, ``named_modules`` / ``named_children`` not overridden, the standard attribute
  look-up) recomputed and equal, and no module with a ``_packed_params`` instance attribute.

Everything a run changes is not in the plan: hooks are written at every install (a user's
hook, a replaced hook dictionary are seen then), the training flags are read by
``HookHandle.warn_training`` on the live modules, parameter values at capture. Models the plan
does not cover (TorchScript parts, packed quantized modules, classes with their own attribute
look-up or module walk, a store that is not a dict) are walked at every install, as before.
"""

from __future__ import annotations

import itertools
import operator
import weakref
from collections import OrderedDict
from typing import Any

import torch

from parity_tracker.capture.leaves import has_packed_params, own_tensors, packed_names
from parity_tracker.capture.tags import module_display_name, root_name

#: at most this many models' plans are kept (the least recently made is dropped first)
PLANS_KEPT = 16
_PLANS: OrderedDict[int, InstallPlan] = OrderedDict()

_DICTS = frozenset((dict, OrderedDict))
_MODULES = operator.attrgetter("_modules")
_PARAMS = operator.attrgetter("_parameters")
_BUFFERS = operator.attrgetter("_buffers")
_INSTANCE = operator.attrgetter("__dict__")
_PRE, _POST = torch.nn.Module.register_forward_pre_hook, torch.nn.Module.register_forward_hook


def has_forward(mod: torch.nn.Module, class_forward: bool) -> bool:
    """Whether ``mod`` is called (the one owner of this rule; ``hooks._has_forward`` uses it).

    True when its class defines a ``forward`` (``class_forward``, from :func:`class_facts`) or
    a ``forward`` was assigned to the instance (w11brk1: such a module was taken for a
    container, and a write to its weight after its use read ``equal``).
    """
    return class_forward or "forward" in mod.__dict__


def class_facts(cls: type) -> tuple[bool, bool, bool, bool]:
    """``(TorchScript, defines a forward, nn.Module's hook registration, plannable)`` of a class.

    Plannable: ``nn.Module``'s ``named_modules``, ``named_children``, ``__getattr__`` and
    object's ``__getattribute__`` (what the walk and ``has_packed_params`` rely on), and no
    class attribute ``_packed_params``.
    """
    scripted = issubclass(cls, torch.jit.ScriptModule)  # its class's forward is not read
    return (
        scripted,
        scripted or cls.forward is not torch.nn.Module.forward,
        cls.register_forward_pre_hook is _PRE and cls.register_forward_hook is _POST,
        not scripted
        and cls.named_modules is torch.nn.Module.named_modules
        and cls.named_children is torch.nn.Module.named_children
        and cls.__getattr__ is torch.nn.Module.__getattr__
        and cls.__getattribute__ is object.__getattribute__
        and not hasattr(cls, "_packed_params"),
    )


class InstallPlan:
    """One walk of a model: what its hooks need, and what proves the model still has it.

    Attributes:
        root_name: the root's display name (``capture.tags.root_name``).
        raw_names: ``named_modules()`` names of the distinct modules, in walk order.
        hooked: ``(module index, display name, own tensors, plain hooks, is root)`` of each
            module that gets hooks, in walk order; "plain hooks": its class keeps
            ``nn.Module``'s hook registration.
        unhooked: ``(display name, reason)`` of TorchScript submodules (no Python hooks).
        all_own: ``(module index, own tensors)`` of every module with own tensors.
        all_names: the qualified names ``all_own`` lists.
        cacheable: whether :meth:`live` can prove the structure unchanged (see module doc).
    """

    __slots__ = (
        "all_names",
        "all_own",
        "cacheable",
        "hooked",
        "raw_names",
        "root_name",
        "unhooked",
    )
    __slots__ += ("_child_get", "_children", "_classes", "_nones", "_refs", "_shape", "_types")
    __slots__ += ("_forwards",)
    __slots__ += ("__weakref__", "_built")

    def __init__(self, model: torch.nn.Module) -> None:
        root = self.root_name = root_name(model)
        walk = list(model.named_modules(remove_duplicate=False))
        packed: dict[type, bool] = {}
        own = own_tensors(model, root, walk, packed)
        first: dict[int, tuple[str, torch.nn.Module]] = {}
        for n, m in walk:
            first.setdefault(id(m), (n, m))
        mods = [m for _, m in first.values()]
        self.raw_names = [n for n, _ in first.values()]
        index = {id(m): i for i, m in enumerate(mods)}
        self.all_own = [(i, entries) for i, m in enumerate(mods) if (entries := own.get(id(m)))]
        self.all_names = frozenset(e[0] for _, entries in self.all_own for e in entries)
        facts = {cls: class_facts(cls) for cls in {type(m) for m in mods}}
        self.hooked: list[tuple[int, str, list, bool, bool]] = []
        self.unhooked: list[tuple[str, str]] = []
        for i, (raw_name, mod) in enumerate(first.values()):
            is_root = mod is model
            scripted, forward, plain, _ = facts[type(mod)]
            forward = has_forward(mod, forward)
            if not (is_root or scripted or (forward and not _packed_holder(mod, packed))):
                continue  # a pure container, or a packed module's parameter holder
            name = module_display_name(raw_name, root)
            if scripted:
                why = f"is a TorchScript {type(mod).__name__}, which takes no Python hooks"
                self.unhooked.append((name, why))
                continue
            self.hooked.append((i, name, own.get(id(mod), []), plain, is_root))
        self.cacheable = _cacheable(mods, facts, packed)
        #: the modules of this walk, until :func:`plan_for` hands them out (never kept)
        self._built: list[torch.nn.Module] | None = mods
        if self.cacheable:
            self._remember(mods, index, facts)

    def _remember(self, mods: list, index: dict[int, int], facts: dict) -> None:
        """Keep what :meth:`live` compares (weak references: the plan keeps no module alive)."""
        self._refs = [weakref.ref(m) for m in mods]
        self._types = [type(m) for m in mods]
        self._classes = facts
        none = len(mods)  # the index of None in live + [None]
        children = [
            index[id(c)] if c is not None else none for m in mods for c in m._modules.values()
        ]
        self._children = len(children)
        self._child_get = _picker(children)
        self._shape = []  # per store kind: (non-empty ones, their names, empty ones)
        for store in (_MODULES, _PARAMS, _BUFFERS):
            dicts = list(map(store, mods))
            full = [i for i, d in enumerate(dicts) if d]
            empty = [i for i, d in enumerate(dicts) if not d]
            keys = [tuple(dicts[i]) for i in full]
            self._shape.append((_picker(full), keys, _picker(empty)))
        self._forwards = _instance_forwards(list(map(_INSTANCE, mods)))
        self._nones = [
            (i, kind, name)
            for i, m in enumerate(mods)
            for kind, store in ((0, m._parameters), (1, m._buffers))
            for name, value in store.items()
            if value is None
        ]

    def live(self, model: torch.nn.Module) -> list[torch.nn.Module] | None:
        """The plan's modules, in walk order, when ``model`` provably still has this structure.

        ``None`` when anything the walk read may have changed (the module docstring lists the
        checks); never a list for a model whose walk would differ.
        """
        mods = list(map(operator.call, self._refs))
        if mods[0] is not model or any(map(operator.is_, mods, itertools.repeat(None))):
            return None
        if not all(map(operator.is_, map(type, mods), self._types)):
            return None
        for cls, facts in self._classes.items():
            if class_facts(cls) != facts:
                return None
        stores = (list(map(_MODULES, mods)), list(map(_PARAMS, mods)), list(map(_BUFFERS, mods)))
        if not set(map(type, itertools.chain(*stores))) <= _DICTS:
            return None
        for dicts, (full, keys, empty) in zip(stores, self._shape, strict=True):
            if any(map(len, empty(dicts))) or list(map(tuple, full(dicts))) != keys:
                return None  # a store that was empty is not, or one's names changed
        children = list(itertools.chain.from_iterable(map(dict.values, stores[0])))
        if len(children) != self._children:
            return None
        if not all(map(operator.is_, children, self._child_get([*mods, None]))):
            return None
        for i, kind, name in self._nones:
            if stores[1 + kind][i].get(name) is not None:
                return None  # a slot that held None holds a tensor now: it must be captured
        instance = list(map(_INSTANCE, mods))
        if any(map(operator.contains, instance, itertools.repeat("_packed_params"))):
            return None
        if _instance_forwards(instance) != self._forwards:
            return None  # a forward assigned to (or deleted from) an instance: hooked or not
        return mods


def _instance_forwards(instance: list[dict[str, Any]]) -> list[int]:
    """The indices of the modules whose ``__dict__`` holds a ``forward`` of their own."""
    return list(
        itertools.compress(
            itertools.count(), map(operator.contains, instance, itertools.repeat("forward"))
        )
    )


def _picker(indices: list[int]) -> Any:
    """``pick(seq)``: the items of ``seq`` at ``indices``, as a tuple (C-level itemgetter)."""
    if not indices:
        return lambda seq: ()
    if len(indices) == 1:
        return lambda seq, i=indices[0]: (seq[i],)
    return operator.itemgetter(*indices)


def _packed_holder(mod: torch.nn.Module, packed: dict[type, bool]) -> bool:
    """The holder of a packed quantized module's parameters (``hooks._has_forward``)."""
    return has_packed_params(mod, packed) and not packed_names(mod, packed)


def _cacheable(mods: list, facts: dict, packed: dict[type, bool]) -> bool:
    """Whether :meth:`InstallPlan.live` covers everything this walk read (module docstring)."""
    if not all(f[3] for f in facts.values()) or not all(packed.get(c, False) for c in facts):
        return False
    for m in mods:
        stores = (m._modules, m._parameters, m._buffers)
        if not {type(d) for d in stores} <= _DICTS:
            return False
        if "_packed_params" in m.__dict__ or any("_packed_params" in d for d in stores):
            return False
    return True


def plan_for(model: torch.nn.Module) -> tuple[InstallPlan, list[torch.nn.Module]]:
    """The install plan of ``model`` and its modules (walk order): the kept one, or a new walk.

    A kept plan is used only when :meth:`InstallPlan.live` proves the structure unchanged;
    otherwise the model is walked again and the new plan kept (when cacheable).
    """
    key = id(model)
    plan = _PLANS.get(key)
    if plan is not None:
        mods = plan.live(model)
        if mods is not None:
            return plan, mods
        del _PLANS[key]
    plan = InstallPlan(model)
    mods, plan._built = plan._built, None
    if plan.cacheable:
        _keep(key, model, plan)
    return plan, mods


def _keep(key: int, model: torch.nn.Module, plan: InstallPlan) -> None:
    """Keep ``plan`` for ``model`` (dropped when the model is collected, or past PLANS_KEPT)."""
    while len(_PLANS) >= PLANS_KEPT:
        _PLANS.popitem(last=False)
    _PLANS[key] = plan
    plan_ref = weakref.ref(plan)

    def gone(_ref: Any, key: int = key) -> None:
        if _PLANS.get(key) is plan_ref():
            _PLANS.pop(key, None)

    plan._refs[0] = weakref.ref(model, gone)


def forget_plans() -> None:
    """Drop every kept plan (tests; the next install of each model walks it again)."""
    _PLANS.clear()
