"""Tolerances: torch.testing's table, the pair rule, integer exactness, per-tag overrides."""

from __future__ import annotations

import pytest
import torch

from parity_tracker.compare.tolerances import (
    DTYPE_PRECISIONS,
    Tolerances,
    check_pair,
    default_tolerances,
    dtype_tolerance,
)
from parity_tracker.errors import InputError


def test_table_is_torch_testing_table() -> None:
    comparison = pytest.importorskip("torch.testing._comparison")
    theirs = getattr(comparison, "_DTYPE_PRECISIONS", None)
    if theirs is None:
        pytest.skip("this torch has no _DTYPE_PRECISIONS")
    assert dict(theirs) == DTYPE_PRECISIONS


@pytest.mark.parametrize(
    ("dtype", "want"),
    [
        (torch.float16, (1e-3, 1e-5)),
        ("bfloat16", (1.6e-2, 1e-5)),
        ("torch.float32", (1.3e-6, 1e-5)),
        (torch.float64, (1e-7, 1e-7)),
        (torch.complex64, (1.3e-6, 1e-5)),
        (torch.int64, (0.0, 0.0)),
        (torch.bool, (0.0, 0.0)),
        (torch.uint8, (0.0, 0.0)),
        # not in torch's table: eps and the smallest normal of the format
        (torch.float8_e4m3fn, (2.0**-3, 2.0**-6)),
        (torch.float8_e5m2, (2.0**-2, 2.0**-14)),
    ],
)
def test_dtype_tolerance(dtype, want) -> None:
    assert dtype_tolerance(dtype) == want


def test_lower_precision_side_wins() -> None:
    assert default_tolerances(torch.float32, torch.bfloat16) == (1.6e-2, 1e-5)
    assert default_tolerances("float16", "float32") == (1e-3, 1e-5)
    assert default_tolerances(torch.float64, torch.float32) == (1.3e-6, 1e-5)
    assert default_tolerances(torch.int64, torch.float32) == (0.0, 0.0)


@pytest.mark.parametrize(("rtol", "atol"), [(1e-3, None), (None, 1e-3)])
def test_rtol_and_atol_together(rtol, atol) -> None:
    with pytest.raises(ValueError, match="rtol and atol") as info:
        check_pair(rtol, atol)
    assert isinstance(info.value, InputError)
    with pytest.raises(ValueError, match="rtol and atol"):
        Tolerances().resolve("t", "float32", "float32", rtol=rtol, atol=atol)


def test_negative_or_nan_rejected() -> None:
    with pytest.raises(InputError):
        check_pair(-1.0, 0.0)
    with pytest.raises(InputError):
        check_pair(0.0, float("nan"))
    assert check_pair(None, None) is None
    assert check_pair(1, 0) == (1.0, 0.0)


def test_overrides_first_match_and_precedence() -> None:
    tol = Tolerances(
        {"checker_down.1*": (1e-2, 1e-3), "checker_down*": (1e-4, 1e-5)}, rtol=0.5, atol=0.25
    )
    assert tol.resolve("checker_down.1.conv", "float32", "float32") == (1e-2, 1e-3)
    assert tol.resolve("checker_down.0", "float32", "float32") == (1e-4, 1e-5)
    assert tol.resolve("checker_up", "float32", "float32") == (0.5, 0.25)  # global pair
    assert Tolerances().resolve("checker_up", "float32", "float16") == (1e-3, 1e-5)  # table
    assert tol.resolve("checker_down.0", "float32", "float32", rtol=0, atol=1) == (0.0, 1.0)
    assert tol.resolve("checker_down.0", torch.int64, torch.int64) == (0.0, 0.0)  # ints exact
    assert tol.resolve(None, "float32", "float32") == (0.5, 0.25)


def test_bad_override_and_dtype_named() -> None:
    with pytest.raises(InputError, match="checker_x"):
        Tolerances({"checker_x": (1e-3, None)})
    with pytest.raises(InputError, match="float33"):
        dtype_tolerance("float33")
