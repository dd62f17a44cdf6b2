"""Assertions for operator tests (seed document, section 1: ``assert_tensor_equal``).

Argument order is ``reference, candidate`` (the contract's order everywhere in this package):
the PyTorch result first, the implementation under test second.
"""

from __future__ import annotations

from typing import Any

from parity_tracker.compare import Comparison, compare_tensors


def _fail(comparison: Comparison, msg: str | None) -> None:
    detail = comparison.message or comparison.status
    text = f"{comparison.status}: {detail}"
    if comparison.mismatch_count:
        text += (
            f" ({comparison.mismatch_count} of {comparison.numel} elements differ; "
            f"max abs diff {comparison.max_abs_diff}"
        )
        if comparison.max_abs_diff_index is not None:
            text += f" at index {tuple(comparison.max_abs_diff_index)}"
        text += ")"
    raise AssertionError(f"{msg}: {text}" if msg else text)


def assert_tensor_equal(reference: Any, candidate: Any, msg: str | None = None) -> Comparison:
    """Assert ``candidate`` equals ``reference`` exactly (``torch.equal`` semantics).

    Shapes and dtypes must match and every value must be identical; NaN at the same positions
    counts as equal (design.md, "Comparison semantics").

    Args:
        reference: the expected tensor (torch, numpy, or ``__dlpack__`` / ``__array__``).
        candidate: the tensor under test.
        msg: optional prefix of the failure message.

    Returns:
        The passing :class:`~parity_tracker.compare.Comparison`.

    Raises:
        AssertionError: not equal; the message is the comparison's (what, how many, the worst
            element and its index).
    """
    comparison = compare_tensors(reference, candidate, mode="equal")
    if not comparison.passed:
        _fail(comparison, msg)
    return comparison


def assert_tensor_allclose(
    reference: Any,
    candidate: Any,
    rtol: float | None = None,
    atol: float | None = None,
    msg: str | None = None,
) -> Comparison:
    """Assert ``|candidate - reference| <= atol + rtol * |reference|`` elementwise.

    Args:
        reference: the expected tensor.
        candidate: the tensor under test.
        rtol: relative tolerance; ``None`` takes the per-dtype default of
            ``torch.testing.assert_close`` (for the lower-precision side).
        atol: absolute tolerance; ``None`` as for ``rtol``.
        msg: optional prefix of the failure message.

    Returns:
        The passing comparison.

    Raises:
        AssertionError: not close; the message says how many elements, the worst one, its
            index and the tolerance.
    """
    comparison = compare_tensors(reference, candidate, mode="allclose", rtol=rtol, atol=atol)
    if not comparison.passed:
        _fail(comparison, msg)
    return comparison
