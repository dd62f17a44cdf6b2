"""Per-op capture and root-cause localization (issue 5; seed §4 steps 2 and 3).

``OpSession`` records the output of every aten op of both models with a
``TorchDispatchMode`` (``torch.utils._python_dispatch``), attributes each op to the innermost
module call (global module forward hooks, as ``torch.utils.module_tracker.ModuleTracker`` does,
but keeping a stack so the innermost call is known), aligns the two op sequences of each module
call by LCS (:func:`parity_tracker.localize.align_ops`), compares the aligned outputs with
:func:`parity_tracker.compare.compare_tensors` and separates root causes from propagated
differences.

Tags: ``{module}@{call}::{op}#{k}`` — ``module`` from ``named_modules()`` with the root named
``model``, ``call`` the module's call index within the step (0 first), ``op`` the aten overload
packet name (``gelu``, ``addmm``, ``native_layer_norm``; other namespaces keep theirs:
``quantized.linear``), ``k`` the occurrence of that op within the module call. Output ``i >= 1``
of a multi-output op appends ``:{i}``. Ops run outside any module call are attributed to
``_top_`` (call 0 per step).

What is captured (issue 5 §4): only outputs that own new storage. Ops whose outputs alias an
input (views: ``transpose``, ``view``, ``expand``, ...; known from the schema's
``alias_info``) are skipped — a view is known by its base. In-place and ``out=`` ops are
captured (they write new values into existing storage). Captures are *references*, not copies;
before an in-place op writes into a storage that a capture still references, that capture is
copied (copy-on-write), so each capture keeps the value its op produced.

Lockstep and the memory bound: the reference side (``recording(0)``) runs first and its
captures are kept for the session; the candidate side (``recording(1)``) is compared module call
by module call as each call completes (align, compare, release). The candidate also keeps a
reference to each input of the ops of its open module calls (to compare inputs by value), and
the reference to each input made outside the recorded ops (model inputs, parameters). All of
these go through one store that keeps at most ``max_resident_bytes`` resident, counting each
held storage once and not counting parameters/buffers of the models (memory the models hold
anyway); past the budget, the oldest holdings are written to ``spill_dir`` and read back
memory-mapped (``torch.from_file``) when compared. After every capture::

    resident_bytes <= max_resident_bytes        (both sides, whatever the model depth)

so the peak extra memory is ``max_resident_bytes`` plus the comparison temporaries of one pair
(``compare_tensors`` works chunk by chunk) plus the output of the op being recorded (which the
forward made anyway) — independent of model depth. Disk holds what was spilled (at most the
reference's new-storage op outputs plus the candidate's open-call holdings).

``inputs_status`` of an op: each tensor input is traced to the op output that produced its
storage (a map storage ``data_ptr`` -> producing op). An input whose producers on both sides are
an aligned pair already compared, seen through the same view (shape, stride, offset, dtype),
takes that pair's status; inputs made outside the recorded ops on both sides (model inputs,
parameters, buffers) are compared directly (parameter/buffer pairs cached by storage and
version counter); any other input (a producer that
is not aligned yet, a different view) is compared by value: the reference's input is rebuilt
from its producer's capture, the candidate's is the live input. ``passing`` = all inputs pass,
``failing`` = one fails, else ``unknown``.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _get_current_dispatch_mode,
    _pop_mode_temporarily,
    is_traceable_wrapper_subclass,
)

from parity_tracker.compare import PASSING, Comparison, compare_tensors
from parity_tracker.errors import InputError
from parity_tracker.localize import align_ops, classify, layout_differences
from parity_tracker.spill import SpillCounters, SpillDir, Spilled
from parity_tracker.tolerances import Tolerances

#: Default resident budget for captured storage (bytes): 512 MiB, half of the 1 GiB extra-memory
#: target of a parity run (issue 5/9), so the op store, the TensorChecker's module snapshots
#: (``tensor_checker.DEFAULT_EAGER_RESIDENT_BYTES``, 512 MiB) and the comparison temporaries of
#: one pair fit together; before, the op store alone could fill the whole 1 GiB.
DEFAULT_MAX_RESIDENT_BYTES = 512 << 20

#: Ops that only copy or allocate; present on one side only they are a layout difference,
#: not a missing computation, so they are never reported as a case-C root cause.
LAYOUT_OPS = frozenset(
    {
        "clone",
        "contiguous",
        "copy",
        "copy_",
        "_to_copy",
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "_unsafe_view",
        "lift_fresh",
        "lift_fresh_copy",
        "detach_",
    }
)

_TOP = "_top_"
_SUSPEND = threading.local()


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Do not record ops run inside this block (re-entrant, per thread).

    Capture code that runs inside a recorded forward (the TensorChecker's hooks cloning inputs
    and outputs, manual ``register_tensor``) must wrap its own tensor work in this, or its copies
    appear as ops of the module being recorded.
    """
    _SUSPEND.depth = getattr(_SUSPEND, "depth", 0) + 1
    try:
        if isinstance(_get_current_dispatch_mode(), _Recorder):
            # Step out of the recorder entirely: the suspended work then costs nothing extra.
            with _pop_mode_temporarily():
                yield
        else:
            yield
    finally:
        _SUSPEND.depth -= 1


def _is_suspended() -> bool:
    return getattr(_SUSPEND, "depth", 0) > 0


# ---------------------------------------------------------------------------------------------
# Op schema facts (cached per overload)


@dataclass(frozen=True)
class _OpInfo:
    name: str
    view_returns: tuple[bool, ...]  # return i aliases an input without writing (a view)
    written_args: tuple[tuple[int, str], ...]  # (position, name) of arguments written in place


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
        info = _OpInfo(name if ns == "aten" else f"{ns}.{name}", views, written)
        _OP_INFO[func] = info
    return info


def _tensors_in(args: tuple, kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    """Tensor arguments in schema order (one level of lists, e.g. ``cat``)."""
    out: list[torch.Tensor] = []
    for value in itertools.chain(args, kwargs.values()):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


def _capturable(t: Any) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.layout == torch.strided
        and not t.is_meta
        and not t.is_quantized
    )


def _ptr(t: torch.Tensor) -> int:
    """The data pointer of ``t``'s storage (0 for an empty storage or a non-strided tensor).

    A wrapper tensor subclass (``DTensor``, ...) has no storage of its own (touching it raises
    "invalid python storage"): 0, and its captures are private copies (:func:`_own`).
    """
    if not _capturable(t) or is_traceable_wrapper_subclass(t):
        return 0
    storage = t.untyped_storage()
    return storage.data_ptr() if storage.nbytes() else 0


def _own(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached; a private copy for a wrapper subclass, which copy-on-write cannot track."""
    t = t.detach()
    return t.clone() if is_traceable_wrapper_subclass(t) else t


def _span(t: torch.Tensor) -> int:
    """Storage elements spanned by ``t`` from its storage offset (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))


def _flat_span(t: torch.Tensor) -> torch.Tensor:
    return torch.as_strided(t, (_span(t),), (1,), t.storage_offset())


# ---------------------------------------------------------------------------------------------
# The capture store: resident budget, spill to disk, copy-on-write


def _dense(t: torch.Tensor) -> torch.Tensor | None:
    """A plain tensor for ``t`` (``parity_tracker.convert``: DTensor → ``full_tensor()``)."""
    if not is_traceable_wrapper_subclass(t):
        return t
    from parity_tracker.convert import to_tensor

    return to_tensor(t).tensor


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s storage (its elements for a wrapper subclass, which has none)."""
    if is_traceable_wrapper_subclass(t):
        return t.numel() * t.element_size()
    return t.untyped_storage().nbytes()


class _Held:
    """One captured tensor: resident (a reference or a private copy) or spilled to disk."""

    __slots__ = (
        "counted", "device", "dtype", "id", "nbytes", "size", "spilled", "stride", "tensor",
    )  # fmt: skip

    def __init__(self, hid: int, tensor: torch.Tensor, counted: bool):
        self.id = hid
        self.tensor: torch.Tensor | None = tensor
        self.counted = counted
        self.spilled: Spilled | None = None
        self.size, self.stride = tuple(tensor.shape), tensor.stride()
        self.dtype, self.device = tensor.dtype, tensor.device
        self.nbytes = _nbytes(tensor) if counted else 0

    def get(self) -> torch.Tensor:
        """The tensor, read back memory-mapped if it was spilled."""
        if self.tensor is not None:
            return self.tensor
        assert self.spilled is not None
        return self.spilled.load()


class _Store:
    """Keeps captures within ``max_resident_bytes``, spilling the oldest to ``spill_dir``."""

    def __init__(self, max_resident_bytes: int, spill_dir: str | os.PathLike[str] | None):
        self.max_resident_bytes = max_resident_bytes
        self._spill_dir = SpillDir(spill_dir, prefix="ops-spill-")
        self._resident: OrderedDict[int, _Held] = OrderedDict()
        self._by_ptr: dict[int, list[_Held]] = {}
        self._ids = itertools.count()
        self.resident_bytes = 0
        self.peak_resident_bytes = 0
        self.spilled_bytes = 0
        self.spilled_count = 0

    def hold(self, tensor: torch.Tensor, *, counted: bool = True) -> _Held:
        """Keep a reference to ``tensor`` (counted captures may later be spilled)."""
        # a wrapper subclass (DTensor) is never spilled: kept resident, outside the budget
        h = _Held(next(self._ids), tensor, counted and not is_traceable_wrapper_subclass(tensor))
        self._index(h)
        if counted:
            self._admit(h)
        return h

    def counts(self, ptr: int) -> bool:
        """Whether a counted, resident capture holds the storage at ``ptr``."""
        return any(h.counted for h in self._by_ptr.get(ptr, ()))

    def _index(self, h: _Held) -> None:
        assert h.tensor is not None
        if _ptr(h.tensor):
            self._by_ptr.setdefault(_ptr(h.tensor), []).append(h)

    def _unindex(self, h: _Held) -> None:
        if h.tensor is None or not _ptr(h.tensor):
            return
        ptr = _ptr(h.tensor)
        lst = self._by_ptr.get(ptr)
        if lst is not None:
            with contextlib.suppress(ValueError):
                lst.remove(h)
            if not lst:
                del self._by_ptr[ptr]

    def _admit(self, h: _Held) -> None:
        self._resident[h.id] = h
        self.resident_bytes += h.nbytes
        while self.resident_bytes > self.max_resident_bytes and self._resident:
            self._spill(self._resident.popitem(last=False)[1])
        self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)

    def before_write(self, tensor: torch.Tensor) -> None:
        """Copy every held tensor sharing ``tensor``'s storage before an in-place write."""
        if not isinstance(tensor, torch.Tensor) or not _ptr(tensor):
            return
        holders = self._by_ptr.pop(_ptr(tensor), None)
        for h in holders or ():
            assert h.tensor is not None
            copy = _flat_span(h.tensor).clone().as_strided(h.size, h.stride, 0)
            h.tensor = copy
            self._index(h)
            if h.counted:
                self._resident.pop(h.id, None)
                self.resident_bytes -= h.nbytes
            h.counted, h.nbytes = True, copy.untyped_storage().nbytes()
            self._admit(h)

    def _spill(self, h: _Held) -> None:
        self.resident_bytes -= h.nbytes
        if h.tensor is None:
            return
        self._unindex(h)
        h.spilled, h.tensor = self._spill_dir.write(h.tensor, f"{h.id}.bin"), None
        self.spilled_bytes += h.nbytes
        self.spilled_count += 1

    def release(self, h: _Held) -> None:
        """Forget ``h`` (resident reference dropped, spill file deleted)."""
        self._unindex(h)
        if self._resident.pop(h.id, None) is not None:
            self.resident_bytes -= h.nbytes
        h.tensor = None
        if h.spilled is not None:
            h.spilled.delete()
            h.spilled = None

    def close(self) -> None:
        """Drop everything and delete the spill directory."""
        for h in list(self._resident.values()):
            self.release(h)
        self._by_ptr.clear()
        self._spill_dir.close()


# ---------------------------------------------------------------------------------------------
# Recorded events


@dataclass
class _In:
    """One tensor input of a recorded op."""

    src: tuple[int, int] | None  # (producer event seq, output index); None = external
    rel_off: int  # storage offset relative to the producer output's offset
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    contiguous: bool
    version: int = 0  # the tensor's version counter when the op ran (in-place updates)
    held: _Held | None = None  # the live input (candidate) / external tensor (reference)

    def layout(self) -> dict[str, Any]:
        return {
            "dtype": str(self.dtype).removeprefix("torch."),
            "stride": self.stride,
            "contiguous": self.contiguous,
        }


@dataclass
class _Event:
    """One recorded op call (with at least one captured output) or a manual registration."""

    seq: int
    op: str
    k: int
    outs: list[tuple[int, _Held, int]]  # (output index, capture, storage offset at capture)
    inputs: list[_In]
    tag: str | None = None  # manual registrations only


@dataclass
class _Frame:
    step: int
    module: str
    call: int
    events: list[_Event] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.step, self.module, self.call)


class _Recorder(TorchDispatchMode):
    """The dispatch mode: runs each op, then hands it to the side being recorded."""

    def __init__(self, side: _Side):
        super().__init__()
        self.side = side

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        session = self.side.session
        if _is_suspended() or session.capture_error:
            return func(*args, **kwargs)
        try:
            info = _op_info(func)
            before = None
            if info.written_args:
                # Describe (and pin) the inputs before the write, then copy-on-write every held
                # tensor the op is about to overwrite, so inputs keep their pre-write values.
                before = [self.side.describe(t) for t in _tensors_in(args, kwargs)]
                for pos, name in info.written_args:
                    target = args[pos] if pos < len(args) else kwargs.get(name)
                    self.side.store.before_write(target)
        except Exception as exc:  # the recorder's own failure never fails the forward
            session._fail(exc)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        _guard(session, self.side.on_op)(info, args, kwargs, out, before)
        return out


def _guard(session: OpSession, fn: Callable[..., Any]) -> Callable[..., None]:
    """``fn`` made harmless: skipped once op capture failed, its exception recorded, not raised.

    Op capture must never turn its own failure into "the forward raised": the forward runs on,
    and the ops rows it could not record become ``error`` (``OpSession.capture_error``).
    """

    def guarded(*args: Any) -> None:
        if session.capture_error:
            return None
        try:
            fn(*args)
        except Exception as exc:
            session._fail(exc)
        return None

    return guarded


class _Side:
    """Recording state of one side: module-call stack, producers, frames."""

    def __init__(self, session: OpSession, index: int, model: torch.nn.Module | None):
        self.session, self.index, self.store = session, index, session._store
        self.names: dict[int, str] = {}
        session._params[index] = set()
        if model is not None:
            self._learn(model, "model")
        self.stack: list[_Frame] = []
        self.top: _Frame | None = None
        self.calls: dict[str, int] = {}
        self.step: int | None = None
        self.producers: dict[int, tuple[int, int, int]] = {}  # ptr -> (seq, out, offset)
        self.seq = itertools.count()
        self.manual_counts: dict[str, int] = {}

    # -- module tracking ---------------------------------------------------------------------

    def _learn(self, model: torch.nn.Module, root: str) -> None:
        if root == "model":  # parameters/buffers: long-lived, their comparisons are cached
            for t in itertools.chain(model.parameters(), model.buffers()):
                self.session._params[self.index].add(_ptr(t.detach()))
        for name, mod in model.named_modules():
            full = root if not name else f"{root}.{name}" if root != "model" else name
            self.names.setdefault(id(mod), full)

    def _name_of(self, mod: torch.nn.Module) -> str:
        name = self.names.get(id(mod))
        if name is None:
            if not self.stack:
                self._learn(mod, "model")
            else:
                parent = self.stack[-1].module
                self._learn(mod, f"{parent}.{type(mod).__name__}")
            name = self.names[id(mod)]
        return name

    def _sync_step(self) -> int:
        step = int(self.session._step_getter())
        if step != self.step:
            if self.top is not None:
                self.session._close(self, self.top)
                self.top = None
            self.step, self.calls = step, {}
        return step

    def pre_hook(self, mod: torch.nn.Module, _args: Any) -> None:
        if _is_suspended():
            return
        step = self._sync_step()
        name = self._name_of(mod)
        call = self.calls.get(name, 0)
        self.calls[name] = call + 1
        self.stack.append(_Frame(step, name, call))

    def post_hook(self, mod: torch.nn.Module, _args: Any, _out: Any) -> None:
        if _is_suspended() or not self.stack:
            return
        if self.stack[-1].module != self._name_of(mod):  # a call left by an exception
            return
        self.session._close(self, self.stack.pop())

    def frame(self) -> _Frame:
        if self.stack:
            return self.stack[-1]
        step = self._sync_step()
        if self.top is None:
            self.top = _Frame(step, _TOP, 0)
        return self.top

    def finish(self) -> None:
        while self.stack:
            self.session._close(self, self.stack.pop())
        if self.top is not None:
            self.session._close(self, self.top)
            self.top = None
        self.producers.clear()

    # -- ops -----------------------------------------------------------------------------------

    def on_op(
        self,
        info: _OpInfo,
        args: tuple,
        kwargs: Mapping[str, Any],
        out: Any,
        before: list[_In] | None,
    ) -> None:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        new = [
            (i, t)
            for i, t in enumerate(outs)
            if _capturable(t) and not (i < len(info.view_returns) and info.view_returns[i])
        ]
        tensors = _tensors_in(args, kwargs)
        if new and not info.written_args:  # undeclared aliases (``_unsafe_view``)
            shared = {_ptr(t) for t in tensors}
            new = [(i, t) for i, t in new if _ptr(t) not in shared or _ptr(t) == 0]
        if not new:
            for d in before or ():
                if d.held is not None:
                    self.store.release(d.held)
            return
        frame = self.frame()
        inputs = before if before is not None else [self.describe(t) for t in tensors]
        seq = next(self.seq)
        held = []
        for i, t in new:
            t = _own(t)
            held.append((i, self.store.hold(t), t.storage_offset()))
            if _ptr(t):
                self.producers[_ptr(t)] = (seq, i, t.storage_offset())
        k = frame.counts.get(info.name, 0)
        frame.counts[info.name] = k + 1
        frame.events.append(_Event(seq, info.name, k, held, inputs))

    def describe(self, t: torch.Tensor) -> _In:
        """Where an op input comes from (producer or external) and its layout; pins it."""
        src, rel = None, 0
        if _ptr(t):
            prod = self.producers.get(_ptr(t))
            if prod is not None:
                src, rel = (prod[0], prod[1]), t.storage_offset() - prod[2]
        d = _In(src, rel, tuple(t.shape), t.stride(), t.dtype, t.is_contiguous(), t._version)
        # The reference keeps external inputs (parameters, model inputs) to compare them with
        # the candidate's; the candidate keeps every input until its module call is compared.
        if _capturable(t) and (self.index == 1 or src is None):
            # Counted (and spillable) unless it only references memory held anyway: a
            # parameter/buffer of the model or a storage a counted capture already holds.
            ptr = _ptr(t)
            counted = ptr not in self.session._params[self.index] and not self.store.counts(ptr)
            d.held = self.store.hold(_own(t), counted=counted)
        return d

    def manual(self, tag: str, tensor: torch.Tensor) -> _Event:
        frame = self.frame()
        with suspended():
            held = self.store.hold(tensor.detach().clone())
        k = self.manual_counts.get(tag, 0)
        self.manual_counts[tag] = k + 1
        ev = _Event(next(self.seq), "manual", k, [(0, held, 0)], [], tag=tag)
        frame.events.append(ev)
        return ev


# ---------------------------------------------------------------------------------------------
# The session


class OpSession(SpillCounters):
    """Record the aten ops of a reference forward and a candidate forward, and compare them.

    Usage (what ``run_parity`` does with ``capture_ops=True``)::

        session = OpSession(mode="equal")
        with session.recording(0, model=reference):
            reference(*inputs)
        with session.recording(1, model=candidate):
            candidate(*inputs)
        rows = session.rows()            # the ops table (parity_tracker.tables.OPS_SCHEMA)
        first = session.root_causes()[0]  # the seed's step 2: the first op that differs

    Args:
        mode: comparison mode passed to ``compare_tensors`` (``"equal"`` or ``"allclose"``;
            resolve ``"auto"`` before).
        rtol, atol: session tolerances (``None`` = the comparison core's per-dtype defaults,
            those of ``torch.testing.assert_close``).
        tolerances: per-tag overrides ``{glob: (rtol, atol)}``, matched against op tags.
        step_getter: returns the current step (denoising/decoding step) of a multi-step run;
            module call indices restart at each step.
        spill_dir: where captures beyond the budget are written (a fresh temporary folder
            inside it, deleted by ``close()``); default: the system temporary folder.
        max_resident_bytes: resident budget for captured storage, in bytes (default 512 MiB;
            0 spills every capture).

    Raises:
        InputError: ``max_resident_bytes`` is negative.
    """

    def __init__(
        self,
        *,
        mode: str,
        rtol: float | None = None,
        atol: float | None = None,
        tolerances: Mapping[str, tuple[float, float]] | Tolerances | None = None,
        step_getter: Callable[[], int] = lambda: 0,
        spill_dir: str | os.PathLike[str] | None = None,
        max_resident_bytes: int | None = None,
    ):
        if max_resident_bytes is None:
            max_resident_bytes = DEFAULT_MAX_RESIDENT_BYTES
        if max_resident_bytes < 0:
            raise InputError(f"max_resident_bytes={max_resident_bytes}: use a byte count >= 0")
        self.mode, self.rtol, self.atol = mode, rtol, atol
        self.tolerances = (
            tolerances
            if isinstance(tolerances, Tolerances)
            else Tolerances(tolerances, rtol=rtol, atol=atol)
        )
        self._step_getter = step_getter
        self._store = _Store(max_resident_bytes, spill_dir)
        self._reference: dict[tuple[int, str, int], _Frame] = {}
        self._ref_events: dict[int, _Event] = {}
        self._manual_ref: dict[str, list[_Event]] = {}
        self._manual_frames: dict[int, _Frame] = {}
        self._manual_cand: dict[str, int] = {}
        self._visited: set[tuple[int, str, int]] = set()
        # candidate (seq, out) -> (status, reference seq, reference out)
        self._cand_status: dict[tuple[int, int], tuple[str, int | None, int | None]] = {}
        self._ref_status: dict[tuple[int, int], str] = {}  # reference (seq, out) -> status
        self._matched: list[tuple[int, int]] = []  # (reference seq, candidate seq) pairs
        self._ext_cache: dict[tuple, str] = {}
        self._params: list[set[int]] = [set(), set()]  # storage pointers, per side
        self._rows: list[dict[str, Any]] = []
        self._recorded: set[int] = set()
        self._finalized = False
        self._side: _Side | None = None
        #: ``"Type: message"`` of the op recorder's own first failure, else None.
        self.capture_error: str | None = None

    def _fail(self, exc: BaseException) -> None:
        """Record the op recorder's own failure; recording stops, the forward goes on."""
        if self.capture_error is None:
            self.capture_error = f"{type(exc).__name__}: {exc}"[:500]

    # -- public ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def recording(self, side: int, model: torch.nn.Module | None = None) -> Iterator[OpSession]:
        """Record the ops run inside the block as side ``side`` (0 reference first, 1 candidate).

        Args:
            side: 0 for the reference (must be recorded first), 1 for the candidate.
            model: the model being run, for module names from ``named_modules()``; without it
                the first module called becomes ``model`` and its submodules are named from it.

        Raises:
            InputError: ``side`` is not 0 or 1, is recorded twice, or 1 comes before 0.
        """
        if side not in (0, 1):
            raise InputError(f"recording(side={side!r}): use 0 (reference) or 1 (candidate)")
        if side in self._recorded or (side == 1 and 0 not in self._recorded):
            raise InputError(
                f"recording(side={side}): record the reference (0) once, then the candidate (1)"
            )
        self._recorded.add(side)
        try:
            state = _Side(self, side, model)
        except Exception as exc:  # the recorder's own failure never fails the forward
            self._fail(exc)
            yield self
            return
        self._side = state
        pre = register_module_forward_pre_hook(_guard(self, state.pre_hook))
        post = register_module_forward_hook(_guard(self, state.post_hook), always_call=True)
        try:
            with _Recorder(state):
                yield self
        finally:
            pre.remove()
            post.remove()
            _guard(self, state.finish)()
            self._side = None

    def record_manual(self, side: int, tag: str, tensor: torch.Tensor) -> None:
        """Record a manual ``register_tensor(tag, tensor)`` made during a recorded forward.

        It becomes a ``kind="manual"`` row of the ops table under ``tag`` (the k-th
        registration of a tag in a module call is compared with the reference's k-th), in the
        innermost module call running. Call it inside ``recording(side)``.

        Raises:
            InputError: no recording of ``side`` is active, or ``tensor`` is not a tensor.
        """
        if self._side is None or self._side.index != side:
            raise InputError(f"record_manual(side={side}): call it inside recording({side})")
        if not isinstance(tensor, torch.Tensor):
            raise InputError(f"record_manual({tag!r}): expected a torch.Tensor, got {type(tensor)}")
        self._side.manual(tag, tensor)

    def rows(self) -> list[dict[str, Any]]:
        """The ops table rows, in execution order (keys = ``tables.OPS_SCHEMA`` columns)."""
        self._finalize()
        return [{k: v for k, v in r.items() if not k.startswith("_")} for r in self._rows]

    def root_causes(self) -> list[dict[str, Any]]:
        """Root-cause rows, in execution order; the first answers the seed's step 2.

        A root cause is a failing op whose tensor inputs all pass, or an op (not a pure copy)
        that runs on one side only with no failing input.
        """
        return [r for r in self.rows() if r["root_cause"]]

    def close(self) -> None:
        """Release every capture and delete spilled files."""
        self._store.close()
        self._reference.clear()
        self._ref_events.clear()

    def __enter__(self) -> OpSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- frames ----------------------------------------------------------------------------------

    def _close(self, side: _Side, frame: _Frame) -> None:
        # Called from module hooks while the dispatch mode is active: our own tensor work
        # (reading spilled captures, comparisons) must not be recorded as ops.
        with suspended():
            self._close_frame(side, frame)

    def _close_frame(self, side: _Side, frame: _Frame) -> None:
        if side.index == 0:
            self._reference[frame.key] = frame
            for ev in frame.events:
                self._ref_events[ev.seq] = ev
                if ev.tag is not None:
                    self._manual_ref.setdefault(ev.tag, []).append(ev)
                    self._manual_frames[ev.seq] = frame
            return
        self._visited.add(frame.key)
        ref = self._reference.get(frame.key)
        self._compare_frame(ref.events if ref else [], frame)
        for ev in frame.events:
            for _i, h, _off in ev.outs:
                self._store.release(h)
            for d in ev.inputs:
                if d.held is not None:
                    self._store.release(d.held)

    def _finalize(self) -> None:
        if self._finalized or 1 not in self._recorded or self._side is not None:
            return
        self._finalized = True
        for key, frame in self._reference.items():
            if key not in self._visited:
                self._compare_frame(frame.events, _Frame(*key))
        for tag, refs in self._manual_ref.items():
            for ev in refs[self._manual_cand.get(tag, 0) :]:
                cmp = Comparison(
                    status="missing_candidate",
                    mode=self.mode,
                    ref_shape=ev.outs[0][1].size,
                    message=f"no candidate registration #{ev.k} of {tag!r}",
                )
                frame = self._manual_frames[ev.seq]
                self._rows.append(_manual_row(frame, ev, cmp, None, ev.seq))
        self._rows.sort(key=self._order_key())
        for i, r in enumerate(self._rows):
            r["exec_order"] = i
        if self.capture_error:
            self._mark_capture_error()

    def _mark_capture_error(self) -> None:
        """Rows op capture could not record become ``error`` naming the failure (never a pass)."""
        note = f"op capture failed ({self.capture_error}), so this op was not recorded"
        marked = False
        for r in self._rows:
            if r["status"] in ("missing_reference", "missing_candidate"):
                r["status"], marked = "error", True
                r["message"] = f"{note}; {r.get('message') or ''}".rstrip("; ")
        if not marked:
            self._rows.append(
                {"tag": "op_capture", "kind": "op", "status": "error", "mode": self.mode,
                 "message": note, "exec_order": len(self._rows), "root_cause": False}
            )  # fmt: skip

    def _order_key(self) -> Callable[[dict[str, Any]], tuple[int, int, int, int]]:
        """Sort key: execution order in candidate time.

        A reference-only row goes right after the candidate op matched with the last
        reference op that ran before it.
        """
        matched = sorted(self._matched)
        ref_seqs = [a for a, _ in matched]

        def key(row: dict[str, Any]) -> tuple[int, int, int, int]:
            if row["_cand_seq"] is not None:
                return (row["_cand_seq"], 0, 0, row["_out"])
            at = bisect.bisect_left(ref_seqs, row["_ref_seq"]) - 1
            anchor = matched[at][1] if at >= 0 else -1
            return (anchor, 1, row["_ref_seq"], row["_out"])

        return key

    def _compare_frame(self, ref_events: list[_Event], frame: _Frame) -> None:
        cand_events = frame.events
        ref_ops = [e for e in ref_events if e.tag is None]
        cand_ops = [e for e in cand_events if e.tag is None]
        pairs = align_ops([_align_key(e) for e in ref_ops], [_align_key(e) for e in cand_ops])
        for i, j in pairs:
            r = ref_ops[i] if i is not None else None
            c = cand_ops[j] if j is not None else None
            self._compare_event(frame, r, c)
        self._compare_manual(frame, [e for e in cand_events if e.tag is not None])

    def _compare_event(self, frame: _Frame, r: _Event | None, c: _Event | None) -> None:
        ev = c if c is not None else r
        assert ev is not None
        present = (
            "both" if r is not None and c is not None else "reference" if c is None else "candidate"
        )
        base = f"{frame.module}@{frame.call}::{ev.op}#{ev.k}"
        results = self._compare_outputs(base, r, c)
        inputs_status, layout = self._inputs_status(r, c)
        out_diffs = [
            f"output {i} dtype {cmp.ref_dtype} vs {cmp.cand_dtype}"
            for i, cmp in results
            if cmp.ref_dtype and cmp.cand_dtype and cmp.ref_dtype != cmp.cand_dtype
        ]
        for i, cmp in results:
            root, cause = self._root(ev.op, present, cmp, inputs_status, layout, out_diffs)
            message = cmp.message
            if root:
                message = _explain(cause, layout, out_diffs) + (f"; {message}" if message else "")
            self._rows.append(
                {
                    "tag": base if i == 0 else f"{base}:{i}",
                    "module": frame.module,
                    "kind": "op",
                    "slot": "output" if len(results) == 1 else f"output_{i}",
                    "call_index": frame.call,
                    "step": frame.step,
                    "op": ev.op,
                    "op_index": ev.k,
                    **cmp.to_dict(),
                    "message": message,
                    "inputs_status": inputs_status,
                    "root_cause": root,
                    "cause": cause,
                    "_cand_seq": c.seq if c is not None else None,
                    "_ref_seq": r.seq if r is not None else None,
                    "_out": i,
                }
            )

    def _root(
        self,
        op: str,
        present: str,
        cmp: Comparison,
        inputs_status: str,
        layout: list[str],
        out_diffs: list[str],
    ) -> tuple[bool, str | None]:
        if cmp.passed or cmp.status == "skipped":
            return False, None
        if present != "both":
            if op in LAYOUT_OPS or op == "manual" or inputs_status == "failing":
                return False, None
            return True, classify(present=present, inputs_status=inputs_status)
        cause = classify(
            present=present,
            inputs_status=inputs_status,
            layout_diffs=layout,
            output_diffs=out_diffs,
        )
        return cause is not None, cause

    def _compare_outputs(
        self, base: str, r: _Event | None, c: _Event | None
    ) -> list[tuple[int, Comparison]]:
        results: list[tuple[int, Comparison]] = []
        if r is None or c is None:
            ev = r if r is not None else c
            assert ev is not None
            status = "missing_candidate" if c is None else "missing_reference"
            absent = "candidate" if c is None else "reference"
            present_side = "reference" if c is None else "candidate"
            for i, h, _off in ev.outs:
                shape = h.size
                cmp = Comparison(
                    status=status,
                    mode=self.mode,
                    ref_shape=shape if r is not None else None,
                    cand_shape=shape if c is not None else None,
                    ref_dtype=str(h.dtype).removeprefix("torch.") if r is not None else None,
                    cand_dtype=str(h.dtype).removeprefix("torch.") if c is not None else None,
                    message=f"op {ev.op} ran only on the {present_side} side"
                    f" (no {absent} op aligned with it)",
                )
                results.append((i, cmp))
                if c is not None:
                    self._cand_status[(c.seq, i)] = (status, None, None)
                else:
                    self._ref_status[(ev.seq, i)] = status
            return results
        for (ri, rh, _), (ci, ch, _) in zip(r.outs, c.outs, strict=False):
            tag = base if ri == 0 else f"{base}:{ri}"
            ref_t, cand_t = rh.get(), ch.get()
            if ref_t.device != cand_t.device:
                ref_t = ref_t.to(cand_t.device)
            with suspended():
                cmp = self._compare(ref_t, cand_t, tag)
            results.append((ri, cmp))
            self._cand_status[(c.seq, ci)] = (cmp.status, r.seq, ri)
            self._ref_status[(r.seq, ri)] = cmp.status
        self._matched.append((r.seq, c.seq))
        return results

    # -- inputs ----------------------------------------------------------------------------------

    def _inputs_status(self, r: _Event | None, c: _Event | None) -> tuple[str, list[str]]:
        if r is None or c is None:
            ev = c if c is not None else r
            assert ev is not None
            return self._one_sided_inputs(ev, side=1 if c is not None else 0), []
        layout = layout_differences([d.layout() for d in r.inputs], [d.layout() for d in c.inputs])
        statuses = []
        for p in range(max(len(r.inputs), len(c.inputs))):
            if p >= len(r.inputs) or p >= len(c.inputs):
                statuses.append("unknown")
                continue
            statuses.append(self._input_status(r.inputs[p], c.inputs[p]))
        return _combine(statuses), layout

    def _one_sided_inputs(self, ev: _Event, side: int) -> str:
        """Inputs of an op that ran on one side only: its producers' statuses where known."""
        statuses = []
        for d in ev.inputs:
            if d.src is None:
                statuses.append("unknown")
            elif side == 0:
                statuses.append(_passfail(self._ref_status.get(d.src, "skipped")))
            else:
                known = self._cand_status.get(d.src)
                statuses.append("unknown" if known is None else _passfail(known[0]))
        return _combine(statuses)

    def _input_status(self, rd: _In, cd: _In) -> str:
        if rd.src is None and cd.src is None:
            return self._external_status(rd, cd)
        if rd.src is not None and cd.src is not None:
            known = self._cand_status.get(cd.src)
            same_view = (rd.shape, rd.stride, rd.rel_off, rd.dtype) == (
                cd.shape,
                cd.stride,
                cd.rel_off,
                cd.dtype,
            )
            if known is not None and (known[1], known[2]) == rd.src and same_view:
                return _passfail(known[0])
        return self._value_status(rd, cd)

    def _external_status(self, rd: _In, cd: _In) -> str:
        if rd.held is None or cd.held is None:
            return "unknown"
        ref_t, cand_t = rd.held.get(), cd.held.get()
        ref_p, cand_p = _ptr(ref_t), _ptr(cand_t)
        if ref_p not in self._params[0] or cand_p not in self._params[1]:
            return self._value_compare(ref_t, cand_t)
        # Both are parameters/buffers of the models (alive all session, so their storage
        # pointers are not reused); the version counters catch in-place updates.
        key = (
            (ref_p, ref_t.storage_offset(), rd.shape, rd.stride, rd.version),
            (cand_p, cand_t.storage_offset(), cd.shape, cd.stride, cd.version),
        )
        status = self._ext_cache.get(key)
        if status is None:
            status = self._value_compare(ref_t, cand_t)
            self._ext_cache[key] = status
        return status

    def _value_status(self, rd: _In, cd: _In) -> str:
        ref_t = self._rebuild_reference(rd)
        cand_t = cd.held.get() if cd.held is not None else None
        if ref_t is None or cand_t is None:
            return "unknown"
        return self._value_compare(ref_t, cand_t)

    def _value_compare(self, ref_t: torch.Tensor, cand_t: torch.Tensor) -> str:
        """Pass/fail of two op inputs by value.

        A dtype difference alone is layout (case B) evidence, not a value difference, so both
        are first cast to their promoted dtype.
        """
        with suspended():
            if is_traceable_wrapper_subclass(ref_t) or is_traceable_wrapper_subclass(cand_t):
                ref_t, cand_t = _dense(ref_t), _dense(cand_t)  # DTensor: its full tensor
                if ref_t is None or cand_t is None:
                    return "unknown"
            if ref_t.device != cand_t.device:
                ref_t = ref_t.to(cand_t.device)
            return self._verdict(ref_t, cand_t)

    def _verdict(self, ref_t: torch.Tensor, cand_t: torch.Tensor) -> str:
        """``passing`` / ``failing`` by the session's mode, without the metrics.

        ``equal``: identical values, NaN at the same positions counts as equal; ``allclose``:
        ``|c - r| <= atol + rtol * |r|`` with the session's tolerances for the two dtypes
        (``Tolerances.resolve``), NaN matched by position — the comparison core's rules.
        """
        if ref_t.shape != cand_t.shape:
            return "failing"
        if ref_t.dtype != cand_t.dtype:
            common = torch.promote_types(ref_t.dtype, cand_t.dtype)
            ref_t, cand_t = ref_t.to(common), cand_t.to(common)
        if torch.equal(ref_t, cand_t):
            return "passing"
        if not (ref_t.is_floating_point() or ref_t.is_complex()):
            return "failing"
        if self.mode == "allclose":
            rtol, atol = self.tolerances.resolve(None, ref_t.dtype, cand_t.dtype)
            ok = torch.isclose(cand_t, ref_t, rtol=rtol, atol=atol, equal_nan=True)
        else:
            ok = (ref_t == cand_t) | (ref_t.isnan() & cand_t.isnan())
        return "passing" if bool(ok.all()) else "failing"

    def _compare(self, ref_t: torch.Tensor, cand_t: torch.Tensor, tag: str | None) -> Comparison:
        return compare_tensors(ref_t, cand_t, mode=self.mode, tag=tag, tolerances=self.tolerances)

    def _rebuild_reference(self, rd: _In) -> torch.Tensor | None:
        """The reference op's input as it saw it, from its producer's capture."""
        if rd.src is None:
            return rd.held.get() if rd.held is not None else None
        ev = self._ref_events.get(rd.src[0])
        if ev is None:
            return None
        for i, h, _off in ev.outs:
            if i != rd.src[1]:
                continue
            base = h.get()
            if is_traceable_wrapper_subclass(base):  # no storage to view: the whole output only
                same = rd.rel_off == 0 and tuple(base.shape) == tuple(rd.shape)
                return base if same and base.stride() == tuple(rd.stride) else None
            offset = base.storage_offset() + rd.rel_off
            need = 1 + sum((s - 1) * st for s, st in zip(rd.shape, rd.stride, strict=True))
            if offset < 0 or (
                0 not in rd.shape
                and offset + need > base.untyped_storage().nbytes() // base.element_size()
            ):
                return None
            return torch.as_strided(base, rd.shape, rd.stride, offset)
        return None

    def _compare_manual(self, frame: _Frame, cand_manual: list[_Event]) -> None:
        for ev in cand_manual:
            assert ev.tag is not None
            self._manual_cand[ev.tag] = max(self._manual_cand.get(ev.tag, 0), ev.k + 1)
            refs = self._manual_ref.get(ev.tag, [])
            r = refs[ev.k] if ev.k < len(refs) else None
            h = ev.outs[0][1]
            if r is None:
                cmp = Comparison(
                    status="missing_reference",
                    mode=self.mode,
                    cand_shape=h.size,
                    message=f"no reference registration #{ev.k} of {ev.tag!r}",
                )
            else:
                with suspended():
                    cmp = self._compare(r.outs[0][1].get(), h.get(), ev.tag)
            self._rows.append(_manual_row(frame, ev, cmp, ev.seq, None))


def _align_key(ev: _Event) -> tuple:
    return (ev.op, tuple(h.size for _i, h, _off in ev.outs))


def _passfail(status: str) -> str:
    if status in PASSING:
        return "passing"
    if status in ("skipped",):
        return "unknown"
    return "failing"


def _combine(statuses: list[str]) -> str:
    if "failing" in statuses:
        return "failing"
    if all(s == "passing" for s in statuses):
        return "passing"
    return "unknown"


def _explain(cause: str | None, layout: list[str], out_diffs: list[str]) -> str:
    if cause == "A":
        return (
            "root cause (case A): inputs equal with the same layout, the op computes another result"
        )
    if cause == "B":
        return "root cause (case B): inputs equal in value but " + ", ".join(layout + out_diffs)
    if cause == "C":
        return "root cause (case C): op present on one side only (not implemented or substituted)"
    return ""


def _manual_row(
    frame: _Frame, ev: _Event, cmp: Comparison, cand_seq: int | None, ref_seq: int | None
) -> dict[str, Any]:
    return {
        "tag": ev.tag,
        "module": frame.module,
        "kind": "manual",
        "slot": "manual",
        "call_index": frame.call,
        "step": frame.step,
        "op": None,
        "op_index": ev.k,
        **cmp.to_dict(),
        "inputs_status": "unknown",
        "root_cause": False,
        "cause": None,
        "_cand_seq": cand_seq,
        "_ref_seq": ref_seq,
        "_out": 0,
    }
