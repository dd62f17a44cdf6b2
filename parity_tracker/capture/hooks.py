"""Installing the capture hooks of one model: :func:`install`, :class:`HookHandle`.

Each module with a forward gets a forward pre-hook and a forward hook (with keyword
arguments) that hand its calls to the checker's :class:`~parity_tracker.capture.modules.CaptureLog`
(``enter`` / ``leave``) with the module's :class:`~parity_tracker.capture.modules.ModuleSite`, the
facts its calls need, computed here once (issue 19). The root also gets an always-called hook
that unwinds the log's call stack after an exception.
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from parity_tracker.capture.hook_marks import mark_capture_hook
from parity_tracker.capture.install_plan import has_forward, plan_for
from parity_tracker.capture.leaves import has_packed_params, packed_names
from parity_tracker.capture.modules import CaptureLog, ModuleSite
from parity_tracker.capture.tags import ROOT_NAME
from parity_tracker.capture.training import mode_dependence, training_mode_dependent
from parity_tracker.errors import InputError


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
        #: the hooks :func:`install` wrote into modules' hook dictionaries itself, in blocks
        #: ``(pre, pre_kw, post, post_kw, ids)``: the modules' ``_forward_pre_hooks``, their
        #: ``_with_kwargs``, ``_forward_hooks``, their ``_with_kwargs`` (lists, one dict per
        #: module) and the pre hooks' ids (a ``range``; each forward hook's is ``id + 1``)
        self._direct: list[tuple[list, list, list, list, range]] = []
        #: the distinct modules as listed at install, and their ``named_modules()`` names
        #: (the training-mode check walks them)
        self._mods: list[torch.nn.Module] | None = None
        self._names: list[str] = []
        self._warned = False
        self._model_name = type(model).__name__

    def warn_training(self, model: torch.nn.Module) -> None:
        """Warn once when the hooked model runs mode-dependent modules in training mode."""
        if self._warned:
            return
        mods = self._mods
        if mods is None:
            found = training_mode_dependent(model)
        elif not any(map(_TRAINING, mods)):  # the usual case, in one C-level pass (issue 19)
            return
        else:  # training_mode_dependent over the modules listed at install (issue 19)
            found = [
                (n, why)
                for n, m in zip(self._names, mods, strict=True)
                if m.training and (why := mode_dependence(m))
            ]
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
        for block in self._direct:
            _remove_block(*block)
        self._direct.clear()
        self._mods = None  # the hooked model's modules are not kept alive by a removed handle
        if self in self.log.handles:
            self.log.handles.remove(self)

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _has_forward(mod: torch.nn.Module, classes: dict[type, bool] | None = None) -> bool:
    """False for pure containers (ModuleList, ModuleDict, ...) that are never called.

    A module whose ``forward`` is assigned to the instance is called like any other
    (:func:`~parity_tracker.capture.install_plan.has_forward`, the one owner of that rule).

    Also False for the holder of a packed quantized module's parameters
    (``LinearPackedParams``: an identity ``forward`` never called; its owner's ``weight`` and
    ``bias`` are captured unpacked, see :func:`parity_tracker.capture.leaves.packed_names`).
    ``classes``: the memo of :func:`parity_tracker.capture.leaves.has_packed_params`.
    """
    if isinstance(mod, torch.jit.ScriptModule):
        return True
    if not has_forward(mod, type(mod).forward is not torch.nn.Module.forward):
        return False
    return _not_packed_holder(mod, classes)


def _not_packed_holder(mod: torch.nn.Module, classes: dict[type, bool] | None) -> bool:
    """False for the holder of a packed quantized module's parameters (:func:`_has_forward`)."""
    return not (has_packed_params(mod, classes) and not packed_names(mod, classes))


def install(model: torch.nn.Module, log: CaptureLog, handle: HookHandle) -> None:
    """Add the pre/post hooks of every module with a forward to ``handle``.

    Modules that take no hooks (TorchScript submodules, modules whose hook registration raises)
    are listed in ``handle.unhooked`` with the reason instead. A ``torch.compile``-d module
    (``OptimizedModule``) is hooked by :func:`parity_tracker.capture.compiled.install_compiled`
    (taps traced into its graph, tags without ``_orig_mod``). What the hooks need from the
    model's structure (names, own tensors, which modules take hooks) is its
    :class:`~parity_tracker.capture.install_plan.InstallPlan`, kept per model while its
    structure provably is unchanged (issue 19); the hooks themselves are written every time.

    Raises:
        InputError: a module object of ``model`` is hooked by another side's live handle of
            ``log`` (:func:`refuse_shared_handle`); the caller removes ``handle``'s hooks.
    """
    from parity_tracker.capture.compiled import install_compiled, is_compiled

    if is_compiled(model):
        install_compiled(model, log, handle)
        return
    plan, mods = plan_for(model)
    handle.root_name = plan.root_name
    handle._mods, handle._names = mods, plan.raw_names
    side, names, direct = handle.side, [], handle._direct
    sites = [
        ModuleSite(side, name, own, handle if is_root else None, None, log)
        for _, name, own, _, is_root in plan.hooked
    ]
    # the plain modules' hooks in one block (issue 19); a model it refuses: one at a time
    block = [
        (mods[e[0]], site) for e, site in zip(plan.hooked, sites, strict=True) if e[3] and not e[4]
    ]
    written = _write_block([m for m, _ in block], [site for _, site in block], direct)
    for (i, name, _, plain, is_root), site in zip(plan.hooked, sites, strict=True):
        mod = mods[i]
        if plain and not is_root and (written or _write_direct(mod, site, direct)):
            names.append(name)
            continue
        if is_root:
            site.all_own = [(mods[j], entries) for j, entries in plan.all_own]
            site.all_names = (site.all_own, plan.all_names)
        try:
            _hook_one(mod, site, log, handle, plain)
        except Exception as exc:  # a module that refuses hooks: reported, never absent
            handle.unhooked[name] = f"refused a forward hook ({type(exc).__name__}: {exc})"
            continue
        names.append(name)
    handle.module_names = names
    refuse_shared_handle(handle, log.handles)  # the caller removes what was hooked
    for name, why in plan.unhooked:
        handle.unhooked[name] = why
    scripted = [name for name, _ in plan.unhooked]
    top = [n for n in scripted if not any(n.startswith(o + ".") for o in scripted)]
    if top:
        warnings.warn(
            f"TensorChecker: TorchScript submodules take no Python hooks and are not captured: "
            f"{', '.join(top)} (their weights are still compared)",
            UserWarning,
            stacklevel=3,
        )


def shared_modules(
    first: Iterable[torch.nn.Module], second: Iterable[tuple[str, torch.nn.Module]]
) -> list[str]:
    """The module objects both models hold (identity, not equality), by the second's names.

    ``named_modules()`` names of the second model; ``<root>`` for its root.
    """
    ids = set(map(id, first))
    return [name or "<root>" for name, m in second if id(m) in ids]


def refuse_shared_handle(handle: HookHandle, handles: Iterable[HookHandle]) -> None:
    """Refuse ``handle``'s model when another side's live handle hooked one of its modules.

    Raises:
        InputError: see :func:`refuse_shared`.
    """
    mods = handle._mods
    for other in handles:
        if other.side != handle.side and other._mods is not None and mods:
            refuse_shared(shared_modules(other._mods, zip(handle._names, mods, strict=True)))


def refuse_shared(shared: list[str], other: str = "reference") -> None:
    """Refuse two sides that share module objects (``shared``: :func:`shared_modules`).

    ``other`` names the model the candidate shares them with (a budget run's ``twin``).

    Both sides' hooks would sit on one object, so every forward records it on both sides:
    its rows compare one forward with itself (``equal`` whatever the candidate computes there)
    and gain ``@1`` tags that no forward made (w8brk2). Shared parameters alone are fine.

    Raises:
        InputError: (exit 2) naming the shared modules and the fix, when ``shared``.
    """
    if shared:
        more = f" and {len(shared) - 5} more" if len(shared) > 5 else ""
        raise InputError(
            f"the candidate shares module objects with the {other} ({', '.join(shared[:5])}"
            f"{more}): both sides' hooks would record them in both forwards; pass "
            "copy.deepcopy(candidate) (or deep-copy the shared submodules) so that each side "
            "has its own modules"
        )


def _root_done(log: CaptureLog, side: int, name: str) -> Callable[..., None]:
    """The root's always-called forward hook: unwind the log's call stack."""

    def done(m, args, kwargs, output):
        log.root_done(side, name)

    return mark_capture_hook(done)  # a golden/twin copy drops it (capture.hook_marks)


_DICT_TYPES = frozenset((dict, OrderedDict))
_TRAINING = operator.attrgetter("training")


def _write_direct(mod: torch.nn.Module, site: ModuleSite, direct: list) -> bool:
    """Write ``site`` as ``mod``'s pre-hook and forward hook straight into its hook dicts.

    As ``register_forward_pre_hook(with_kwargs=True)`` and
    ``register_forward_hook(with_kwargs=True)`` write them (``torch/nn/modules/module.py``; ids
    from ``RemovableHandle.next_id``), without the two handles (≈ 8 → 1.7 µs per module to add
    and remove, issue 19); ``direct`` gets the block ``([pre], [pre_kw], [post], [post_kw],
    ids)`` for :meth:`HookHandle.remove`. False (nothing written) unless the four dicts are
    plain dicts as ``nn.Module.__init__`` sets them up: the caller then takes the public way.
    """
    return _write_block([mod], [site], direct)


def _write_block(modules: list, sites: list, direct: list) -> bool:
    """:func:`_write_direct` for many modules at once, in C-level passes (issue 19).

    ``sites``: one per module, in the same order. Writes every module's hooks, or (one module
    without the four plain dicts) none and returns False. The ids are one block of
    ``RemovableHandle.next_id``: the ids the modules would get one after the other.
    """
    if not modules:
        return True
    try:
        dicts = list(map(_INSTANCE, modules))
        stores = [list(map(get, dicts)) for get in _HOOK_DICTS]
    except KeyError:
        return False
    if not set(map(type, itertools.chain(*stores))) <= _DICT_TYPES:
        return False
    k = RemovableHandle.next_id
    RemovableHandle.next_id = k + 2 * len(sites)
    ids = range(k, k + 2 * len(sites), 2)
    pre, pre_kw, post, post_kw = stores
    _drain(map(operator.setitem, pre, ids, sites))  # ModuleSite.__call__: the pre-hook
    _drain(map(operator.setitem, pre_kw, ids, itertools.repeat(True)))
    _drain(map(operator.setitem, post, _after(ids), sites))  # and the forward hook
    _drain(map(operator.setitem, post_kw, _after(ids), itertools.repeat(True)))
    direct.append((pre, pre_kw, post, post_kw, ids))
    return True


def _remove_block(pre: list, pre_kw: list, post: list, post_kw: list, ids: range) -> None:
    """Delete one :func:`_write_block` block's hooks, as ``RemovableHandle.remove`` would.

    Every entry is deleted in C-level passes; a hook already gone (removed by hand) sends the
    block through ``RemovableHandle.remove``'s own test, ``if id in hooks: del hooks[id]``,
    entry by entry (deleting what is left, idempotently).
    """
    try:
        _drain(map(operator.delitem, pre, ids))
        _drain(map(operator.delitem, pre_kw, ids))
        _drain(map(operator.delitem, post, _after(ids)))
        _drain(map(operator.delitem, post_kw, _after(ids)))
    except KeyError:
        for hooks, keys in ((pre, ids), (pre_kw, ids), (post, _after(ids)), (post_kw, _after(ids))):
            for hook_dict, i in zip(hooks, keys, strict=True):
                if i in hook_dict:
                    del hook_dict[i]


def _after(ids: range) -> range:
    """The forward hooks' ids of a block: each pre-hook's id + 1."""
    return range(ids.start + 1, ids.stop + 1, ids.step)


#: the four hook dictionaries :func:`_write_block` writes, read from a module's ``__dict__``
_HOOK_DICTS = tuple(
    operator.itemgetter(name)
    for name in (
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
    )
)
_INSTANCE = operator.attrgetter("__dict__")
_drain = functools.partial(collections.deque, maxlen=0)  # runs an iterator, keeps nothing


def _hook_one(
    mod: torch.nn.Module, site: ModuleSite, log: CaptureLog, handle: HookHandle, plain: bool
) -> None:
    """Add one module's pre/post hooks (and the root's always-called hook) to ``handle``.

    A module that refuses a hook raises here; the hooks already added for it are removed. A
    module whose class keeps ``nn.Module``'s registration (``plain``) gets its hooks written
    into its hook dictionaries as ``register_forward_pre_hook(with_kwargs=True)`` and
    ``register_forward_hook(with_kwargs=True)`` write them (``torch/nn/modules/module.py``;
    ids from ``RemovableHandle.next_id``), without the two handles (≈ 8 → 1.7 µs per module
    to add and remove, issue 19); :meth:`HookHandle.remove` deletes them as
    ``RemovableHandle.remove`` would.
    """
    site.log = log
    pre = post = site  # ModuleSite.__call__: the pre-hook and the forward hook
    if plain and site.root is None and _write_direct(mod, site, handle._direct):
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
