"""Root causes: the seed's cases from evidence (seed §4 step 3), pure functions.

A = same inputs, same layout, different result; B = inputs equal in value but different in
dtype, stride or contiguity (plumbing); C = op present on one side only.
"""

from __future__ import annotations

from collections.abc import Sequence

from parity_tracker.errors import InputError

CASE_A, CASE_B, CASE_C = "A", "B", "C"


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
