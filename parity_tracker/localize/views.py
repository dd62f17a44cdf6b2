"""View chains: how an op's input was derived from the op output that produced its data.

An op input is a view (shape, stride, storage offset) of a producer's output, possibly through
copy-only ops (``root_cause.LAYOUT_OPS``: ``clone``, ``_to_copy``, ``_unsafe_view`` ...). When
both sides' inputs trace back to the same aligned producer output, that output is equal on
both sides, and yet the inputs differ in value, the difference entered through the view chain
(e.g. attention heads merged by ``reshape`` without the ``transpose``): the seed's case B,
named by :func:`view_entry` with both chains in the message (issue 13, kind 9).
:func:`external_view_entry` does the same for data made outside the recorded ops (a model
input, a weight): the two whole storages must be equal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from parity_tracker.localize.root_cause import LAYOUT_OPS

#: Most copy-only hops followed back from an input (a guard against cycles in bad records).
MAX_HOPS = 16


def describe_view(d: Any) -> str:
    """``view(2, 3, 8) stride (24, 8, 1)`` (plus `` offset N`` when the offset is not 0)."""
    shape = ", ".join(map(str, d.shape))
    text = f"view({shape}) stride {tuple(d.stride)}"
    return text + (f" offset {d.rel_off}" if d.rel_off else "")


def trace(d: Any, events: Mapping[int, Any]) -> tuple[tuple[int, int] | None, list[str]]:
    """``(producer, chain)`` of :func:`trace_to` (its last ``OpInput`` left out)."""
    src, hops, _last = trace_to(d, events)
    return src, hops


def trace_to(d: Any, events: Mapping[int, Any]) -> tuple[tuple[int, int] | None, list[str], Any]:
    """The producer output an input derives from, through copy-only ops, and the chain.

    Args:
        d: an ``OpInput`` (``src``, ``shape``, ``stride``, ``rel_off``).
        events: that side's recorded events by sequence number (``op``, ``k``, ``inputs``);
            events that are not copy-only end the chain.

    Returns:
        ``(producer (seq, output index) or None for a tensor made outside the recorded ops,
        chain, the chain's first OpInput)`` where chain lists, from the producer on, each view
        and copy op, e.g.
        ``["view(2, 3, 2, 4) stride (24, 4, 12, 1)", "clone#3", "view(6, 8) stride (8, 1)"]``.
    """
    hops = [describe_view(d)]
    src = d.src
    for _ in range(MAX_HOPS):
        ev = events.get(src[0]) if src is not None else None
        if ev is None or ev.op not in LAYOUT_OPS or len(ev.inputs) != 1:
            break
        hops.append(f"{ev.op}#{ev.k}")
        d = ev.inputs[0]
        hops.append(describe_view(d))
        src = d.src
    return src, hops[::-1], d


def view_entry(
    p: int,
    rd: Any,
    cd: Any,
    ref_events: Mapping[int, Any],
    cand_events: Mapping[int, Any],
    cand_status: Mapping[tuple[int, int], tuple[str, int | None, int | None]],
    is_passing: Any,
) -> str | None:
    """Why input ``p`` differs although both sides read one equal producer output, or None.

    Args:
        p: the input's position.
        rd: the reference's ``OpInput``.
        cd: the candidate's ``OpInput``.
        ref_events: the reference's events by sequence number.
        cand_events: the candidate's events by sequence number (copy-only ones at least).
        cand_status: candidate ``(seq, out)`` -> ``(status, reference seq, reference out)``.
        is_passing: the status predicate (``statuses.is_passing``).

    Returns:
        ``"input 0 reads bmm#1 output 0, equal on both sides, through a different view chain:
        reference ... ; candidate ..."``, or None when the two inputs do not trace back to the
        same aligned, passing producer output (then the difference is not a layout one).
    """
    rsrc, rchain = trace(rd, ref_events)
    csrc, cchain = trace(cd, cand_events)
    if rsrc is None or csrc is None or rchain == cchain:
        return None
    known = cand_status.get(csrc)
    if known is None or not is_passing(known[0]) or (known[1], known[2]) != rsrc:
        return None
    prod = ref_events.get(rsrc[0])
    name = f"{prod.op}#{prod.k}" if prod is not None else f"op {rsrc[0]}"
    return (
        f"input {p} reads {name} output {rsrc[1]}, equal on both sides, through a different "
        f"view chain: reference {' -> '.join(rchain)}; candidate {' -> '.join(cchain)}"
    )


def external_view_entry(
    p: int, rd: Any, cd: Any, ref_events: Mapping[int, Any], cand_events: Mapping[int, Any],
    same: Callable[[torch.Tensor, torch.Tensor], bool],
) -> str | None:  # fmt: skip
    """Like :func:`view_entry`, for inputs derived from tensors made outside the recorded ops.

    Both chains must end at a held external tensor (a model input, a parameter or buffer):
    when the whole storages of the two are equal (``same``, the session's pass/fail rule, on
    every element of each storage), the data is the same and the difference entered through
    the view chain. Checked while the op's inputs are still held.

    Args:
        p: the input's position.
        rd: the reference's ``OpInput``.
        cd: the candidate's ``OpInput`` (with its held tensor).
        ref_events: the reference's events by sequence number.
        cand_events: the candidate's events by sequence number (copy-only ones at least).
        same: ``same(reference, candidate) -> bool`` for two 1-D tensors.

    Returns:
        The message, or None (not both external, a storage not held, storages that differ).
    """
    rsrc, rchain, rlast = trace_to(rd, ref_events)
    csrc, cchain, clast = trace_to(cd, cand_events)
    if rsrc is not None or csrc is not None or rchain == cchain:
        return None
    if rlast.held is None or clast.held is None:
        return None
    ref_all, cand_all = _whole_storage(rlast.held.get()), _whole_storage(clast.held.get())
    if ref_all is None or cand_all is None or ref_all.shape != cand_all.shape:
        return None
    if not same(ref_all, cand_all):
        return None
    return (
        f"input {p} reads the same data (an equal tensor of {ref_all.numel()} elements made "
        f"outside the recorded ops: a model input or weight) through a different view chain: "
        f"reference {' -> '.join(rchain)}; candidate {' -> '.join(cchain)}"
    )


def _whole_storage(t: torch.Tensor) -> torch.Tensor | None:
    """Every element of ``t``'s storage as a 1-D tensor of its dtype (None when not plain)."""
    if t.is_quantized or t.layout != torch.strided or type(t) is not torch.Tensor:
        return None
    n = t.untyped_storage().nbytes() // t.element_size()
    return t.new_empty(0).set_(t.untyped_storage(), 0, (n,), (1,))
