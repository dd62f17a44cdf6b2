"""Per-op capture and root-cause localization (issue 5; seed §4 steps 2 and 3).

``OpSession`` records the output of every aten op of both models with a
``TorchDispatchMode`` (``torch.utils._python_dispatch``), attributes each op to the innermost
module call (global module forward hooks, as ``torch.utils.module_tracker.ModuleTracker`` does,
but keeping a stack so the innermost call is known), aligns the two op sequences of each module
call by LCS (:func:`parity_tracker.localize.align_ops`), compares the aligned outputs with
:func:`parity_tracker.compare.compare_tensors` and separates root causes from propagated
differences.

The pieces: the recorder (:mod:`parity_tracker.capture.ops`), the frame-by-frame comparison
(:mod:`parity_tracker.localize.op_compare`, with :mod:`~parity_tracker.localize.inputs` and
:mod:`~parity_tracker.localize.root_cause`); this module wires them and keeps the public names
(``OpSession``, ``suspended``, ``DEFAULT_MAX_RESIDENT_BYTES``, ``LAYOUT_OPS``).

Tags (:func:`parity_tracker.capture.tags.op_tag`): ``{module}@{call}::{op}#{k}`` — ``module``
from ``named_modules()`` with the root named by :func:`parity_tracker.capture.tags.root_name`
(``model``, or ``root`` when a child is named ``model``), ``call`` the module's call index
within the step (0 first), ``op`` the aten overload packet name (``gelu``, ``addmm``,
``native_layer_norm``; other namespaces keep theirs: ``quantized.linear``), ``k`` the
occurrence of that op within the module call. Output ``i >= 1`` of a multi-output op appends
``:{i}``. Ops run outside any module call are attributed to
``_top_`` (call 0 per step).

What is captured (issue 5 §4): only outputs that own new storage. Ops whose outputs alias an
input (views: ``transpose``, ``view``, ``expand``, ...; known from the schema's
``alias_info``) are skipped — a view is known by its base. In-place and ``out=`` ops are
captured (they write new values into existing storage). Captures are *references*, not copies;
before an in-place op writes into a storage that a capture still references, that capture is
copied (copy-on-write), so each capture keeps the value its op produced. A write that bypasses
dispatch (a ``.numpy()`` or DLPack view, ctypes) is not seen that way: each CPU capture is held
with its xxh3 content hash taken when its op ran (``capture.op_store.guarded``; other devices:
a private copy), and an output whose bytes no longer hash the same when compared is an
``error`` row, never ``equal`` (issue 13).

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

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)

from parity_tracker.capture.op_store import OpStore
from parity_tracker.capture.ops import (
    CaptureFailure,
    DispatchRecorder,
    OpFrame,
    SideRecorder,
    suspended,
)
from parity_tracker.capture.store import SpillCounters
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.errors import InputError
from parity_tracker.localize.op_compare import OpComparer
from parity_tracker.localize.root_cause import LAYOUT_OPS
from parity_tracker.statuses import STRUCTURAL

__all__ = ["DEFAULT_MAX_RESIDENT_BYTES", "LAYOUT_OPS", "OpSession", "suspended"]

#: Default resident budget for captured storage (bytes): 16 MiB. Issue 19, item 5: the extra
#: peak memory of an op-level run stays flat in depth (depths 8, 32, 64 of 1 MiB activations
#: within 32 MiB of each other, ``benchmarks/bench_memory.py``): the op store holds at most
#: this much, plus the module snapshots of an op-level run
#: (``tensor_checker.OPS_RUN_RESIDENT_BYTES``, 8 MiB); the rest is spilled to disk and read
#: back memory-mapped. It was 512 MiB (1 GiB before that); the time this costs on large
#: models is in ``benchmarks/README.md`` ("Issue 19 — large models and flat memory").
DEFAULT_MAX_RESIDENT_BYTES = 16 << 20


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
        rows = session.rows()            # the ops table (parity_tracker.files.tables.OPS_SCHEMA)
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
        max_resident_bytes: resident budget for captured storage, in bytes (default 16 MiB;
            0 spills every capture).
        keep_bytes: size limit of the reproducer material kept for each of the first root
            causes (``parity_tracker.localize.keep``; issue 20); 0 (the default) keeps none.

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
        keep_bytes: int = 0,
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
        self._store = OpStore(max_resident_bytes, spill_dir)
        self._params: list[set[int]] = [set(), set()]  # storage pointers, per side
        self._comparer = OpComparer(
            mode, self.tolerances, self._store, self._params, keep_bytes=keep_bytes
        )
        self._recorded: set[int] = set()
        self._side: SideRecorder | None = None
        self._failure = CaptureFailure()
        self._marked = False

    @property
    def capture_error(self) -> str | None:
        """``"Type: message"`` of the op recorder's own first failure, else None.

        Op capture never fails the forward: after its first failure it stops recording, and
        the rows it could not record become ``error`` (:meth:`rows`).
        """
        return self._failure.error

    # -- public ----------------------------------------------------------------------------------

    @property
    def lender(self) -> OpStore:
        """The op store, whose spill files an op-level run's module snapshots borrow.

        Issue 19 (``capture.snapshot.SnapshotStore``): a buffer both hold is written once.
        """
        return self._store

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
        self._params[side].clear()
        failure = self._failure
        try:
            state = SideRecorder(
                side,
                model,
                store=self._store,
                params=self._params[side],
                step_getter=self._step_getter,
                on_close=self._close,
            )
        except Exception as exc:  # the recorder's own failure never fails the forward
            failure.fail(exc)
            yield self
            return
        self._side = state
        pre = register_module_forward_pre_hook(failure.guard(state.pre_hook))
        post = register_module_forward_hook(failure.guard(state.post_hook), always_call=True)
        try:
            with DispatchRecorder(state, failure):
                yield self
        finally:
            pre.remove()
            post.remove()
            failure.guard(state.finish)()
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
        return [_public(r) for r in self._final_rows()]

    def _final_rows(self) -> list[dict[str, Any]]:
        """The comparer's rows (private keys included), finalized once the candidate ran."""
        if 1 in self._recorded and self._side is None:
            self._comparer.finalize()
            if self.capture_error and not self._marked:
                self._mark_capture_error()
        return self._comparer.rows

    def _mark_capture_error(self) -> None:
        """Rows op capture could not record become ``error`` naming the failure (never a pass)."""
        self._marked = True
        rows = self._comparer.rows
        note = f"op capture failed ({self.capture_error}), so this op was not recorded"
        marked = False
        for r in rows:
            if r["status"] in STRUCTURAL:  # one-sided: the recorder stopped on one side
                r["status"], marked = "error", True
                r["message"] = f"{note}; {r.get('message') or ''}".rstrip("; ")
        if not marked:
            rows.append(
                {"tag": "op_capture", "kind": "op", "status": "error", "mode": self.mode,
                 "message": note, "exec_order": len(rows), "root_cause": False}
            )  # fmt: skip

    def root_causes(self) -> list[dict[str, Any]]:
        """Root-cause rows, in execution order; the first answers the seed's step 2.

        A root cause is a failing op whose tensor inputs all pass, or an op (not a pure copy)
        that runs on one side only with no failing input.
        """
        return [_public(r) for r in self._final_rows() if r["root_cause"]]  # the rows() rows

    def kept(self) -> tuple[list[Any], list[str]]:
        """Reproducer material of the first root causes, and the tags not kept.

        Returns:
            ``(material, tags)``: ``localize.keep.KeptOp`` (CPU copies that outlive ``close``)
            and the root-cause tags whose material exceeded ``keep_bytes``.
        """
        return list(self._comparer.kept), list(self._comparer.unkept)

    def close(self) -> None:
        """Release every capture and delete spilled files."""
        self._store.close()
        self._comparer.clear()

    def __enter__(self) -> OpSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- frames ----------------------------------------------------------------------------------

    def _close(self, side: SideRecorder, frame: OpFrame) -> None:
        # Called from module hooks while the dispatch mode is active: our own tensor work
        # (reading spilled captures, comparisons) must not be recorded as ops. A reference
        # frame is only kept (no tensor work; issue 19: no mode pop/push per module call).
        if side.index == 0:
            self._comparer.close_frame(0, frame)
            return
        with suspended():
            self._comparer.close_frame(side.index, frame)


def _public(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without the comparer's private keys (those starting with ``_``).

    Issue 19: a copy less the three private keys ``localize.op_compare`` sets (``_PRIVATE``)
    instead of a test per key.
    """
    public = row.copy()
    for key in _PRIVATE:
        public.pop(key, None)
    return public


#: every private key of the comparer's rows (``OpComparer._compare_event``, ``_manual_row``)
_PRIVATE = ("_cand_seq", "_ref_seq", "_out")
