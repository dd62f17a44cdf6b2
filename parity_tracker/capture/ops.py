"""The op recorder: a ``TorchDispatchMode`` that records the aten ops of one forward.

It only records (the shape of torch's ``torch.utils._debug_mode.DebugMode``): each op output
that owns new storage is held in an :class:`OpStore` (bounded, spilling, copy-on-write), as an
:class:`OpEvent` of the innermost module call running, an :class:`OpFrame`. Closed frames are
handed to a consumer (``on_close``); comparing two recordings is
:class:`parity_tracker.localize.op_compare.OpComparer`'s job. The session that wires both is
:class:`parity_tracker.ops.OpSession`; its module docstring states the capture rules, the tag
grammar (:func:`parity_tracker.capture.tags.op_tag`) and the memory bound.

Module names come from ``named_modules()`` with the root named by
:func:`parity_tracker.capture.tags.root_name`; ops run outside any module call belong to
:data:`parity_tracker.capture.tags.TOP_MODULE`.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from parity_tracker.capture.op_args import TensorArg, arg_spec, split_args, tensors_in
from parity_tracker.capture.op_store import (
    Held,
    OpStore,
    _capturable,
    _own,
    _ptr,
    guarded,
)
from parity_tracker.capture.tags import TOP_MODULE, root_name
from parity_tracker.compare.convert import tensor_version

__all__ = [
    "CaptureFailure", "DispatchRecorder", "OpEvent", "OpFrame", "OpInput", "SideRecorder",
    "TensorArg", "arg_spec", "suspended",
]  # fmt: skip

_SUSPEND = threading.local()
_len_dispatch_stack = torch._C._len_torch_dispatch_stack
_dispatch_stack_at = torch._C._get_dispatch_stack_at
_pop_dispatch_stack = torch._C._pop_torch_dispatch_stack
_push_dispatch_stack = torch._C._push_on_torch_dispatch_stack
_EVAL_FRAME = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
#: this torch lets the recorder check for a Dynamo frame callback itself (``DispatchRecorder``)
_OWN_DYNAMO_CHECK = all(
    hasattr(_EVAL_FRAME, name)
    for name in (
        "get_eval_frame_callback",
        "set_code_exec_strategy",
        "_FrameExecStrategy",
        "_FrameAction",
    )
)


class suspended:  # lower case: used as ``with suspended():`` (a function before issue 19)
    """Do not record ops run inside this block (re-entrant, per thread).

    Capture code that runs inside a recorded forward (the TensorChecker's hooks cloning inputs
    and outputs, manual ``register_tensor``) must wrap its own tensor work in this, or its copies
    appear as ops of the module being recorded. A class rather than a generator context
    manager: every hooked module call enters it twice (≈ 1 µs less each).
    """

    __slots__ = ("_popped",)

    def __enter__(self) -> None:
        _SUSPEND.depth = getattr(_SUSPEND, "depth", 0) + 1
        self._popped = None
        try:
            # issue 19: no dispatch mode at all (a module-level run) is answered in C
            n = _len_dispatch_stack()
            if n and isinstance(_dispatch_stack_at(n - 1), DispatchRecorder):
                # Step out of the recorder entirely: the suspended work then costs nothing
                # extra. What ``_pop_mode_temporarily()`` does for a mode without a dispatch
                # key, without its generator context manager (issue 19: ≈ 2 µs a call).
                self._popped = _pop_dispatch_stack(None)
        except BaseException:
            _SUSPEND.depth -= 1
            raise

    def __exit__(self, *exc: object) -> bool:
        try:
            if self._popped is not None:
                _push_dispatch_stack(self._popped)
        finally:
            _SUSPEND.depth -= 1
        return False


def _is_suspended() -> bool:
    return getattr(_SUSPEND, "depth", 0) > 0


# ---------------------------------------------------------------------------------------------
# Op schema facts (cached per overload)


@dataclass(frozen=True)
class _OpInfo:
    name: str
    overload: str  # the schema's overload name ("default" when it has none)
    view_returns: tuple[bool, ...]  # return i aliases an input without writing (a view)
    written_args: tuple[tuple[int, str], ...]  # (position, name) of arguments written in place
    #: one ``Tensor`` return, a view, nothing written: ``on_op`` never captures anything of it
    view_only: bool = False
    #: what calling ``func`` calls: an ``OpOverload``'s C++ op (``OpOverload.__call__`` is
    #: ``self._op(*args, **kwargs)``; issue 19: one Python frame less per op), else ``func``
    call: Callable[..., Any] | None = None


_OP_INFO: dict[Any, _OpInfo] = {}


def _op_info(func: Any) -> _OpInfo:
    info = _OP_INFO.get(func)
    if info is None:
        schema = func._schema
        ns, _, name = schema.name.partition("::")
        views = tuple(
            r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
        )
        written = tuple(
            (i, a.name)
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        overload = schema.overload_name or "default"
        view_only = views == (True,) and not written and str(schema.returns[0].type) == "Tensor"
        name = name if ns == "aten" else f"{ns}.{name}"
        call = func._op if type(func) is torch._ops.OpOverload else func
        info = _OpInfo(name, overload, views, written, view_only, call)
        _OP_INFO[func] = info
    return info


# ---------------------------------------------------------------------------------------------
# Recorded events


@dataclass
class OpInput:
    """One tensor input of a recorded op."""

    src: tuple[int, int] | None  # (producer event seq, output index); None = external
    rel_off: int  # storage offset relative to the producer output's offset
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    contiguous: bool
    #: the tensor's version counter when the op ran (in-place updates); None for an
    #: inference tensor, which has none (``compare.convert.tensor_version``)
    version: int | None = 0
    held: Held | None = None  # the live input (candidate) / external tensor (reference)

    def layout(self) -> dict[str, Any]:
        """dtype, stride and contiguity (for ``localize.align.layout_differences``)."""
        return {
            "dtype": str(self.dtype).removeprefix("torch."),
            "stride": self.stride,
            "contiguous": self.contiguous,
        }


@dataclass
class OpEvent:
    """One recorded op call (with at least one captured output) or a manual registration."""

    seq: int
    op: str
    k: int
    outs: list[tuple[int, Held, int]]  # (output index, capture, storage offset at capture)
    inputs: list[OpInput]
    tag: str | None = None  # manual registrations only
    overload: str = "default"  # the aten overload (``Tensor``, ``dim_IntList``, ...)
    args: tuple[tuple, dict[str, Any]] | None = None  # ``arg_spec`` of the call


@dataclass
class OpFrame:
    """One module call of one step (or the top frame) and the events recorded in it."""

    step: int
    module: str
    call: int
    events: list[OpEvent] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, str, int]:
        """``(step, module, call)``: the same call on both sides."""
        return (self.step, self.module, self.call)


class CaptureFailure:
    """The op recorder's own first failure; once set, recording stops and the forward goes on.

    Op capture must never turn its own failure into "the forward raised": the forward runs on,
    and the ops rows it could not record become ``error`` (``parity_tracker.ops.OpSession``).
    """

    def __init__(self) -> None:
        #: ``"Type: message"`` of the first failure, else None.
        self.error: str | None = None

    def fail(self, exc: BaseException) -> None:
        """Record ``exc`` unless a failure is already recorded."""
        if self.error is None:
            self.error = f"{type(exc).__name__}: {exc}"[:500]

    def guard(self, fn: Callable[..., Any]) -> Callable[..., None]:
        """``fn`` made harmless: skipped after a failure, its exception recorded, not raised."""

        def guarded(*args: Any) -> None:
            if self.error is not None:
                return None
            try:
                fn(*args)
            except Exception as exc:
                self.fail(exc)
            return None

        return guarded


class DispatchRecorder(TorchDispatchMode):
    """The dispatch mode: runs each op, then hands it to the side being recorded.

    Args:
        side: the side being recorded.
        failure: where the recorder's own failure goes (default: a fresh one); the op always
            runs, whatever the recorder does.
    """

    def __init__(self, side: SideRecorder, failure: CaptureFailure | None = None):
        super().__init__()
        self.side = side
        self.failure = failure if failure is not None else CaptureFailure()
        self._on_op = self.failure.guard(side.on_op)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: ``__torch_dispatch__`` is not wrapped in ``torch._disable_dynamo`` here.

        Issue 19: that wrapper (two Python frames and three ``set_eval_frame`` calls per op)
        only matters while a Dynamo frame callback is installed (a ``torch.compile``d region
        running); ``__torch_dispatch__`` checks for one itself (one C call, ≈ 30 ns) and only
        then goes through the wrapped form (``_dynamo_off``). A torch without those entry
        points keeps its own wrapper.
        """
        return False if _OWN_DYNAMO_CHECK else super()._should_skip_dynamo()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _eval_frame_callback() is not None:  # inside a compiled region: as torch does
            return _dynamo_off(self, func, types, args, kwargs)
        return self._dispatch(func, args, kwargs)

    def _dispatch(self, func, args, kwargs):
        kwargs = kwargs or {}
        if getattr(_SUSPEND, "depth", 0) > 0 or self.failure.error is not None:
            return func(*args, **kwargs)
        try:
            info = _OP_INFO.get(func) or _op_info(func)
            before = None
            if info.written_args:
                # Describe (and pin) the inputs before the write, then copy-on-write every held
                # tensor the op is about to overwrite, so inputs keep their pre-write values.
                before = [self.side.describe(t) for t in tensors_in(args, kwargs)]
                for pos, name in info.written_args:
                    target = args[pos] if pos < len(args) else kwargs.get(name)
                    # a written ``Tensor(a!)[]`` (``_foreach_add_``): each of its tensors
                    for t in target if isinstance(target, (list, tuple)) else (target,):
                        self.side.store.before_write(t)
        except Exception as exc:  # the recorder's own failure never fails the forward
            self.failure.fail(exc)
            return func(*args, **kwargs)
        out = info.call(*args, **kwargs)
        # issue 19: a view op's one output is never captured (``SideRecorder.on_op`` would
        # find nothing new and return); about 2 of 3 ops of a transformer
        if not (info.view_only and isinstance(out, torch.Tensor)):
            self._on_op(info, args, kwargs, out, before)
        return out


def _raw_dispatch(self: DispatchRecorder, func, types, args=(), kwargs=None):
    return self._dispatch(func, args, kwargs)


#: what ``TorchDispatchMode.__init_subclass__`` would have installed (torch's own wrapper)
_dynamo_off = torch._disable_dynamo(_raw_dispatch, recursive=True)
if _OWN_DYNAMO_CHECK:
    _eval_frame_callback = _EVAL_FRAME.get_eval_frame_callback
    # Dynamo never converts the checking frame itself (``torch._dynamo.eval_frame.skip_code``,
    # without importing ``torch._dynamo``); the frames it calls run with Dynamo off.
    _EVAL_FRAME.set_code_exec_strategy(
        DispatchRecorder.__torch_dispatch__.__code__,
        _EVAL_FRAME._FrameExecStrategy(
            _EVAL_FRAME._FrameAction.SKIP, _EVAL_FRAME._FrameAction.DEFAULT
        ),
    )
else:  # torch wraps ``__torch_dispatch__`` itself

    def _eval_frame_callback() -> None:
        return None


def _release_inputs(store: OpStore, described: list[OpInput] | None) -> None:
    """Release the inputs pinned before an in-place op that captured nothing."""
    for d in described or ():
        if d.held is not None:
            store.release(d.held)


class SideRecorder:
    """Recording state of one side: module-call stack, producers, frames.

    Args:
        index: 0 reference, 1 candidate.
        model: the model run (module names); ``None``: the first module called is the root.
        store: where captures are held.
        params: filled with the storage pointers of ``model``'s parameters and buffers
            (memory the model holds anyway: not counted against the budget).
        step_getter: the current step; module call indices restart at each step.
        on_close: receives each closed frame (a finished module call, or the top frame).
    """

    def __init__(
        self,
        index: int,
        model: torch.nn.Module | None,
        *,
        store: OpStore,
        params: set[int],
        step_getter: Callable[[], int],
        on_close: Callable[[SideRecorder, OpFrame], None],
    ):
        self.index, self.store, self.params = index, store, params
        self.step_getter, self.on_close = step_getter, on_close
        self.names: dict[int, str] = {}
        if model is not None:
            self._learn(model, root_name(model), top=True)
        self.stack: list[OpFrame] = []
        self.top: OpFrame | None = None
        self.calls: dict[str, int] = {}
        self.step: int | None = None
        #: storage address -> ``((producer seq, output index), storage offset)``
        self.producers: dict[int, tuple[tuple[int, int], int]] = {}
        self.seq = itertools.count()
        self.manual_counts: dict[str, int] = {}

    # -- module tracking ---------------------------------------------------------------------

    def _learn(self, model: torch.nn.Module, root: str, *, top: bool) -> None:
        names, params = self.names, self.params
        # issue 19: one walk (``parameters()`` and ``buffers()`` each walk the modules again)
        for name, mod in model.named_modules():
            full = root if not name else name if top else f"{root}.{name}"
            names.setdefault(id(mod), full)
            if top:  # parameters/buffers: long-lived, their comparisons are cached
                for t in itertools.chain(mod._parameters.values(), mod._buffers.values()):
                    if t is not None:
                        params.add(_ptr(t.detach()))

    def _name_of(self, mod: torch.nn.Module) -> str:
        name = self.names.get(id(mod))
        if name is None:
            if not self.stack:
                self._learn(mod, root_name(mod), top=True)
            else:
                parent = self.stack[-1].module
                self._learn(mod, f"{parent}.{type(mod).__name__}", top=False)
            name = self.names[id(mod)]
        return name

    def _sync_step(self) -> int:
        step = int(self.step_getter())
        if step != self.step:
            if self.top is not None:
                self.on_close(self, self.top)
                self.top = None
            self.step, self.calls = step, {}
        return step

    def pre_hook(self, mod: torch.nn.Module, _args: Any) -> None:
        """Global forward pre-hook: open a frame for the module call."""
        if _is_suspended():
            return
        step = self._sync_step()
        name = self._name_of(mod)
        call = self.calls.get(name, 0)
        self.calls[name] = call + 1
        self.stack.append(OpFrame(step, name, call))

    def post_hook(self, mod: torch.nn.Module, _args: Any, _out: Any) -> None:
        """Global forward hook: close the innermost frame (hand it to ``on_close``)."""
        if _is_suspended() or not self.stack:
            return
        if self.stack[-1].module != self._name_of(mod):  # a call left by an exception
            return
        self.on_close(self, self.stack.pop())

    def frame(self) -> OpFrame:
        """The innermost open frame (the step's top frame outside any module call)."""
        if self.stack:
            return self.stack[-1]
        step = self._sync_step()
        if self.top is None:
            self.top = OpFrame(step, TOP_MODULE, 0)
        return self.top

    def finish(self) -> None:
        """Close every open frame (end of the recording)."""
        while self.stack:
            self.on_close(self, self.stack.pop())
        if self.top is not None:
            self.on_close(self, self.top)
            self.top = None
        self.producers.clear()

    # -- ops -----------------------------------------------------------------------------------

    def on_op(
        self,
        info: _OpInfo,
        args: tuple,
        kwargs: Mapping[str, Any],
        out: Any,
        before: list[OpInput] | None,
    ) -> None:
        """Dispatch callback: capture the op's new-storage outputs as an event."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        views = info.view_returns
        new = [
            (i, t, _ptr(t))  # issue 19: each storage pointer read once
            for i, t in enumerate(outs)
            if _capturable(t) and not (i < len(views) and views[i])
        ]
        if not new:
            _release_inputs(self.store, before)
            return
        # issue 19: the tensor inputs and the call's spec in one pass
        tensors, spec = split_args(args, kwargs)
        ptrs: list[int] | None = None
        if not info.written_args:  # undeclared aliases (``_unsafe_view``)
            ptrs = [_ptr(t) for t in tensors]  # issue 19: read once, for describe too
            new = [(i, t, p) for i, t, p in new if p == 0 or p not in ptrs]
            if not new:
                return
        frame = self.frame()
        if before is not None:
            inputs = before
        else:
            if ptrs is None:
                ptrs = [_ptr(t) for t in tensors]
            describe = self.describe
            inputs = [describe(t, p) for t, p in zip(tensors, ptrs, strict=True)]
        seq = next(self.seq)
        held = []
        hold, producers = self.store.hold, self.producers
        for i, t, p in new:
            # the output itself with its content hash (checked when compared), or a private
            # copy (another device, a wrapper subclass: no storage address, ``_ptr`` 0)
            kept, digest = guarded(t)
            off = t.storage_offset()
            held.append((i, hold(kept, ptr=p if digest is not None else None, digest=digest), off))
            if p:
                producers[p] = ((seq, i), off)
        counts = frame.counts
        k = counts.get(info.name, 0)
        counts[info.name] = k + 1
        frame.events.append(OpEvent(seq, info.name, k, held, inputs, None, info.overload, spec))

    def describe(self, t: torch.Tensor, ptr: int | None = None) -> OpInput:
        """Where an op input comes from (producer or external) and its layout; pins it.

        ``ptr``: ``_ptr(t)`` when the caller has read it already (issue 19: read once).
        """
        src, rel = None, 0
        if ptr is None:
            ptr = _ptr(t)
        if ptr:
            prod = self.producers.get(ptr)
            if prod is not None:  # ``((seq, output index), storage offset)``
                src, rel = prod[0], t.storage_offset() - prod[1]
        d = OpInput(
            src, rel, tuple(t.shape), t.stride(), t.dtype, t.is_contiguous(), tensor_version(t)
        )
        # The reference keeps external inputs (parameters, model inputs) to compare them with
        # the candidate's; the candidate keeps every input until its module call is compared.
        if (self.index == 1 or src is None) and _capturable(t):
            # Counted (and spillable) unless it only references memory held anyway: a
            # parameter/buffer of the model or a storage a counted capture already holds.
            counted = ptr not in self.params and not self.store.counts(ptr)
            d.held = self.store.hold(_own(t), counted=counted, ptr=ptr)
        return d

    def manual(self, tag: str, tensor: torch.Tensor) -> OpEvent:
        """Record a manual registration (a copy of ``tensor``) in the innermost frame."""
        frame = self.frame()
        with suspended():
            held = self.store.hold(tensor.detach().clone())
        k = self.manual_counts.get(tag, 0)
        self.manual_counts[tag] = k + 1
        ev = OpEvent(next(self.seq), "manual", k, [(0, held, 0)], [], tag=tag)
        frame.events.append(ev)
        return ev
