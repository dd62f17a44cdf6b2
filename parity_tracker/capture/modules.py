"""Module hooks: what each module call sees, recorded as tagged captures (never compared here).

:class:`CaptureLog` is the bookkeeping of one TensorChecker: the groups of captures by
``(tag, step)`` (:class:`Group`, :class:`Capture`), execution order per side, module calls per
step, the call stack of the forwards in progress, cache-hit marks and the live hook handles.
:func:`parity_tracker.capture.hooks.install` adds the forward hooks of one model
(:class:`~parity_tracker.capture.hooks.HookHandle`), each module with its :class:`ModuleSite`;
each call records its inputs, outputs and (first call) the module's own weights under the tags
of :mod:`parity_tracker.capture.tags`. Every tensor captured is handed to ``on_tensor`` (the
checker keeps a snapshot, or compares it at once on the eager path).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from parity_tracker.capture.hook_marks import MARK
from parity_tracker.capture.leaves import (
    PACKED,
    PY_NUMBERS,
    NonTensor,
    input_names,
    planned_output_leaves,
    planned_value_leaves,
    read_own,
    scalar_leaf,
)
from parity_tracker.capture.ops import suspended
from parity_tracker.capture.tags import (
    ROOT_NAME,
    call_base,
    output_tag,
    param_tag,
)
from parity_tracker.compare.convert import as_tensor
from parity_tracker.compare.hashing import dtype_name

if TYPE_CHECKING:
    from parity_tracker.capture.hooks import HookHandle


@dataclass(slots=True)  # issue 19: no per-capture __dict__
class Capture:
    """One leaf captured on one side (``value``: tensor, None, NonTensor, Spilled, RELEASED)."""

    side: int
    value: Any
    exec_order: int
    is_tensor: bool
    meta: tuple[tuple[int, ...], str, str] | None = None  # shape, dtype, device


@dataclass(slots=True)
class Group:
    """Every capture of one tag at one step, and how it is placed in the results."""

    tag: str
    step: int
    kind: str
    module: str | None
    slot: str
    call_index: int
    created: int
    order: int | None = None
    captures: list[Capture] = field(default_factory=list)
    ref_index: int | None = None  # set by the eager path
    pairs: dict[int, Any] = field(default_factory=dict)  # eager: cand index -> Comparison


def meta(t: torch.Tensor) -> tuple[tuple[int, ...], str, str]:
    """``(shape, dtype, device)`` of a tensor (kept when its value is released).

    The tuple is shared by every tensor of the same shape, dtype and device (``_METAS``,
    issue 19: one live tuple instead of two per capture, and no ``tuple(shape)`` copy); a
    shape whose sizes cannot be hashed (symbolic) is formatted each time.
    """
    shape, dtype, cpu = t.shape, t.dtype, t.is_cpu
    key = (shape, dtype) if cpu else (shape, dtype, t.device)
    try:
        found = _METAS.get(key)
    except TypeError:  # a symbolic size: not hashable
        found = key = None
    if found is None:
        name = _DTYPE_NAMES.get(dtype) or _dtype_name(dtype)
        found = (tuple(shape), name, "cpu" if cpu else _device_name(t.device))
        if key is not None and len(_METAS) < _METAS_KEPT:
            _METAS[key] = found
    return found


#: ``meta`` per ``(shape, dtype)`` (CPU) or ``(shape, dtype, device)``; at most
#: ``_METAS_KEPT`` entries (≈ 0.3 KiB each), later shapes are formatted each time
_METAS: dict[tuple, tuple[tuple[int, ...], str, str]] = {}
_METAS_KEPT = 4096


def _dtype_name(dtype: torch.dtype) -> str:
    """``dtype_name(dtype)``, kept in ``_DTYPE_NAMES``."""
    name = _DTYPE_NAMES[dtype] = dtype_name(dtype)
    return name


#: ``dtype_name`` per dtype, filled on first use (``str(dtype)`` costs ≈ 0.4 µs a call)
_DTYPE_NAMES: dict[torch.dtype, str] = {}


@functools.lru_cache(maxsize=256)
def _device_name(device: torch.device) -> str:
    """``str(device)``, once per device (``torch.device.__str__`` costs ≈ 0.3 µs a call)."""
    return str(device)


class CaptureLog:
    """The capture bookkeeping of one checker (see the module docstring).

    Args:
        on_tensor: ``on_tensor(group, capture, tensor, alias)`` for every tensor captured;
            ``alias`` is True for parameters (pinned, never copied: ``Snapshotter.pin``).
    """

    def __init__(self, on_tensor: Callable[[Group, Capture, torch.Tensor, bool], None]):
        self.on_tensor = on_tensor
        self.handles: list[HookHandle] = []
        #: side -> hooked module display names, in hook order (a dict as an ordered set: rows
        #: derived from it, e.g. "never called", come out in the same order every run)
        self.hooked: dict[int, dict[str, None]] = {}
        #: side -> {module display name: why it takes no hooks} (TorchScript, hooks refused)
        self.unhooked: dict[int, dict[str, str]] = {}
        self.reset()

    def reset(self) -> None:
        """Forget every capture (hooks and hooked names stay)."""
        self.step = 0
        self.groups: dict[tuple[str, int], Group] = {}
        self.ordered = 0
        self.exec: dict[int, int] = {}
        #: ``(side, step, module) -> calls``: the module calls of each side and step
        self.calls: dict[tuple[int, int, str], int] = {}
        self.ran: set[int] = set()
        self.sides: set[int] = set()
        self.explicit_manual = False
        #: side -> qualified names of the own tensors captured (one set per side, issue 19)
        self.weights_done: dict[int, set[str]] = {}
        #: a new number per reset: the calls in progress (``ModuleSite.frames``) and the "own
        #: tensors all captured" marks (``ModuleSite.own_done``) of an older epoch are stale
        self.epoch = getattr(self, "epoch", 0) + 1
        #: ``(side, id(module), name) -> ModuleSite`` of the modules :meth:`pre_call` saw
        self._sites: dict[tuple[int, int, str], ModuleSite] = {}
        self.stack: list[tuple[int, str]] = []  # (side, module) of the calls in progress
        self.cache_hits: set[tuple[str, int, int | None]] = set()
        #: ``(tag, step) -> reason``: values the candidate's engine cannot expose (compiled or
        #: foreign engines, ``parity_tracker.adapters``); such tags are ``skipped``, not missing.
        self.not_observable: dict[tuple[str, int], str] = {}

    @property
    def called(self) -> dict[int, set[str]]:
        """The display names of the modules called on each side (``{side: names}``, from calls)."""
        called: dict[int, set[str]] = {}
        for side, _, name in self.calls:
            names = called.get(side)
            if names is None:
                names = called[side] = set()
            names.add(name)
        return called

    @property
    def created(self) -> int:
        """How many groups were created (groups are only added, until :meth:`reset`)."""
        return len(self.groups)

    @property
    def roots(self) -> set[str]:
        """The hooked models' root names (``{"model"}`` when none is hooked)."""
        return {h.root_name for h in self.handles} or {ROOT_NAME}

    @staticmethod
    def output_tag(module: str) -> str:
        """The tag of a module's single output (:func:`parity_tracker.capture.tags.output_tag`)."""
        return output_tag(module)

    def active_side(self) -> int | None:
        """The side whose forward is running, or None outside any hooked forward."""
        return self.stack[-1][0] if self.stack else None

    def active_module(self, side: int) -> str | None:
        """The innermost module of ``side`` whose call is in progress, or None."""
        return next((m for s, m in reversed(self.stack) if s == side), None)

    def capture(
        self,
        tag: str,
        value: Any,
        *,
        side: int,
        kind: str,
        module: str | None,
        slot: str,
        call_index: int,
        step: int | None = None,
    ) -> Group:
        """Record one leaf under ``tag`` (at ``step``, default the current one) for ``side``."""
        step = self.step if step is None else step
        return self._record(tag, value, side, kind, module, slot, call_index, step)

    def _record(self, tag, value, side, kind, module, slot, call_index, step) -> Group:
        """:meth:`capture` with every argument given by position (:meth:`_record_all`, one leaf)."""
        return self._record_all(((tag, slot, value),), side, kind, module, call_index, step)[0]

    def _record_all(self, leaves, side, kind, module, call_index, step) -> list[Group]:
        """Record each ``(tag, slot, value)`` of ``leaves`` for ``side``: their groups, in order.

        The one record path of every capture (issue 19: the hooks record a call's inputs or
        outputs in one call, not one call per leaf). A tensor is captured (its shape, dtype
        and device kept as ``meta``) and handed to ``on_tensor`` before the next leaf is
        recorded; ``None`` and :class:`NonTensor` leaves are kept as they are, any other value
        converted (:func:`~parity_tracker.compare.convert.as_tensor`) first.
        """
        groups, counts, on_tensor = self.groups, self.exec, self.on_tensor
        alias = kind == "param"
        out = []
        self.sides.add(side)
        for tag, slot, value in leaves:
            key = (tag, step)
            group = groups.get(key)
            if group is None:  # created = len(groups): groups are only ever added
                group = groups[key] = Group(tag, step, kind, module, slot, call_index, len(groups))
            out.append(group)
            order = counts.get(side, 0)
            counts[side] = order + 1
            if isinstance(value, torch.Tensor):  # the usual leaf: _add's tensor branch, inline
                shape, dtype = value.shape, value.dtype  # meta(value), its shared tuple inline
                try:
                    found = _METAS.get(
                        (shape, dtype) if value.is_cpu else (shape, dtype, value.device)
                    )
                except TypeError:  # a symbolic size: meta formats it
                    found = None
                cap = Capture(side, None, order, True, found or meta(value))
                group.captures.append(cap)
                on_tensor(group, cap, value, alias)
                continue
            if not (value is None or isinstance(value, NonTensor)):
                value = as_tensor(value, tag)
            self._add(group, side, value, order, alias=alias)
        return out

    def commit(self, groups: Iterable[Group]) -> None:
        """Give groups their results order (first registration order)."""
        for g in groups:
            if g.order is None:
                g.order = self.ordered
                self.ordered += 1

    def _add(self, g: Group, side: int, value: Any, order: int, alias: bool) -> None:
        if not isinstance(value, torch.Tensor):
            g.captures.append(Capture(side, value, order, False))
            return
        cap = Capture(side, None, order, True, meta(value))
        g.captures.append(cap)
        self.on_tensor(g, cap, value, alias)

    def reference_side(self) -> int:
        """Side 0, unless every side was numbered automatically and side 0 never captured.

        Automatic numbering on the shared instance can hand out sides 2 and 3 while an earlier
        pair's handles are still alive; then the lowest side that captured is the reference.
        Sides given explicitly (``side=``) are absolute: 0 is the reference.
        """
        explicit = self.explicit_manual or any(h.explicit for h in self.handles)
        if explicit or not self.sides:
            return 0
        return min(self.sides)

    def claim_side(self, side: int | None) -> int:
        """``side``, or the lowest side no live handle holds."""
        if side is not None:
            return int(side)
        used = {h.side for h in self.handles}
        return next(i for i in range(len(used) + 1) if i not in used)

    def pre_call(self, side, name, mod, args, kwargs, own, root_handle) -> None:
        """Forward pre-hook: open the call, capture its inputs and (first call) weights.

        The generic entry (``capture.compiled`` replays its calls through it); the module
        hooks of :func:`install` call :meth:`enter` with the module's :class:`ModuleSite`.
        """
        key = (side, id(mod), name)
        site = self._sites.get(key)
        if site is None:
            site = self._sites[key] = ModuleSite(side, name, own, root_handle, None)
        site.own, site.root = own, root_handle
        self.enter(site, mod, args, kwargs)

    def post_call(self, side, name, mod, output, all_own) -> None:
        """Forward hook: capture the outputs; the root also captures never-called weights."""
        site = self._sites.get((side, id(mod), name))
        if site is not None:
            site.all_own = all_own
            self.leave(site, mod, output)

    def enter(
        self, site: ModuleSite, mod: torch.nn.Module, args: tuple, kwargs: dict | None
    ) -> None:
        """A hooked module's call starts: capture its inputs and (first call) own tensors."""
        side, name, step = site.side, site.name, self.step
        self.stack.append(site.key)
        if site.root is not None:
            self.ran.add(side)
            site.root.warn_training(mod)
        calls, key = self.calls, (side, step, name)
        k = calls.get(key, 0)
        calls[key] = k + 1
        if kwargs:
            keys, values = tuple(kwargs), (*args, *kwargs.values())
        else:
            keys, values = (), args
        sig = site.sig  # the input names of the site's last call signature (issue 19)
        if sig is None or sig[0] != k or sig[1] != len(args) or sig[2] != keys:
            sig = site.sig = (k, len(args), keys, _input_names(name, k, len(args), keys), {})
        leaves: list[tuple[str, str, Any]] = []
        # one name per value by construction (sig); zip(strict=True) would cost ≈ 0.4 µs a call
        for (arg, tag, slot), value in zip(sig[3], values):  # noqa: B905
            if value is None or isinstance(value, torch.Tensor):  # value_leaves' one leaf
                leaves.append((tag, slot, value))
            elif type(value) in PY_NUMBERS:  # value_leaves' one leaf too (use_cache flags)
                leaves.append((tag, slot, scalar_leaf(value)))
            else:  # the signature's plan of this input's leaves (sig[4])
                planned_value_leaves(sig[4], call_base(name, k), arg, tag, slot, value, leaves)
        groups = self._record_all(leaves, side, "input", name, k, step) if leaves else []
        own = site.own and site.own_done != self.epoch
        if own and self._capture_own(side, mod, site.own, groups):
            site.own_done = self.epoch  # every own tensor captured: later calls skip them
        site.frames.append((self.epoch, k, groups))

    def _capture_own(self, side: int, mod: torch.nn.Module, own, groups: list[Group]) -> bool:
        """Capture ``mod``'s own tensors not captured yet into ``groups``; whether all now are.

        Consecutive tensors of one owner and kind are recorded in one :meth:`_record_all`
        (issue 19); a name counts as captured once its record is made.
        """
        done = self.weights_done.get(side)
        if done is None:
            done = self.weights_done[side] = set()
        all_done = True
        batch: list[tuple[str, str, Any]] = []
        names: list[str] = []
        key = None
        for qname, owner, local, kind in own:
            if qname in done:
                continue
            if kind == PACKED:
                value = read_own(mod, local, kind)
            else:  # read_own's param/buffer branch, inline
                store = mod._parameters if kind == "param" else mod._buffers
                value = store[local] if local in store else None  # noqa: SIM401
            if value is None:
                all_done = False
                continue
            kind = "param" if kind == PACKED else kind
            if key != (owner, kind):
                self._record_own(batch, names, side, key, groups, done)
                batch, names, key = [], [], (owner, kind)
            batch.append((_param_tag(qname), local, value))
            names.append(qname)
        self._record_own(batch, names, side, key, groups, done)
        return all_done

    def _record_own(self, batch, names, side, key, groups: list[Group], done: set[str]) -> None:
        """Record one owner's own tensors of one kind (``key``: owner, kind), mark them done."""
        if batch:
            groups += self._record_all(batch, side, key[1], key[0], 0, 0)
            done.update(names)

    def leave(self, site: ModuleSite, mod: torch.nn.Module, output: Any) -> None:
        """A hooked module's call returned: capture its outputs (the root: unused weights)."""
        frames = site.frames
        if not frames:
            return  # hooked in the middle of this call
        epoch, k, groups = frames.pop()
        if epoch != self.epoch:
            return  # opened before a reset
        side, name, step = site.side, site.name, self.step
        if site.all_own is None and self.stack and self.stack[-1] == site.key:
            self.stack.pop()
        if output is None or isinstance(output, torch.Tensor):  # output_leaves' one leaf
            out = site.out  # the site's last (call index, output tag) (issue 19)
            if out is None or out[0] != k:
                out = site.out = (k, _output_tag(name, k))
            leaves = ((out[1], "output", output),)
        else:  # the plan of the site's last structured output, for this call index
            plan = site.out_plan
            plan = plan[1] if plan is not None and plan[0] == k else None
            leaves, plan = planned_output_leaves(plan, call_base(name, k), output)
            site.out_plan = None if plan is None else (k, plan)
        outs = self._record_all(leaves, side, "output", name, k, step)
        ordered = self.ordered  # commit(outs + groups), inline
        for gs in (outs, groups):
            for g in gs:
                if g.order is None:
                    g.order = ordered
                    ordered += 1
        self.ordered = ordered
        if site.all_own is not None:  # root: weights of modules the forward never called
            self._capture_unused(site, side)

    def _capture_unused(self, site: ModuleSite, side: int) -> None:
        """The root's call returned: capture (and order) the own tensors not captured yet."""
        all_own, known = site.all_own, site.all_names
        if known is None or known[0] is not all_own:  # every qualified name, once per list
            known = site.all_names = (all_own, frozenset(e[0] for _, own in all_own for e in own))
        done = self.weights_done.get(side)
        if done is not None and done.issuperset(known[1]):
            return  # the usual case: the forward called every module with own tensors
        for sub, own in all_own:
            found: list[Group] = []
            self._capture_own(side, sub, own, found)
            self.commit(found)

    def root_done(self, side: int, name: str) -> None:
        """Always-called root hook: unwind the call stack, even after an exception."""
        # Always called, even when the forward raised: drop the root's entry and any stale
        # entries of calls that raised above it.
        if (side, name) in self.stack:
            i = len(self.stack) - 1 - self.stack[::-1].index((side, name))
            del self.stack[i:]


_PRE_HOOK = object()  # ModuleSite.__call__'s output when called as the pre-hook
_dispatch_modes = torch._C._len_torch_dispatch_stack


class ModuleSite:
    """One hooked module on one side: what its calls need, computed once (issue 19).

    The site is also the module's forward pre-hook (called with 3 arguments) and forward hook
    (4): one object per module and side instead of two closures, marked as a capture hook
    (:mod:`parity_tracker.capture.hook_marks`) by its class. A copy of the module (``deepcopy``)
    keeps the same site, as it kept the same closures. Outside any dispatch mode no op recorder
    can see the capture's own tensor work, so it enters
    :class:`~parity_tracker.capture.ops.suspended` only inside one (≈ 0.5 µs per hook).

    Attributes:
        log: the :class:`CaptureLog` the calls are recorded in (None: not a hook).
        side, name: the side and the module's display name; ``key`` is ``(side, name)``.
        own: the module's :func:`~parity_tracker.capture.leaves.own_tensors` entries.
        root: the ``HookHandle`` when this is the hooked root, else None.
        all_own: the root's ``(module, own entries)`` of every module (else None).
        all_names: ``(all_own, the qualified names it lists)``, made at the root's first call.
        frames: ``(log epoch, call index, groups)`` of this module's calls in progress.
        own_done: the log epoch in which every own tensor was captured.
        sig, out: the input names and the single output's tag of the last call (formatted
            again only when the call index or the signature changes); ``sig`` also keeps the
            plan of its structured inputs' leaves (tuple children's tags).
        out_plan: the tags of the last structured output's children, for its call index.
    """

    __slots__ = ("all_names", "all_own", "frames", "key", "log", "name", "out", "own")
    __slots__ += ("out_plan", "own_done", "root", "side", "sig")

    def __init__(
        self, side: int, name: str, own: list, root: Any, all_own: list | None, log: Any = None
    ) -> None:
        self.side, self.name, self.key = side, name, (side, name)
        self.own, self.root, self.all_own, self.log = own, root, all_own, log
        self.all_names: tuple[list, frozenset[str]] | None = None  # all_own and its names
        self.frames: list[tuple[int, int, list[Group]]] = []
        self.own_done = 0  # epochs start at 1
        #: ``(call index, positional count, keywords, input_names, plans)`` of the last call;
        #: plans: ``leaves.planned_value_leaves``' per structured input of that signature
        self.sig: tuple[int, int, tuple[str, ...], tuple, dict] | None = None
        self.out: tuple[int, str] | None = None  # (call index, single-output tag) of the last
        #: ``(call index, leaves.planned_output_leaves' plan)`` of the last structured output
        self.out_plan: tuple[int, tuple] | None = None

    def __call__(self, module, args, kwargs, output=_PRE_HOOK) -> None:
        """The forward pre-hook (``output`` not given) and forward hook of the module."""
        if output is _PRE_HOOK:
            if _dispatch_modes():
                with suspended():
                    self.log.enter(self, module, args, kwargs)
            else:
                self.log.enter(self, module, args, kwargs)
        elif _dispatch_modes():
            with suspended():
                self.log.leave(self, module, output)
        else:
            self.log.leave(self, module, output)

    def __deepcopy__(self, memo: dict) -> ModuleSite:
        return self  # a copied hook records into the same checker (capture.hook_marks)

    def __copy__(self) -> ModuleSite:
        return self

    def __reduce__(self) -> Any:
        raise TypeError(
            "parity_tracker's capture hooks cannot be pickled: remove them (HookHandle.remove()) "
            "before saving the model"
        )


setattr(ModuleSite, MARK, True)


#: At most this many formatted signatures, output tags and parameter tags kept (each cache;
#: ≈ 0.2–0.5 KiB an entry): past it the least recently used is formatted again.
_NAMES_KEPT = 8192


@functools.lru_cache(maxsize=_NAMES_KEPT)
def _input_names(name: str, k: int, nargs: int, keys: tuple[str, ...]) -> tuple:
    """``input_names`` of call ``k`` of module ``name``, ``nargs`` positional inputs, ``keys``.

    Formatted once per signature for every site, side and install (issue 19: a pure function
    of its arguments; a tuple, never changed by its users).
    """
    return tuple(input_names(call_base(name, k), nargs, keys))


@functools.lru_cache(maxsize=_NAMES_KEPT)
def _output_tag(name: str, k: int) -> str:
    """The tag of call ``k`` of module ``name``'s single output (formatted once, issue 19)."""
    return output_tag(call_base(name, k))


_param_tag = functools.lru_cache(maxsize=_NAMES_KEPT)(param_tag)  # the same, for weights
