"""Input statuses of recorded ops: whether an op's inputs agree on both sides (issue 5 §3).

Each tensor input was traced by the recorder to the op output that produced its storage. An
input whose producers on both sides are an aligned pair already compared, seen through the
same view (shape, stride, offset, dtype), takes that pair's status; inputs made outside the
recorded ops on both sides (model inputs, parameters, buffers) are compared directly
(parameter/buffer pairs cached by storage and version counter); any other input is compared
by value: the reference's input is rebuilt from its producer's capture, the candidate's is the
live input. Value comparisons use :func:`parity_tracker.compare.passes` (the verdict of
``compare_tensors`` without its metrics). ``passing`` = all inputs pass, ``failing`` = one
fails, else ``unknown``. Each input's own status refines ``passing`` into ``equal`` (bitwise
equal: same dtype, shape and values, NaN matching NaN, the ``equal`` mode's rule) and
``passing`` (allclose only): case A needs every input ``equal``
(``localize.root_cause.classify``). An input whose producer ran on one side only (its row
``missing_*``) is named as a :class:`~parity_tracker.localize.root_cause.Feeder`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from parity_tracker.capture.op_store import _ptr
from parity_tracker.capture.ops import OpEvent, OpInput, suspended
from parity_tracker.capture.store import span_elements
from parity_tracker.compare import passes
from parity_tracker.compare.tolerances import Tolerances
from parity_tracker.localize.align import layout_differences
from parity_tracker.localize.root_cause import Feeder
from parity_tracker.localize.settle import SAME_BYTES_MIN, same_bytes
from parity_tracker.localize.views import external_view_entry
from parity_tracker.statuses import is_neutral, is_passing


@dataclass
class InputEvidence:
    """What an op's inputs say about its root cause (:meth:`InputJudge.inputs_evidence`).

    Attributes:
        status: ``passing`` | ``failing`` | ``unknown`` (all tensor inputs together).
        layout: dtype / stride / contiguity differences of the inputs.
        failing: the failing inputs ``(position, reference input, candidate input)``,
            tensors left out.
        views: view-chain entries explaining failing inputs (``localize.views``).
        statuses: per input position: ``equal`` (bitwise), ``passing`` (allclose only),
            ``failing`` or ``unknown``.
        feeders: inputs whose producer ran on one side only.
    """

    status: str
    layout: list[str] = field(default_factory=list)
    failing: list[tuple] = field(default_factory=list)
    views: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    feeders: list[Feeder] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        """Every tensor input is bitwise equal on both sides (case A's requirement)."""
        return all(s == "equal" for s in self.statuses)

    @property
    def close_only(self) -> list[int]:
        """Positions of inputs that pass allclose without being bitwise equal."""
        return [p for p, s in enumerate(self.statuses) if s == "passing"]


class InputJudge:
    """Statuses of op inputs from what a comparison of the two recordings learned so far.

    Args:
        mode: ``"equal"`` or ``"allclose"``.
        tolerances: the session's tolerance table.
        params: per side, storage pointers of the models' parameters and buffers.
        ref_events: reference events by sequence number.
        cand_status: candidate ``(seq, out)`` -> ``(status, reference seq, reference out)``.
        ref_status: reference ``(seq, out)`` -> status.
        one_sided: ``(side, seq)`` of an op that ran on that side only ->
            ``(op, frame's op call base, status, its inputs' status)``.
    """

    def __init__(
        self,
        mode: str,
        tolerances: Tolerances,
        params: list[set[int]],
        ref_events: dict[int, OpEvent],
        cand_status: dict[tuple[int, int], tuple[str, int | None, int | None]],
        ref_status: dict[tuple[int, int], str],
        one_sided: dict[tuple[int, int], tuple[str, str, str, str]] | None = None,
    ):
        self.mode, self.tolerances, self.params = mode, tolerances, params
        self.one_sided = one_sided if one_sided is not None else {}
        self.ref_events, self.cand_status, self.ref_status = ref_events, cand_status, ref_status
        self._ext_cache: dict[tuple, str] = {}

    def inputs_status(self, r: OpEvent | None, c: OpEvent | None) -> tuple[str, list[str]]:
        """``(inputs status, layout differences)`` of an aligned pair or a one-sided op."""
        ev = self.inputs_evidence(r, c)
        return ev.status, ev.layout

    def inputs_evidence(
        self, r: OpEvent | None, c: OpEvent | None, cand_events=None
    ) -> InputEvidence:
        """The :class:`InputEvidence` of an aligned pair or a one-sided op.

        The inputs are compared by their actual values, as the op saw them (views included).
        The failing inputs are ``(position, reference input, candidate input)`` without their
        tensors: :func:`parity_tracker.localize.views.view_entry` later checks (once every
        frame is compared) whether one reads an equal producer output through another view.
        The view entries are found now, while the inputs are held: failing inputs that read
        equal data made outside the recorded ops through another view chain
        (:func:`parity_tracker.localize.views.external_view_entry`; ``cand_events``: the
        candidate's copy-only events so far).
        """
        if r is None or c is None:
            ev = c if c is not None else r
            assert ev is not None
            return InputEvidence(self._one_sided_inputs(ev, side=1 if c is not None else 0))
        layout = (
            []  # issue 19: the same dtypes, strides and contiguity (no difference to name)
            if _same_layouts(r.inputs, c.inputs)
            else layout_differences([d.layout() for d in r.inputs], [d.layout() for d in c.inputs])
        )
        statuses, failing, views, feeders = [], [], [], []
        for p in range(max(len(r.inputs), len(c.inputs))):
            if p >= len(r.inputs) or p >= len(c.inputs):
                statuses.append("unknown")
                continue
            rd, cd = r.inputs[p], c.inputs[p]
            statuses.append(self._input_status(rd, cd))
            feeders += self._feeders(p, rd, cd)
            if statuses[-1] != "failing":
                continue
            failing.append((p, _bare(rd), _bare(cd)))
            with suspended():
                entry = external_view_entry(
                    p, rd, cd, self.ref_events, cand_events or {}, self._same
                )
            if entry is not None:
                views.append(entry)
        return InputEvidence(_combine(statuses), layout, failing, views, statuses, feeders)

    def _feeders(self, p: int, rd: OpInput, cd: OpInput) -> list[Feeder]:
        """Input ``p``'s producers that ran on one side only (none, one or two)."""
        out = []
        for side, d, name in ((0, rd, "reference"), (1, cd, "candidate")):
            known = self.one_sided.get((side, d.src[0])) if d.src is not None else None
            if known is not None:
                op, base, status, ins = known
                tag = base if d.src[1] == 0 else f"{base}:{d.src[1]}"
                out.append(Feeder(p, op, tag, name, status, ins))
        return out

    def _same(self, ref_t: torch.Tensor, cand_t: torch.Tensor) -> bool:
        """Two whole storages pass by the session's rule (:func:`compare.passes`)."""
        if ref_t.device != cand_t.device:
            ref_t = ref_t.to(cand_t.device)
        return passes(ref_t, cand_t, mode=self.mode, tolerances=self.tolerances)

    def _one_sided_inputs(self, ev: OpEvent, side: int) -> str:
        """Inputs of an op that ran on one side only: its producers' statuses where known."""
        statuses = []
        for d in ev.inputs:
            if d.src is None:
                statuses.append("unknown")
            elif side == 0:
                statuses.append(_passfail(self.ref_status.get(d.src, "skipped")))
            else:
                known = self.cand_status.get(d.src)
                statuses.append("unknown" if known is None else _passfail(known[0]))
        return _combine(statuses)

    def _input_status(self, rd: OpInput, cd: OpInput) -> str:
        if rd.src is None and cd.src is None:
            return self._external_status(rd, cd)
        if rd.src is not None and cd.src is not None:
            known = self.cand_status.get(cd.src)
            same_view = (rd.shape, rd.stride, rd.rel_off, rd.dtype) == (
                cd.shape,
                cd.stride,
                cd.rel_off,
                cd.dtype,
            )
            if known is not None and (known[1], known[2]) == rd.src and same_view:
                return _passfail(known[0])
        return self._value_status(rd, cd)

    def _external_status(self, rd: OpInput, cd: OpInput) -> str:
        if rd.held is None or cd.held is None:
            return "unknown"
        ref_t, cand_t = rd.held.get(), cd.held.get()
        ref_p, cand_p = _ptr(ref_t), _ptr(cand_t)
        if ref_p not in self.params[0] or cand_p not in self.params[1]:
            return self._value_compare(ref_t, cand_t)
        # Both are parameters/buffers of the models (alive all session, so their storage
        # pointers are not reused); the version counters catch in-place updates.
        if rd.version is None or cd.version is None:  # inference tensors: nothing to key on
            return self._value_compare(ref_t, cand_t)
        key = (
            (ref_p, ref_t.storage_offset(), rd.shape, rd.stride, rd.version),
            (cand_p, cand_t.storage_offset(), cd.shape, cd.stride, cd.version),
        )
        status = self._ext_cache.get(key)
        if status is None:
            status = self._value_compare(ref_t, cand_t)
            self._ext_cache[key] = status
        return status

    def _value_status(self, rd: OpInput, cd: OpInput) -> str:
        ref_t = self.rebuild_reference(rd)
        cand_t = cd.held.get() if cd.held is not None else None
        if ref_t is None or cand_t is None:
            return "unknown"
        return self._value_compare(ref_t, cand_t)

    def _value_compare(self, ref_t: torch.Tensor, cand_t: torch.Tensor) -> str:
        """Pass/fail of two op inputs by value.

        A dtype difference alone is layout (case B) evidence, not a value difference, so both
        are first cast to their promoted dtype. Byte-identical views of one layout are
        ``equal`` without a comparison (``localize.settle.same_bytes``: issue 19).
        """
        if ref_t.numel() >= SAME_BYTES_MIN and same_bytes(ref_t, cand_t):
            return "equal"
        with suspended():
            if is_traceable_wrapper_subclass(ref_t) or is_traceable_wrapper_subclass(cand_t):
                ref_t, cand_t = _dense(ref_t), _dense(cand_t)  # DTensor: its full tensor
                if ref_t is None or cand_t is None:
                    return "unknown"
            if ref_t.device != cand_t.device:
                ref_t = ref_t.to(cand_t.device)
            return self._verdict(ref_t, cand_t)

    def _verdict(self, ref_t: torch.Tensor, cand_t: torch.Tensor) -> str:
        """``equal`` / ``passing`` / ``failing``: :func:`compare.passes`, no metrics.

        ``equal``: the values are equal (``passes`` in ``equal`` mode: same shape, equal
        values, NaN matching NaN); ``passing``: not equal, but passing the session's mode
        (allclose). A dtype difference alone is not a value difference here
        (``ignore_dtype``): it is layout evidence.
        """
        if passes(ref_t, cand_t, mode="equal", ignore_dtype=True):
            return "equal"
        if self.mode == "equal":
            return "failing"
        ok = passes(ref_t, cand_t, mode=self.mode, tolerances=self.tolerances, ignore_dtype=True)
        return "passing" if ok else "failing"

    def rebuild_reference(self, rd: OpInput) -> torch.Tensor | None:
        """The reference op's input as it saw it, from its producer's capture (None: gone)."""
        if rd.src is None:
            return rd.held.get() if rd.held is not None else None
        ev = self.ref_events.get(rd.src[0])
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
            need = span_elements(rd.shape, rd.stride)
            if offset < 0 or (
                0 not in rd.shape
                and offset + need > base.untyped_storage().nbytes() // base.element_size()
            ):
                return None
            return torch.as_strided(base, rd.shape, rd.stride, offset)
        return None


def _same_layouts(ref: list[OpInput], cand: list[OpInput]) -> bool:
    """Whether :func:`layout_differences` has nothing to say (issue 19: no dicts built).

    True when both sides have as many inputs, each with the same dtype, stride and contiguity
    (the three facts of ``OpInput.layout``).
    """
    return len(ref) == len(cand) and all(
        r.dtype == c.dtype and r.stride == c.stride and r.contiguous == c.contiguous
        for r, c in zip(ref, cand, strict=True)
    )


def _bare(d: OpInput) -> OpInput:
    """``d`` without its held tensor (provenance and layout only)."""
    return dataclasses.replace(d, held=None)


def _dense(t: torch.Tensor) -> torch.Tensor | None:
    """A plain tensor for ``t`` (``compare.convert.to_tensor``: DTensor → ``full_tensor()``)."""
    if not is_traceable_wrapper_subclass(t):
        return t
    from parity_tracker.compare.convert import to_tensor

    return to_tensor(t).tensor


def _passfail(status: str) -> str:
    """An input's status from its producer's row status (``equal`` kept: bitwise equal)."""
    if status == "equal":
        return "equal"
    if is_passing(status):
        return "passing"
    if is_neutral(status):
        return "unknown"
    return "failing"


def _combine(statuses: list[str]) -> str:
    """All inputs together: ``failing`` if one fails, ``passing`` if all pass, else ``unknown``."""
    if "failing" in statuses:
        return "failing"
    if all(s in ("equal", "passing") for s in statuses):
        return "passing"
    return "unknown"
