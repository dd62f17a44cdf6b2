"""Capture of a ``torch.compile``-d module (``OptimizedModule``): hooks traced into its graph.

**The choice.** ``torch.compile(model)`` returns an ``OptimizedModule`` that wraps the model as
``_orig_mod``. Dynamo (torch >= 2.1; checked on 2.13) traces the forward hooks of submodules
*that exist when it compiles* into the graph, so the capture hooks every submodule of
``_orig_mod`` with a *tap*: a tiny hook that only clones the call's inputs / output
(``Tensor.clone`` inside the graph) and appends them to a Python list. Dynamo turns the appends
into graph outputs plus a list mutation replayed after the graph, so

- every module value is computed **by the compiled code** (the backend's kernels, fusions and
  reorderings), never by an eager re-run, and is materialised as an extra graph output (the
  intermediates a compiled graph would otherwise keep in registers are written out; this is
  what observing costs, and it can block a fusion across a module boundary, see
  docs/compiled-and-onnx.md);
- after the forward, an eager hook on the ``OptimizedModule`` replays the taps, in execution
  order, into the ordinary ``TensorChecker`` capture path: tags are the ``_orig_mod``'s own
  ``named_modules()`` names, so they pair with the reference (``checker_0``, not
  ``checker__orig_mod.0``).

Regional compilation (compiling each block separately so block boundaries are graph edges) was
the alternative; it changes what is compiled (no fusion across blocks), so the tool would check
another program than the user's. Tapping keeps the user's compile call and only adds outputs.

**Stale compiled code.** ``torch._dynamo.config.skip_nnmodule_hook_guards`` is ``True`` by
default: compiled code does not guard on hooks, so a model compiled *and run* before the hooks
were attached keeps running the hook-less code and no tap fires (the reported symptom: every
module missing). Hooking such a model discards dynamo's compiled code (``torch._dynamo.reset``,
with a warning saying so) so that the next call recompiles with the taps traced in; should a
forward still run without the taps, the forward raises :class:`~parity_tracker.errors.InputError`
saying what to do. Nothing uncaptured is ever reported as equal.

The compile settings, graph-break counts and the Inductor compiler check live in
:mod:`parity_tracker.adapters.compiled`; this module is the capture half (imported by
:func:`parity_tracker.capture.hooks.install`, so it stays in the capture layer).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch

from parity_tracker.capture.hook_marks import mark_capture_hook
from parity_tracker.capture.leaves import own_tensors
from parity_tracker.capture.ops import suspended
from parity_tracker.capture.tags import module_display_name, root_name
from parity_tracker.errors import InputError


def is_compiled(model: Any) -> bool:
    """True for a ``torch.compile``-d module (``OptimizedModule``), without importing dynamo."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and isinstance(model, eval_frame.OptimizedModule)


def _clone(obj: Any) -> Any:
    """Clone every tensor of a tuple/list/dict structure (traceable by Dynamo).

    Named tuples come back as plain tuples (the capture keys both by index). Dict subclasses
    (Hugging Face ``ModelOutput``) come back as plain dicts with the same keys in the same
    order: their tags are the same as the reference's dataclass flattening gives for every
    field that holds a value.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    if isinstance(obj, tuple):  # named tuples too: captured by index, as plain tuples are
        return tuple(_clone(v) for v in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def compiled_before(model: Any) -> bool:
    """Whether Dynamo already holds compiled code for this module's forward (it was run)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    fns = [type(model._orig_mod).forward, getattr(model.forward, "__wrapped__", None)]
    for fn in fns:
        code = getattr(fn, "__code__", None)
        if code is not None and _debug_get_cache_entry_list(code):
            return True
    return False


def _discard_stale_code(model: Any) -> bool:
    """Drop compiled code built without the taps (warns); True when something was dropped."""
    if not compiled_before(model):
        return False
    torch._dynamo.reset()
    name = type(model._orig_mod).__name__
    warnings.warn(
        f"TensorChecker: Dynamo already holds compiled code for {name}.forward (this model, or "
        f"another {name}, was compiled and run before the checker's hooks were attached); such "
        "code has no hooks in it (torch._dynamo.config.skip_nnmodule_hook_guards), so Dynamo's "
        "compiled code was discarded (torch._dynamo.reset()) and the next call recompiles with "
        "the hooks traced in. To avoid the recompile, hook the model after torch.compile and "
        "before its first call.",
        UserWarning,
        stacklevel=4,
    )
    return True


def install_compiled(model: Any, log: Any, handle: Any) -> None:
    """Hook a compiled module: taps traced into its graph, replayed into ``log`` after it.

    Called by :func:`parity_tracker.capture.hooks.install` for an ``OptimizedModule`` (the
    seed API and ``run_parity`` both go through it). Tags are those of ``model._orig_mod``.

    Args:
        model: the ``OptimizedModule``.
        log: the checker's :class:`~parity_tracker.capture.modules.CaptureLog`.
        handle: the ``HookHandle`` that owns the hooks (its ``side``, ``root_name``,
            ``module_names`` are filled in).

    Raises:
        InputError: a module object of ``model`` (its ``_orig_mod`` or any submodule) is
            hooked by another side's live handle of ``log``: refused before anything is
            hooked or recompiled, with ``run_parity``'s message (one owner:
            ``capture.hooks.refuse_shared_handle``).
    """
    from parity_tracker.capture.hooks import _has_forward, refuse_shared_handle

    listed = list(model.named_modules())  # the OptimizedModule's names: "_orig_mod.b", ...
    handle._names, handle._mods = [n for n, _ in listed], [m for _, m in listed]
    refuse_shared_handle(handle, log.handles)  # and other sides' installs now see these
    orig = model._orig_mod
    handle.recompiled = _discard_stale_code(model)
    root = root_name(orig)
    handle.root_name = root
    own = own_tensors(orig, root)
    all_own = [(m, own.get(id(m), [])) for m in {id(m): m for m in orig.modules()}.values()]
    table: list[tuple[str, torch.nn.Module, list, bool]] = []
    sink: list[tuple[Any, ...]] = []
    for raw, mod in orig.named_modules():
        if mod is not orig and not _has_forward(mod):
            continue
        i = len(table)
        table.append((module_display_name(raw, root), mod, own.get(id(mod), []), mod is orig))
        if mod is orig:
            continue  # the root's call is seen by the eager hooks of the OptimizedModule

        def tap_in(m, args, kwargs, _i=i):
            sink.append((_i, 0, _clone(args), _clone(kwargs)))

        def tap_out(m, args, kwargs, output, _i=i):
            sink.append((_i, 1, _clone(output)))

        mark_capture_hook(tap_in), mark_capture_hook(tap_out)
        handle._handles.append(mod.register_forward_pre_hook(tap_in, with_kwargs=True))
        handle._handles.append(mod.register_forward_hook(tap_out, with_kwargs=True))

    def begin(m, args, kwargs):
        sink.clear()
        sink.append((0, 0, _clone(args), _clone(kwargs)))

    def end(m, args, kwargs, output):  # not called when the forward raised
        sink.append((0, 1, output))

    def replay(m, args, kwargs, output):
        events, fired = list(sink), {e[0] for e in sink}
        sink.clear()
        with suspended():
            for ev in events:
                name, mod, entries, is_root = table[ev[0]]
                if ev[1] == 0:
                    log.pre_call(
                        handle.side, name, mod, ev[2], ev[3], entries, handle if is_root else None
                    )
                else:
                    log.post_call(handle.side, name, mod, ev[2], all_own if is_root else None)
        log.root_done(handle.side, root)
        if len(table) > 1 and fired <= {0} and output is not None:
            raise InputError(
                f"the compiled {type(orig).__name__} ran without the checker's hooks (its "
                "compiled code was built before they were attached), so no module inside it "
                "was captured: call torch._dynamo.reset() before hooking it, or hook the model "
                "after torch.compile and before its first call"
            )

    for fn in (begin, end, replay):
        mark_capture_hook(fn)
    handle._handles.append(model.register_forward_pre_hook(begin, with_kwargs=True))
    handle._handles.append(model.register_forward_hook(end, with_kwargs=True))
    handle._handles.append(model.register_forward_hook(replay, with_kwargs=True, always_call=True))
    handle.module_names = [t[0] for t in table]
