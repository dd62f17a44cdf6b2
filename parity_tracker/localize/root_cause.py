"""Root causes: the seed's cases from evidence (seed §4 step 3), pure functions.

A = bitwise-equal inputs (same dtype, shape and values, NaN matching NaN), same layout, different
result: the kernel differs; B = plumbing: inputs equal in value but different in dtype, stride or
contiguity, inputs that pass allclose without being bitwise equal (the difference is already in
them: look upstream), or inputs fed by a copy/conversion that ran on one side only (e.g. a
candidate-only ``_to_copy``); C = op present on one side only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parity_tracker.compare import Comparison
from parity_tracker.compare.verdict import first_divergence
from parity_tracker.errors import InputError
from parity_tracker.statuses import differs, is_failing

CASE_A, CASE_B, CASE_C = "A", "B", "C"

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


@dataclass(frozen=True)
class Feeder:
    """An op input whose producer ran on one side only (e.g. a candidate-only ``_to_copy``).

    Attributes:
        position: the input's position among the consuming op's tensor inputs.
        op: the one-sided producer's op name (``_to_copy``).
        tag: the producer output's tag (``model.rotary_emb@0::_to_copy#1``).
        side: ``"reference"`` or ``"candidate"``: the side it ran on.
        status: its row's status (``missing_reference`` when only the candidate ran it).
        inputs_status: its own inputs' status (``passing`` | ``failing`` | ``unknown``).
    """

    position: int
    op: str
    tag: str
    side: str
    status: str
    inputs_status: str

    def describe(self) -> str:
        """``input 0 comes from <tag>, which ran on the candidate side only (<status>)``."""
        return (
            f"input {self.position} comes from {self.tag}, which ran on the {self.side} side "
            f"only ({self.status})"
        )


def blamed_feeders(statuses: Sequence[str], feeders: Sequence[Feeder]) -> list[Feeder]:
    """The one-sided producers that explain an op's input differences (empty: none do).

    A feeder counts when it is a copy/conversion (:data:`LAYOUT_OPS`: a one-sided computing
    op is a case-C root cause of its own, and what it feeds inherits its difference), the
    input it feeds is not equal on both sides (``statuses[p]`` is not ``"equal"``) and its own
    inputs are not failing (else the difference came from further up). When some input fails,
    every failing input must be explained by such a feeder.

    Args:
        statuses: per input position: ``equal`` (bitwise), ``passing`` (allclose only),
            ``failing`` or ``unknown``.
        feeders: the inputs whose producer ran on one side only.
    """
    fed = [
        f
        for f in feeders
        if f.op in LAYOUT_OPS
        and f.position < len(statuses)
        and statuses[f.position] != "equal"
        and f.inputs_status != "failing"
    ]
    failing = {p for p, s in enumerate(statuses) if s == "failing"}
    return fed if failing <= {f.position for f in fed} else []


def classify(
    *,
    present: str,
    inputs_status: str,
    layout_diffs: Sequence[str] = (),
    output_diffs: Sequence[str] = (),
    inputs_equal: bool = False,
    fed_by: Sequence[str] = (),
) -> str | None:
    """The seed's root-cause case of one failing op, from evidence (seed §4 step 3).

    Args:
        present: ``"both"``, ``"reference"`` or ``"candidate"`` — where the op ran.
        inputs_status: ``"passing"``, ``"failing"`` or ``"unknown"`` (all tensor inputs).
        layout_diffs: dtype / stride / contiguity differences of the inputs
            (see :func:`layout_differences`).
        output_diffs: dtype or shape differences of the outputs (shape inference is plumbing).
        inputs_equal: every tensor input is bitwise equal on both sides (same dtype, shape
            and values, NaN matching NaN: the ``equal`` status). False (the default) never
            gives case A: passing allclose is not enough.
        fed_by: op names of the one-sided copies/conversions that explain the inputs'
            differences (:func:`blamed_feeders`); the caller passes them only when they do.

    Returns:
        ``"C"`` for an op present on one side only (not implemented or substituted);
        ``"B"`` for inputs fed by a copy/conversion that ran on one side only, passing inputs
        that differ in layout, a differing output dtype/shape (plumbing: shape inference, type
        conversion, memory layout), or passing inputs that are not bitwise equal (the
        difference is already in them: look upstream);
        ``"A"`` for bitwise-equal inputs with identical layout and a different result (the
        kernel computes something else); ``None`` when the inputs are not all passing and no
        one-sided producer explains them (the op is not a root cause, or the evidence is
        insufficient).

    Raises:
        InputError: ``present`` or ``inputs_status`` is not one of the allowed values.
    """
    if present not in ("both", "reference", "candidate"):
        raise InputError(f"present={present!r}: use 'both', 'reference' or 'candidate'")
    if inputs_status not in ("passing", "failing", "unknown"):
        raise InputError(f"inputs_status={inputs_status!r}: use 'passing', 'failing', 'unknown'")
    if present != "both":
        return CASE_C
    if fed_by:
        return CASE_B
    if inputs_status != "passing":
        return None
    if layout_diffs or output_diffs or not inputs_equal:
        return CASE_B
    return CASE_A


def op_root_cause(
    op: str,
    present: str,
    cmp: Comparison,
    inputs_status: str,
    layout: list[str],
    out_diffs: list[str],
    *,
    inputs_equal: bool = False,
    fed: Sequence[Feeder] = (),
) -> tuple[bool, str | None]:
    """Whether an op's failing output is a root cause, and its case (seed §4 step 3).

    A root cause is a failing op whose tensor inputs all pass (case A when they are bitwise
    equal with the same layout, else B), an op whose differing inputs all come from
    copies/conversions that ran on one side only (``fed``: case B), or an op
    present on one side only (case C) that is not a pure copy or allocation
    (:data:`LAYOUT_OPS`), not a manual registration, and has no failing input. (An op whose
    failing input reads an equal producer through another view chain is named case B later,
    once every frame is compared: ``OpComparer`` with ``localize.views``.) An op on both sides
    whose output row is ``error`` (not compared, or a held value changed after the op ran) is
    never a root cause: only :data:`~parity_tracker.statuses.VALUE_DIFFERS` shows that the
    op computed another value.

    Args:
        op: the op name (``"manual"`` for a manual registration).
        present: ``"both"``, ``"reference"`` or ``"candidate"``.
        cmp: the output's comparison.
        inputs_status: ``"passing"``, ``"failing"`` or ``"unknown"``.
        layout: the inputs' layout differences (``localize.align.layout_differences``).
        out_diffs: output dtype differences, e.g. ``"output 0 dtype float32 vs bfloat16"``.
        inputs_equal: every tensor input is bitwise equal on both sides (see :func:`classify`).
        fed: the one-sided producers explaining the inputs' differences (:func:`blamed_feeders`).

    Returns:
        ``(is_root_cause, case)`` with case ``"A"``, ``"B"``, ``"C"`` or None.
    """
    if not is_failing(cmp.status):
        return False, None
    if present != "both":
        if op in LAYOUT_OPS or op == "manual" or inputs_status == "failing":
            return False, None
        return True, classify(present=present, inputs_status=inputs_status)
    if not differs(cmp.status):  # an error row: nothing proves the op computed another value
        return False, None
    cause = classify(
        present=present,
        inputs_status=inputs_status,
        layout_diffs=layout,
        output_diffs=out_diffs,
        inputs_equal=inputs_equal,
        fed_by=[f.op for f in fed],
    )
    return cause is not None, cause


def _same_arg(a: Any, b: Any) -> bool:
    """Whether two non-tensor op arguments are the same.

    NaN equals NaN; a failing ``==`` (an unusual object) counts as different.
    """
    if a is b:
        return True
    try:
        same = a == b
        return bool(same) or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
    except Exception:
        return False


def argument_differences(ref_args: Any, cand_args: Any) -> list[str]:
    """The non-tensor arguments two sides passed differently to one op, in words.

    Args:
        ref_args: the reference call's ``(args, kwargs)`` as ``capture.ops.arg_spec`` records
            them (tensors stand as ``TensorArg`` placeholders and compare by position only),
            or None when not recorded.
        cand_args: the candidate call's, likewise.

    Returns:
        e.g. ``["approximate: (default) vs 'tanh'", "argument 2: 1 vs 2"]``; empty when the
        calls agree or either side's arguments were not recorded. A keyword given on one side
        only is shown against ``(default)``: the op's schema default applies there.
    """
    if ref_args is None or cand_args is None:
        return []
    (ra, rk), (ca, ck) = ref_args, cand_args
    out = []
    for p in range(max(len(ra), len(ca))):
        a = ra[p] if p < len(ra) else "(default)"
        b = ca[p] if p < len(ca) else "(default)"
        if not _same_arg(a, b):
            out.append(f"argument {p}: {a!r} vs {b!r}")
    for k in sorted(set(rk) | set(ck), key=str):
        a, b = rk.get(k, "(default)"), ck.get(k, "(default)")
        if not _same_arg(a, b):
            out.append(f"{k}: {a if k not in rk else repr(a)} vs {b if k not in ck else repr(b)}")
    return out


def case_prefix(cause: str | None) -> str:
    """``root cause (case X): ``: how a root cause's message starts (:func:`explain`)."""
    return f"root cause (case {cause}): "


def explain(
    cause: str | None,
    layout: list[str],
    out_diffs: list[str],
    *,
    views: Sequence[str] = (),
    fed: Sequence[Feeder] = (),
    close_inputs: Sequence[int] = (),
    arg_diffs: Sequence[str] = (),
) -> str:
    """The message prefix naming a root cause's case (empty when ``cause`` is None).

    Args:
        cause: ``"A"``, ``"B"``, ``"C"`` or None.
        layout: the inputs' layout differences.
        out_diffs: the outputs' dtype differences.
        views: view-chain entries (``localize.views``) when the difference enters through one.
        fed: the one-sided producers feeding the op (named first: they explain the rest).
        close_inputs: positions of inputs that pass allclose but are not bitwise equal.
        arg_diffs: the non-tensor arguments the two sides passed differently
            (:func:`argument_differences`): with equal inputs they, not the kernel, explain
            case A.
    """
    head = case_prefix(cause)
    if fed:
        return (
            head
            + "a copy/conversion that ran on one side only feeds this op (its inputs differ "
            + "through it; "
            + "the kernel is not shown to differ): "
            + "; ".join(f.describe() for f in fed)
        )
    if cause == CASE_B and views:
        return head + "the difference enters through a view/layout change: " + "; ".join(views)
    if cause == CASE_A and arg_diffs:
        return head + (
            "inputs bitwise equal with the same layout, but the candidate called the op with "
            "other arguments: " + "; ".join(arg_diffs)
        )
    if cause == CASE_A:
        return head + (
            "inputs bitwise equal with the same layout, the op computes another result "
            "(the kernel differs)"
        )
    if cause == CASE_B and (layout or out_diffs):
        return head + "inputs equal in value but " + ", ".join(layout + out_diffs)
    if cause == CASE_B:
        which = ", ".join(str(p) for p in close_inputs) or "?"
        return head + (
            f"input(s) {which} pass allclose but are not bitwise equal: the difference is "
            "already in the inputs (look upstream), not proven to be the kernel's"
        )
    if cause == CASE_C:
        return head + "op present on one side only (not implemented or substituted)"
    return ""


def fallback_root_causes(
    op_rows: Sequence[Mapping[str, Any]], module_rows: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The place to start when op capture proved no root cause in a failing run (issue 13).

    A failing run with op capture never reports an empty root-cause list: when no op qualifies
    (:func:`op_root_cause`, view entries), the first row below is named instead, with
    ``cause`` None and a message saying that the evidence is insufficient:
    the first divergent op (``compare.verdict.first_divergence``), else the first failing op
    row, else the first divergent modules row, else the first failing modules row.

    Args:
        op_rows: the ops table's rows.
        module_rows: the modules table's rows.

    Returns:
        ``[row]`` (a copy, ``root_cause`` True, ``cause`` None), or ``[]`` when no row fails.
    """
    for rows, what in ((op_rows, "op"), (module_rows, "tensor")):
        row = first_divergence(rows) or next((r for r in rows if is_failing(r["status"])), None)
        if row is not None:
            note = (
                "no root cause proven (no failing op has all inputs passing, a view/layout "
                f"entry, or runs on one side only); the first failing {what} is named instead"
            )
            msg = row.get("message")
            return [{**row, "root_cause": True, "cause": None,
                     "message": note + (f"; {msg}" if msg else "")}]  # fmt: skip
    return []
