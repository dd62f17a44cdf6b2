"""What a reproducer of a root-cause op needs, kept while both recordings are alive (issue 20).

When :class:`~parity_tracker.localize.op_compare.OpComparer` finds a root cause present on both
sides, :func:`keep_op` copies (to CPU) the op's tensor inputs as each side saw them (the
reference's rebuilt from its producer's capture, the candidate's live input), both sides'
outputs, the call's non-tensor arguments (:func:`parity_tracker.capture.ops.arg_spec`) and the
input layouts. Writing them as files is ``parity_tracker.files.repro_data``'s job.

Size limit: when the copies would exceed ``limit_bytes``, every tensor whose leading dimension
equals the worst output's is cut to the smallest run of leading rows around the worst element
(:func:`leading_slice`) that fits, and the slice is noted; this keeps the reproducer valid for
ops whose rows are independent (elementwise, linear/matmul over a batch, norms over the last
dimension). Nothing is kept when even one row does not fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from parity_tracker.capture.ops import OpEvent, OpInput, suspended

#: Default size limit of one reproducer's tensors, in bytes: 64 MiB (issue 20 §5).
DEFAULT_REPRO_BYTES = 64 << 20

#: How many root causes a run keeps reproducer material for (the first ones in candidate time).
MAX_KEPT_OPS = 4


@dataclass
class KeptOp:
    """The material of one op reproducer (CPU tensors, original dtypes and strides kept).

    Attributes:
        tag: the op output tag (``module@call::op#k``).
        op: the aten op name (overload packet), e.g. ``gelu``.
        overload: the overload name, e.g. ``default``.
        args: ``(args, kwargs)`` with tensors as ``TensorArg`` (reference call; the candidate's
            non-tensor arguments are in ``cand_args``).
        ref_inputs / cand_inputs: tensor inputs as each side saw them (None: unavailable).
        ref_outputs / cand_outputs: ``(output index, tensor)`` pairs.
        row: the ops-table row of the failing output (status, cause, message, mode, rtol, atol).
        slice: ``{"dim": 0, "start": a, "stop": b, "of": n}`` when cut to fit, else None.
    """

    tag: str
    op: str
    overload: str
    args: Any
    cand_args: Any
    ref_inputs: list[torch.Tensor | None]
    cand_inputs: list[torch.Tensor | None]
    ref_outputs: list[tuple[int, torch.Tensor]]
    cand_outputs: list[tuple[int, torch.Tensor]]
    row: dict[str, Any] = field(default_factory=dict)
    slice: dict[str, int] | None = None

    def nbytes(self) -> int:
        """Bytes of every tensor held (each counted once per appearance)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor held."""
        ins = [t for t in self.ref_inputs + self.cand_inputs if t is not None]
        return ins + [t for _, t in self.ref_outputs + self.cand_outputs]


def _copy(t: torch.Tensor | None) -> torch.Tensor | None:
    """A CPU copy keeping dtype and strides (``clone`` preserves a dense tensor's strides)."""
    if t is None:
        return None
    return t.detach().to("cpu").clone() if t.device.type != "cpu" else t.detach().clone()


def leading_slice(n: int, index: int, rows: int) -> tuple[int, int]:
    """The ``[start, stop)`` run of ``rows`` leading rows (of ``n``) around row ``index``."""
    rows = max(1, min(rows, n))
    start = min(max(0, index - rows // 2), n - rows)
    return start, start + rows


def _cut(t: torch.Tensor | None, n: int, start: int, stop: int) -> torch.Tensor | None:
    if t is None or t.dim() == 0 or t.shape[0] != n:
        return t
    return t.narrow(0, start, stop - start)


def keep_op(
    row: dict[str, Any],
    r: OpEvent,
    c: OpEvent,
    rebuild: Callable[[OpInput], torch.Tensor | None],
    limit_bytes: int,
) -> KeptOp | None:
    """The reproducer material of an aligned root-cause pair, or None when it cannot fit.

    Args:
        row: the failing output's ops-table row (``max_abs_diff_index`` locates the slice).
        r: the reference event (captures still alive).
        c: the aligned candidate event (captures still alive).
        rebuild: the reference input as the reference op saw it (``InputJudge``).
        limit_bytes: the size limit (see the module docstring).
    """
    if r.args is None or c.args is None:
        return None
    with suspended():
        views = (
            [rebuild(d) for d in r.inputs],
            [d.held.get() if d.held is not None else None for d in c.inputs],
            [(i, h.get()) for i, h, _ in r.outs],
            [(i, h.get()) for i, h, _ in c.outs],
        )
        total = sum(
            t.numel() * t.element_size()
            for t in [*views[0], *views[1], *(x for _, x in views[2] + views[3])]
            if t is not None
        )
        cut = None if total <= limit_bytes else _fit(row, views, total, limit_bytes)
        if total > limit_bytes and cut is None:
            return None
        ri, ci, ro, co = views
        if cut is not None:
            n, a, b = cut
            ri, ci = [_cut(t, n, a, b) for t in ri], [_cut(t, n, a, b) for t in ci]
            ro = [(i, _cut(t, n, a, b)) for i, t in ro]
            co = [(i, _cut(t, n, a, b)) for i, t in co]
        kept = KeptOp(
            tag=row["tag"], op=r.op, overload=r.overload, args=r.args, cand_args=c.args,
            ref_inputs=[_copy(t) for t in ri], cand_inputs=[_copy(t) for t in ci],
            ref_outputs=[(i, _copy(t)) for i, t in ro], cand_outputs=[(i, _copy(t)) for i, t in co],
            row={k: v for k, v in row.items() if not k.startswith("_")},
        )  # fmt: skip
    if cut is not None:
        kept.slice = {"dim": 0, "start": cut[1], "stop": cut[2], "of": cut[0]}
    return kept


def _fit(
    row: dict[str, Any], views: Sequence[Any], total: int, limit: int
) -> tuple[int, int, int] | None:
    """``(n, start, stop)``: leading rows around the worst element that fit ``limit``."""
    outs = [t for _, t in views[2]]
    if not outs or outs[0].dim() == 0 or outs[0].shape[0] < 2:
        return None
    n = outs[0].shape[0]
    idx = row.get("max_abs_diff_index")
    worst = int(idx[0]) if idx else 0
    every = [*views[0], *views[1], *outs, *(t for _, t in views[3])]
    sliced = sum(
        t.numel() * t.element_size() for t in every if t is not None and t.dim() and t.shape[0] == n
    )
    fixed = total - sliced
    per_row = sliced / n
    rows = int((limit - fixed) // per_row) if per_row else n
    if rows < 1:
        return None
    start, stop = leading_slice(n, worst, rows)
    return n, start, stop
