r"""Compare two op recordings frame by frame: rows of the ops table (issue 5; seed §4 step 2).

:class:`OpComparer` consumes closed :class:`~parity_tracker.capture.ops.OpFrame`\ s from the
recorder: reference frames are kept; each candidate frame is compared as it closes with the
reference frame of the same ``(step, module, call)`` (so the lockstep memory bound holds), then
its captures are released. Within a frame the two op sequences are aligned by LCS
(:func:`~parity_tracker.localize.align.align_ops`); aligned outputs are compared with
:func:`~parity_tracker.compare.compare_tensors`; inputs get a status
(:class:`~parity_tracker.localize.inputs.InputJudge`) and failing ops a root cause
(:func:`~parity_tracker.localize.root_cause.op_root_cause`). Rows are ordered in candidate
time; a reference-only row goes right after the candidate op matched with the last reference
op that ran before it.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from parity_tracker.capture.op_store import Held, OpStore
from parity_tracker.capture.ops import OpEvent, OpFrame, suspended
from parity_tracker.capture.tags import op_call_base, op_output_tag, op_tag
from parity_tracker.compare import Comparison, compare_tensors
from parity_tracker.compare.hashing import content_hash_in_place, storage_digest
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.localize.align import align_ops
from parity_tracker.localize.inputs import InputJudge
from parity_tracker.localize.keep import MAX_KEPT_OPS, KeptOp, keep_op
from parity_tracker.localize.root_cause import (
    CASE_A,
    CASE_B,
    LAYOUT_OPS,
    argument_differences,
    blamed_feeders,
    explain,
    op_root_cause,
)
from parity_tracker.localize.settle import settled as _settled
from parity_tracker.localize.views import view_entry
from parity_tracker.statuses import is_failing, is_passing


class OpComparer:
    """Rows of the ops table from the frames of a reference and a candidate recording.

    Args:
        mode: ``"equal"`` or ``"allclose"``.
        tolerances: per-tag tolerance table (op tags).
        store: the recorder's store (candidate captures are released once compared).
        params: per side, storage pointers of the models' parameters and buffers.
        keep_bytes: size limit of the reproducer material kept for each of the first
            ``MAX_KEPT_OPS`` root causes present on both sides (``localize.keep``); 0 keeps none.
    """

    def __init__(
        self,
        mode: str,
        tolerances: Tolerances,
        store: OpStore,
        params: list[set[int]],
        keep_bytes: int = 0,
    ):
        self.mode, self.tolerances, self._store = mode, tolerances, store
        self.keep_bytes = keep_bytes
        self.kept: list[KeptOp] = []
        self.unkept: list[str] = []  # root-cause tags whose material did not fit
        self._reference: dict[tuple[int, str, int], OpFrame] = {}
        self._ref_events: dict[int, OpEvent] = {}
        self._manual_ref: dict[str, list[OpEvent]] = {}
        self._manual_frames: dict[int, OpFrame] = {}
        self._manual_cand: dict[str, int] = {}
        self._visited: set[tuple[int, str, int]] = set()
        # candidate (seq, out) -> (status, reference seq, reference out)
        self._cand_status: dict[tuple[int, int], tuple[str, int | None, int | None]] = {}
        self._ref_status: dict[tuple[int, int], str] = {}  # reference (seq, out) -> status
        self._matched: list[tuple[int, int]] = []  # (reference seq, candidate seq) pairs
        # (side, seq) of an op run on one side only -> (op, call base, status, inputs status)
        self._one_sided: dict[tuple[int, int], tuple[str, str, str, str]] = {}
        self._inputs = InputJudge(
            mode, tolerances, params, self._ref_events, self._cand_status, self._ref_status,
            self._one_sided,
        )  # fmt: skip
        self.rows: list[dict[str, Any]] = []
        self._finalized = False
        # candidate copy-only events by seq, tensors left out (view chains, localize.views)
        self._cand_events: dict[int, OpEvent] = {}
        # failing rows of ops both sides ran with failing inputs: (row, failing inputs)
        self._pending_views: list[tuple[dict[str, Any], list[tuple[int, Any, Any]]]] = []

    def clear(self) -> None:
        """Drop the reference frames (their captures are released by the store)."""
        self._reference.clear()
        self._ref_events.clear()

    def close_frame(self, side: int, frame: OpFrame) -> None:
        """Take a closed frame: keep a reference frame; compare and release a candidate one."""
        if side == 0:
            self._reference[frame.key] = frame
            for ev in frame.events:
                self._ref_events[ev.seq] = ev
                if ev.tag is not None:
                    self._manual_ref.setdefault(ev.tag, []).append(ev)
                    self._manual_frames[ev.seq] = frame
            return
        self._visited.add(frame.key)
        for ev in frame.events:  # copy-only ops, tensors left out: for view chains (views.py)
            if ev.op in LAYOUT_OPS:
                inputs = [dataclasses.replace(d, held=None) for d in ev.inputs]
                self._cand_events[ev.seq] = OpEvent(ev.seq, ev.op, ev.k, [], inputs)
        ref = self._reference.get(frame.key)
        self._compare_frame(ref.events if ref else [], frame)
        for ev in frame.events:
            for _i, h, _off in ev.outs:
                self._store.release(h)
            for d in ev.inputs:
                if d.held is not None:
                    self._store.release(d.held)

    def finalize(self) -> None:
        """Compare the reference frames never visited by the candidate; order the rows."""
        if self._finalized:
            return
        self._finalized = True
        for key, frame in self._reference.items():
            if key not in self._visited:
                self._compare_frame(frame.events, OpFrame(*key))
        for tag, refs in self._manual_ref.items():
            for ev in refs[self._manual_cand.get(tag, 0) :]:
                cmp = Comparison(
                    status="missing_candidate",
                    mode=self.mode,
                    ref_shape=ev.outs[0][1].size,
                    message=f"no candidate registration #{ev.k} of {tag!r}",
                )
                frame = self._manual_frames[ev.seq]
                self.rows.append(_manual_row(frame, ev, cmp, None, ev.seq))
        self._resolve_views()
        self.rows.sort(key=self._order_key())
        for i, r in enumerate(self.rows):
            r["exec_order"] = i

    def _resolve_views(self) -> None:
        """Name as root causes (case B) the failing ops whose difference enters through a view.

        Run once every frame is compared, so producers in enclosing module calls (closed after
        the op's own call) have their statuses: a failing input that reads an equal producer
        output on both sides through different view chains (``localize.views.view_entry``).
        """
        for row, failing in self._pending_views:
            views = [
                e
                for p, rd, cd in failing
                if (e := view_entry(p, rd, cd, self._ref_events, self._cand_events,
                                    self._cand_status, is_passing)) is not None
            ]  # fmt: skip
            if views:
                why = explain(CASE_B, [], [], views=views)
                row.update(root_cause=True, cause=CASE_B, message=f"{why}; {row['message'] or ''}")
        self._pending_views.clear()

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

    def _compare_frame(self, ref_events: list[OpEvent], frame: OpFrame) -> None:
        cand_events = frame.events
        ref_ops = [e for e in ref_events if e.tag is None]
        cand_ops = [e for e in cand_events if e.tag is None]
        pairs = align_ops([_align_key(e) for e in ref_ops], [_align_key(e) for e in cand_ops])
        for i, j in pairs:
            r = ref_ops[i] if i is not None else None
            c = cand_ops[j] if j is not None else None
            self._compare_event(frame, r, c)
        self._compare_manual(frame, [e for e in cand_events if e.tag is not None])

    def _compare_event(self, frame: OpFrame, r: OpEvent | None, c: OpEvent | None) -> None:
        ev = c if c is not None else r
        assert ev is not None
        present = (
            "both" if r is not None and c is not None else "reference" if c is None else "candidate"
        )
        base = op_call_base(frame.module, frame.call, ev.op, ev.k)
        results = self._compare_outputs(base, r, c)
        evidence = self._inputs.inputs_evidence(r, c, self._cand_events)
        inputs_status, layout = evidence.status, evidence.layout
        failing_inputs, views = evidence.failing, evidence.views
        if present != "both":  # for the ops it feeds (localize.root_cause.Feeder)
            status = "missing_candidate" if c is None else "missing_reference"
            self._one_sided[(0 if c is None else 1, ev.seq)] = (ev.op, base, status, inputs_status)
        fed = blamed_feeders(evidence.statuses, evidence.feeders)
        out_diffs = [
            f"output {i} dtype {cmp.ref_dtype} vs {cmp.cand_dtype}"
            for i, cmp in results
            if cmp.ref_dtype and cmp.cand_dtype and cmp.ref_dtype != cmp.cand_dtype
        ]
        kept = False
        for i, cmp in results:
            root, cause = op_root_cause(ev.op, present, cmp, inputs_status, layout, out_diffs,
                                        inputs_equal=evidence.equal, fed=fed)  # fmt: skip
            if views and is_failing(cmp.status) and not root:
                root, cause = True, CASE_B  # the difference enters through a view chain
            message = cmp.message
            if root:
                args = argument_differences(r.args, c.args) if r and c and cause == CASE_A else ()
                why = explain(cause, layout, out_diffs, views=views, fed=fed,
                              close_inputs=evidence.close_only, arg_diffs=args)  # fmt: skip
                message = why + (f"; {message}" if message else "")
            row = {
                "tag": op_tag(frame.module, frame.call, ev.op, ev.k, i),
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
            self.rows.append(row)
            if failing_inputs and is_failing(cmp.status) and not root:
                self._pending_views.append((row, failing_inputs))
            if root and not kept and r is not None and c is not None:
                kept = True
                self._keep(row, r, c)

    def _keep(self, row: dict[str, Any], r: OpEvent, c: OpEvent) -> None:
        """Keep the reproducer material of a root cause (the first ``MAX_KEPT_OPS``)."""
        if self.keep_bytes <= 0 or len(self.kept) + len(self.unkept) >= MAX_KEPT_OPS:
            return
        material = keep_op(row, r, c, self._inputs.rebuild_reference, self.keep_bytes)
        if material is None:
            self.unkept.append(row["tag"])
        else:
            self.kept.append(material)

    def _compare_outputs(
        self, base: str, r: OpEvent | None, c: OpEvent | None
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
            tag = op_output_tag(base, ri)
            with suspended():
                cmp = _settled(rh, ch, self.mode, self.tolerances, tag)
                if cmp is None:
                    ref_t, cand_t = rh.get(), ch.get()
                    if ref_t.device != cand_t.device:
                        ref_t = ref_t.to(cand_t.device)
                    cmp = _intact(self._compare(ref_t, cand_t, tag), rh, ch, tag)
            results.append((ri, cmp))
            self._cand_status[(c.seq, ci)] = (cmp.status, r.seq, ri)
            self._ref_status[(r.seq, ri)] = cmp.status
        self._matched.append((r.seq, c.seq))
        return results

    # -- inputs ----------------------------------------------------------------------------------

    def _compare(self, ref_t: torch.Tensor, cand_t: torch.Tensor, tag: str | None) -> Comparison:
        return compare_tensors(ref_t, cand_t, mode=self.mode, tag=tag, tolerances=self.tolerances)

    def _compare_manual(self, frame: OpFrame, cand_manual: list[OpEvent]) -> None:
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
            self.rows.append(_manual_row(frame, ev, cmp, ev.seq, None))


def _intact(cmp: Comparison, rh: Held, ch: Held, tag: str) -> Comparison:
    """``cmp``, or an ``error`` when a side's bytes are not those its op produced.

    Each CPU op output is held by reference with its content hash taken when the op ran
    (``capture.op_store.guarded``); a write that bypassed dispatch since (a ``.numpy()`` or
    DLPack view, ctypes) changed it unseen. The comparison hashed what it compared
    (``Comparison.ref_hash``/``cand_hash``, the same ``content_hash``); only when that hash is
    missing or differs (a path that hashed converted values), or the held hash is a storage
    digest (a dense non-contiguous output), is the held tensor hashed again.
    Issue 13: never report equal for contents that differ.
    """
    for side, h, hashed in (("reference", rh, cmp.ref_hash), ("candidate", ch, cmp.cand_hash)):
        held = h.digest
        if held is None or hashed == held:
            continue
        if isinstance(held, int):  # a dense non-contiguous output: hashed in storage order
            if storage_digest(h.get()) == held:
                continue
        elif content_hash_in_place(h.get()) == held:
            continue
        return Comparison(
            status="error",
            mode=cmp.mode,
            ref_shape=cmp.ref_shape,
            cand_shape=cmp.cand_shape,
            ref_dtype=cmp.ref_dtype,
            cand_dtype=cmp.cand_dtype,
            message=(
                f"{tag}: the {side}'s op output changed after the op ran (a write that "
                "bypassed dispatch: a .numpy()/DLPack view, ctypes, data_ptr()); its content "
                "hash differs from the one taken when the op ran; not compared"
            ),
        )
    return cmp


def _align_key(ev: OpEvent) -> tuple:
    return (ev.op, tuple(h.size for _i, h, _off in ev.outs))


def _manual_row(
    frame: OpFrame, ev: OpEvent, cmp: Comparison, cand_seq: int | None, ref_seq: int | None
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
