"""Root causes: the seed's cases from evidence (seed §4 step 3), pure functions.

A = same inputs, same layout, different result; B = inputs equal in value but different in
dtype, stride or contiguity (plumbing); C = op present on one side only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from parity_tracker.compare import Comparison
from parity_tracker.compare.verdict import first_divergence
from parity_tracker.errors import InputError
from parity_tracker.statuses import is_failing

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


def classify(
    *,
    present: str,
    inputs_status: str,
    layout_diffs: Sequence[str] = (),
    output_diffs: Sequence[str] = (),
) -> str | None:
    """The seed's root-cause case of one failing op, from evidence (seed §4 step 3).

    Args:
        present: ``"both"``, ``"reference"`` or ``"candidate"`` — where the op ran.
        inputs_status: ``"passing"``, ``"failing"`` or ``"unknown"`` (all tensor inputs).
        layout_diffs: dtype / stride / contiguity differences of the inputs
            (see :func:`layout_differences`).
        output_diffs: dtype or shape differences of the outputs (shape inference is plumbing).

    Returns:
        ``"C"`` for an op present on one side only (not implemented or substituted);
        ``"B"`` for passing inputs that differ in layout or a differing output dtype/shape
        (plumbing: shape inference, type conversion, memory layout);
        ``"A"`` for passing inputs with identical layout and a different result (the op
        computes something else); ``None`` when the inputs are not all passing (the op is not a
        root cause, or the evidence is insufficient).

    Raises:
        InputError: ``present`` or ``inputs_status`` is not one of the allowed values.
    """
    if present not in ("both", "reference", "candidate"):
        raise InputError(f"present={present!r}: use 'both', 'reference' or 'candidate'")
    if inputs_status not in ("passing", "failing", "unknown"):
        raise InputError(f"inputs_status={inputs_status!r}: use 'passing', 'failing', 'unknown'")
    if present != "both":
        return CASE_C
    if inputs_status != "passing":
        return None
    if layout_diffs or output_diffs:
        return CASE_B
    return CASE_A


def op_root_cause(
    op: str,
    present: str,
    cmp: Comparison,
    inputs_status: str,
    layout: list[str],
    out_diffs: list[str],
) -> tuple[bool, str | None]:
    """Whether an op's failing output is a root cause, and its case (seed §4 step 3).

    A root cause is a failing op whose tensor inputs all pass (case A, or B when layouts or
    output dtypes differ), or an op present on one side only (case C) that is not a pure copy
    or allocation (:data:`LAYOUT_OPS`), not a manual registration, and has no failing input.
    (An op whose failing input reads an equal producer through another view chain is named
    case B later, once every frame is compared: ``OpComparer`` with ``localize.views``.)

    Args:
        op: the op name (``"manual"`` for a manual registration).
        present: ``"both"``, ``"reference"`` or ``"candidate"``.
        cmp: the output's comparison.
        inputs_status: ``"passing"``, ``"failing"`` or ``"unknown"``.
        layout: the inputs' layout differences (``localize.align.layout_differences``).
        out_diffs: output dtype differences, e.g. ``"output 0 dtype float32 vs bfloat16"``.

    Returns:
        ``(is_root_cause, case)`` with case ``"A"``, ``"B"``, ``"C"`` or None.
    """
    if not is_failing(cmp.status):
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


def explain(
    cause: str | None, layout: list[str], out_diffs: list[str], *, views: Sequence[str] = ()
) -> str:
    """The message prefix naming a root cause's case (empty when ``cause`` is None)."""
    if cause == "B" and views:
        return (
            "root cause (case B): the difference enters through a view/layout change: "
            + "; ".join(views)
        )
    if cause == "A":
        return (
            "root cause (case A): inputs equal with the same layout, the op computes another result"
        )
    if cause == "B":
        return "root cause (case B): inputs equal in value but " + ", ".join(layout + out_diffs)
    if cause == "C":
        return "root cause (case C): op present on one side only (not implemented or substituted)"
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
