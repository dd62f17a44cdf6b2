"""Module hooks: what each module call sees, recorded as tagged captures (never compared here).

:class:`CaptureLog` is the bookkeeping of one TensorChecker: the groups of captures by
``(tag, step)`` (:class:`Group`, :class:`Capture`), execution order per side, module calls per
step, the call stack of the forwards in progress, cache-hit marks and the live hook handles.
:func:`install` adds the forward hooks of one model (:class:`HookHandle`); each call records its
inputs, outputs and (first call) the module's own weights under the tags of
:mod:`parity_tracker.capture.tags`. Every tensor captured is handed to ``on_tensor`` (the
checker keeps a snapshot, or compares it at once on the eager path).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from torch.utils.hooks import RemovableHandle

from parity_tracker.capture.hook_marks import mark_capture_code
from parity_tracker.capture.leaves import (
    PACKED,
    NonTensor,
    has_packed_params,
    input_names,
    output_leaves,
    own_tensors,
    packed_names,
    read_own,
    value_leaves,
)
from parity_tracker.capture.ops import suspended
from parity_tracker.capture.tags import (
    ROOT_NAME,
    call_base,
    module_display_name,
    output_tag,
    param_tag,
    root_name,
)
from parity_tracker.capture.training import mode_dependence, training_mode_dependent
from parity_tracker.compare.convert import as_tensor
from parity_tracker.compare.hashing import dtype_name


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
    """``(shape, dtype, device)`` of a tensor (kept when its value is released)."""
    dtype = t.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype_name(dtype)
    return tuple(t.shape), name, "cpu" if t.is_cpu else _device_name(t.device)


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
        self.created = 0
        self.ordered = 0
        self.exec: dict[int, int] = {}
        self.calls: dict[tuple[int, int, str], int] = {}
        self.called: dict[int, set[str]] = {}
        self.ran: set[int] = set()
        self.sides: set[int] = set()
        self.explicit_manual = False
        self.weights_done: set[tuple[int, str]] = set()
        #: a new number per reset: the calls in progress (``_Site.frames``) and the "own
        #: tensors all captured" marks (``_Site.own_done``) of an older epoch are stale
        self.epoch = getattr(self, "epoch", 0) + 1
        #: ``(side, id(module), name) -> _Site`` of the modules :meth:`pre_call` saw
        self._sites: dict[tuple[int, int, str], _Site] = {}
        self.stack: list[tuple[int, str]] = []  # (side, module) of the calls in progress
        self.cache_hits: set[tuple[str, int, int | None]] = set()
        #: ``(tag, step) -> reason``: values the candidate's engine cannot expose (compiled or
        #: foreign engines, ``parity_tracker.adapters``); such tags are ``skipped``, not missing.
        self.not_observable: dict[tuple[str, int], str] = {}

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
        """:meth:`capture` with every argument given by position (the hooks' path, issue 19)."""
        key = (tag, step)
        groups = self.groups
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(tag, step, kind, module, slot, call_index, self.created)
            self.created += 1
        order = self.exec.get(side, 0)
        self.exec[side] = order + 1
        self.sides.add(side)
        if isinstance(value, torch.Tensor):  # the usual leaf: _add's tensor branch, inline
            cap = Capture(side, None, order, True, meta(value))
            group.captures.append(cap)
            self.on_tensor(group, cap, value, kind == "param")
            return group
        if not (value is None or isinstance(value, NonTensor)):
            value = as_tensor(value, tag)
        self._add(group, side, value, order, alias=kind == "param")
        return group

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
        hooks of :func:`install` call :meth:`enter` with the module's :class:`_Site`.
        """
        key = (side, id(mod), name)
        site = self._sites.get(key)
        if site is None:
            site = self._sites[key] = _Site(side, name, own, root_handle, None)
        site.own, site.root = own, root_handle
        self.enter(site, mod, args, kwargs)

    def post_call(self, side, name, mod, output, all_own) -> None:
        """Forward hook: capture the outputs; the root also captures never-called weights."""
        site = self._sites.get((side, id(mod), name))
        if site is not None:
            site.all_own = all_own
            self.leave(site, mod, output)

    def enter(self, site: _Site, mod: torch.nn.Module, args: tuple, kwargs: dict | None) -> None:
        """A hooked module's call starts: capture its inputs and (first call) own tensors."""
        side, name, step = site.side, site.name, self.step
        self.stack.append(site.key)
        if site.root is not None:
            self.ran.add(side)
            site.root.warn_training(mod)
        key = (side, step, name)
        k = self.calls.get(key, 0)
        self.calls[key] = k + 1
        called = self.called.get(side)
        if called is None:
            called = self.called[side] = set()
        called.add(name)
        signature = (k, len(args), tuple(kwargs) if kwargs else ())
        names = site.inputs.get(signature)
        if names is None:  # tags of this call's inputs, formatted once per module (issue 19)
            names = input_names(call_base(name, k), len(args), signature[2])
            if len(site.inputs) < _SIGNATURES:
                site.inputs[signature] = names
        values = (*args, *kwargs.values()) if kwargs else args
        record, groups = self._record, []
        for (arg, tag, slot), value in zip(names, values, strict=True):
            if value is None or isinstance(value, torch.Tensor):  # value_leaves' one leaf
                groups.append(record(tag, value, side, "input", name, slot, k, step))
                continue
            leaves: list[tuple[str, str, Any]] = []
            value_leaves(call_base(name, k), arg, tag, slot, value, leaves)
            for leaf_tag, leaf_slot, leaf in leaves:
                groups.append(record(leaf_tag, leaf, side, "input", name, leaf_slot, k, step))
        if site.own and site.own_done != self.epoch:
            own, done = self._capture_own(side, mod, site.own)
            groups += own
            if done:  # every own tensor captured: later calls skip the lookups
                site.own_done = self.epoch
        site.frames.append((self.epoch, k, groups))

    def _capture_own(self, side: int, mod: torch.nn.Module, own) -> tuple[list[Group], bool]:
        """Capture ``mod``'s own tensors not captured yet; also whether all now are."""
        groups, done, all_done = [], self.weights_done, True
        for qname, owner, local, kind in own:
            if (side, qname) in done:
                continue
            value = read_own(mod, local, kind)
            if value is None:
                all_done = False
                continue
            done.add((side, qname))
            kind = "param" if kind == PACKED else kind
            groups.append(self._record(param_tag(qname), value, side, kind, owner, local, 0, 0))
        return groups, all_done

    def leave(self, site: _Site, mod: torch.nn.Module, output: Any) -> None:
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
            tag = site.outputs.get(k)
            if tag is None:
                tag = output_tag(call_base(name, k))
                if len(site.outputs) < _SIGNATURES:
                    site.outputs[k] = tag
            outs = [self._record(tag, output, side, "output", name, "output", k, step)]
        else:
            outs = [
                self._record(tag, leaf, side, "output", name, slot, k, step)
                for tag, slot, leaf in output_leaves(call_base(name, k), output)
            ]
        self.commit(outs + groups)
        if site.all_own is not None:  # root: weights of modules the forward never called
            for sub, own in site.all_own:
                self.commit(self._capture_own(side, sub, own)[0])

    def root_done(self, side: int, name: str) -> None:
        """Always-called root hook: unwind the call stack, even after an exception."""
        # Always called, even when the forward raised: drop the root's entry and any stale
        # entries of calls that raised above it.
        if (side, name) in self.stack:
            i = len(self.stack) - 1 - self.stack[::-1].index((side, name))
            del self.stack[i:]


class HookHandle:
    """The hooks one ``module_register_tensor_checker`` call added.

    ``remove()`` (or leaving a ``with`` block) removes every one of them; the captures already
    made stay in the checker until its ``clear()``.

    Attributes:
        side: the side this model's captures carry (0 reference, 1 candidate, ...).
        module_names: the hooked modules' display names.
        root_name: the root module's display name: ``"model"``, or ``"root"`` when the model
            has a child named ``model`` (Hugging Face ``*ForCausalLM``).
    """

    def __init__(self, log: CaptureLog, side: int, model: torch.nn.Module) -> None:
        self.log = log
        self.side = side
        self.module_names: list[str] = []
        #: modules that exist but take no hooks: display name -> the reason, a clause
        #: ("is a TorchScript ...", "refused a forward hook (...)")
        self.unhooked: dict[str, str] = {}
        self.root_name = ROOT_NAME
        self.explicit = False
        self._handles: list[Any] = []
        #: ``(module, hook id)`` of the hooks :func:`install` wrote into a module's hook
        #: dictionaries itself (the pre hook's id; the forward hook's is ``id + 1``)
        self._direct: list[tuple[torch.nn.Module, int]] = []
        #: ``model.named_modules()`` as listed at install (the training-mode check walks it)
        self._named: list[tuple[str, torch.nn.Module]] | None = None
        self._warned = False
        self._model_name = type(model).__name__

    def warn_training(self, model: torch.nn.Module) -> None:
        """Warn once when the hooked model runs mode-dependent modules in training mode."""
        if self._warned:
            return
        if self._named is None:
            found = training_mode_dependent(model)
        else:  # training_mode_dependent over the modules listed at install (issue 19)
            found = [(n, why) for n, m in self._named if m.training and (why := mode_dependence(m))]
        if not found:
            return
        self._warned = True
        role = "reference" if self.side == 0 else f"candidate (side {self.side})"
        shown = ", ".join(f"{n or ROOT_NAME}: {why}" for n, why in found[:3])
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        warnings.warn(
            f"TensorChecker: the {role} model {self._model_name} is in training mode and has "
            f"modules that compute differently in it ({shown}{more}); the comparison is "
            "meaningless. Call model.eval() before the forward.",
            UserWarning,
            stacklevel=4,
        )

    @property
    def removed(self) -> bool:
        """True once ``remove()`` ran."""
        return self not in self.log.handles

    def remove(self) -> None:
        """Remove every hook this handle added (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for mod, i in self._direct:  # what RemovableHandle.remove does for each (torch.utils.hooks)
            mod._forward_pre_hooks.pop(i, None)
            mod._forward_pre_hooks_with_kwargs.pop(i, None)
            mod._forward_hooks.pop(i + 1, None)
            mod._forward_hooks_with_kwargs.pop(i + 1, None)
        self._direct.clear()
        if self in self.log.handles:
            self.log.handles.remove(self)

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _has_forward(mod: torch.nn.Module, classes: dict[type, bool] | None = None) -> bool:
    """False for pure containers (ModuleList, ModuleDict, ...) that are never called.

    Also False for the holder of a packed quantized module's parameters
    (``LinearPackedParams``: an identity ``forward`` never called; its owner's ``weight`` and
    ``bias`` are captured unpacked, see :func:`parity_tracker.capture.leaves.packed_names`).
    ``classes``: the memo of :func:`parity_tracker.capture.leaves.has_packed_params`.
    """
    if isinstance(mod, torch.jit.ScriptModule):
        return True
    if type(mod).forward is torch.nn.Module.forward:
        return False
    return not (has_packed_params(mod, classes) and not packed_names(mod, classes))


class _Site:
    """One hooked module on one side: what its calls need, computed once (issue 19).

    Attributes:
        side, name: the side and the module's display name; ``key`` is ``(side, name)``.
        own: the module's :func:`~parity_tracker.capture.leaves.own_tensors` entries.
        root: the :class:`HookHandle` when this is the hooked root, else None.
        all_own: the root's ``(module, own entries)`` of every module (else None).
        frames: ``(log epoch, call index, groups)`` of this module's calls in progress.
        inputs: ``(call index, positional count, keywords) -> input_names(...)``.
        outputs: call index -> the tag of a single-tensor output.
        own_done: the log epoch in which every own tensor was captured.
    """

    __slots__ = ("side", "name", "key", "own", "root", "all_own", "frames", "inputs", "outputs")
    __slots__ += ("own_done",)

    def __init__(self, side: int, name: str, own: list, root: Any, all_own: list | None) -> None:
        self.side, self.name, self.key = side, name, (side, name)
        self.own, self.root, self.all_own = own, root, all_own
        self.frames: list[tuple[int, int, list[Group]]] = []
        self.inputs: dict[tuple[int, int, tuple[str, ...]], list[tuple[str, str, str]]] = {}
        self.outputs: dict[int, str] = {}
        self.own_done = 0  # epochs start at 1


#: At most this many call signatures (and output tags) kept per module: a module called with
#: ever new keyword names, or a thousand times per step, formats the rest each call.
_SIGNATURES = 64


def install(model: torch.nn.Module, log: CaptureLog, handle: HookHandle) -> None:
    """Add the pre/post hooks of every module with a forward to ``handle``.

    Modules that take no hooks (TorchScript submodules, modules whose hook registration raises)
    are listed in ``handle.unhooked`` with the reason instead. A ``torch.compile``-d module
    (``OptimizedModule``) is hooked by :func:`parity_tracker.capture.compiled.install_compiled`
    (taps traced into its graph, tags without ``_orig_mod``).
    """
    from parity_tracker.capture.compiled import install_compiled, is_compiled

    if is_compiled(model):
        install_compiled(model, log, handle)
        return
    root = root_name(model)
    handle.root_name = root
    # one walk: named_modules() lists each module at its first name in the full walk (a module
    # met again is skipped with all it holds, and everything it holds was met with it)
    walk = list(model.named_modules(remove_duplicate=False))
    classes: dict[type, bool] = {}
    own = own_tensors(model, root, walk, classes)
    first: dict[int, tuple[str, torch.nn.Module]] = {}
    for n, m in walk:
        first.setdefault(id(m), (n, m))
    named = list(first.values())
    handle._named = named
    all_own = [(m, entries) for _, m in named if (entries := own.get(id(m)))]
    names: list[str] = []
    scripted: list[str] = []
    for raw_name, mod in named:
        is_root = mod is model
        if not is_root and not _has_forward(mod, classes):
            continue
        name = module_display_name(raw_name, root)
        if isinstance(mod, torch.jit.ScriptModule):
            scripted.append(name)
            handle.unhooked[name] = (
                f"is a TorchScript {type(mod).__name__}, which takes no Python hooks"
            )
            continue
        site = _Site(handle.side, name, own.get(id(mod), []), handle if is_root else None, None)
        if is_root:
            site.all_own = all_own
        try:
            _hook_one(mod, site, log, handle)
        except Exception as exc:  # a module that refuses hooks: reported, never absent
            handle.unhooked[name] = f"refused a forward hook ({type(exc).__name__}: {exc})"
            continue
        names.append(name)
    handle.module_names = names
    top = [n for n in scripted if not any(n.startswith(o + ".") for o in scripted)]
    if top:
        warnings.warn(
            f"TensorChecker: TorchScript submodules take no Python hooks and are not captured: "
            f"{', '.join(top)} (their weights are still compared)",
            UserWarning,
            stacklevel=3,
        )


def _hooks(log: CaptureLog, site: _Site) -> tuple[Callable[..., None], Callable[..., None]]:
    """The pre and post hook of one module (marked as capture hooks by their code, below).

    Outside any dispatch mode no op recorder can see the capture's own tensor work, so the
    hooks enter :class:`~parity_tracker.capture.ops.suspended` only inside one (≈ 0.5 µs per
    hook, issue 19).
    """

    def pre(m, args, kwargs):
        if _dispatch_modes():
            with suspended():
                log.enter(site, m, args, kwargs)
        else:
            log.enter(site, m, args, kwargs)

    def post(m, args, kwargs, output):
        if _dispatch_modes():
            with suspended():
                log.leave(site, m, output)
        else:
            log.leave(site, m, output)

    return pre, post


def _root_done(log: CaptureLog, side: int, name: str) -> Callable[..., None]:
    def done(m, args, kwargs, output):
        log.root_done(side, name)

    return done


_dispatch_modes = torch._C._len_torch_dispatch_stack
# a golden/twin copy drops our hooks (capture.hook_marks): every closure made by these two
# factories shares its code object, marked once here instead of an attribute per closure
mark_capture_code(*_hooks(None, None), _root_done(None, 0, ""))  # type: ignore[arg-type]
_PRE, _POST = torch.nn.Module.register_forward_pre_hook, torch.nn.Module.register_forward_hook
_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")
_DICTS += ("_forward_hooks", "_forward_hooks_with_kwargs")


def _hook_one(mod: torch.nn.Module, site: _Site, log: CaptureLog, handle: HookHandle) -> None:
    """Add one module's pre/post hooks (and the root's always-called hook) to ``handle``.

    A module that refuses a hook raises here; the hooks already added for it are removed. A
    module whose class keeps ``nn.Module``'s registration gets its hooks written into its hook
    dictionaries as ``register_forward_pre_hook(with_kwargs=True)`` and
    ``register_forward_hook(with_kwargs=True)`` write them (``torch/nn/modules/module.py``;
    ids from ``RemovableHandle.next_id``), without the two handles (≈ 8 → 1.7 µs per module
    to add and remove, issue 19); :meth:`HookHandle.remove` deletes them as
    ``RemovableHandle.remove`` would.
    """
    pre, post = _hooks(log, site)
    cls, d = type(mod), mod.__dict__
    if (
        site.root is None
        and cls.register_forward_pre_hook is _PRE
        and cls.register_forward_hook is _POST
        and all(isinstance(d.get(k), dict) for k in _DICTS)
    ):
        i = RemovableHandle.next_id
        RemovableHandle.next_id = i + 2
        d["_forward_pre_hooks"][i] = pre
        d["_forward_pre_hooks_with_kwargs"][i] = True
        d["_forward_hooks"][i + 1] = post
        d["_forward_hooks_with_kwargs"][i + 1] = True
        handle._direct.append((mod, i))
        return
    added = []
    try:
        added.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        added.append(mod.register_forward_hook(post, with_kwargs=True))
        if site.root is not None:
            done = _root_done(log, site.side, site.name)
            added.append(mod.register_forward_hook(done, with_kwargs=True, always_call=True))
    except Exception:
        for h in added:  # no half-hooked module
            h.remove()
        raise
    handle._handles.extend(added)
