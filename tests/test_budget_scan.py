"""Issue 19, budget round 3: the compiled error scan (``compare.budget_scan``) changes nothing.

``max_abs_err`` sends a finite float32 / float64 / bfloat16 side of more than ``SMALL``
elements through one compiled loop. Checked against a straightforward numpy float64
computation (``max |side − golden|`` with the side widened by numpy from its exact float32
image, the largest finite ``|golden|``, the module's non-finite rule written out with masks),
on random sides and on edge cases: NaN and ±inf on either side (the loop must hand these to the
torch path), -0.0 against +0.0, float32 subnormals, bfloat16 rounding ties; and the same
``ErrorScan`` with the loop on and off (``PARITY_NO_KERNEL`` semantics, monkeypatched).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from parity_tracker.compare import budget, budget_scan

N = budget.SMALL + 1001  # past the whole-tensor path: the compiled loop (or the chunked one)


@pytest.fixture
def compiled():
    pytest.importorskip("numba")
    if budget_scan._load() is None:
        pytest.skip("compiled scan disabled (PARITY_NO_KERNEL)")


@pytest.fixture
def torch_only(monkeypatch):
    monkeypatch.setitem(budget_scan._STATE, "fn", None)
    monkeypatch.setitem(budget_scan._STATE, "built", True)


def _golden(name: str, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed).standard_normal(N)
    if name == "ties":  # float32 values halfway between two bfloat16 neighbours
        bits = (g.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
        g = bits.view(np.float32).astype(np.float64)
    elif name == "subnormal":  # float32 subnormals next to normal values
        g[::2] *= 1e-40
    elif name == "zeros":
        g[::3] = 0.0
        g[1::3] = -0.0
    elif name == "wide":
        g = g * 10.0 ** np.random.default_rng(seed + 1).uniform(-30, 30, N)
    return g


def _side_np(side: torch.Tensor) -> np.ndarray:
    """The side in float64 by numpy alone: bfloat16 via its bits as the upper half of a float32."""
    if side.dtype == torch.bfloat16:
        bits = side.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    return side.numpy().astype(np.float64)


def _np_scan(side: torch.Tensor, golden: np.ndarray) -> tuple[float, int, float]:
    """``(max error, lost, largest finite |golden|)`` by the module's rule, in numpy."""
    s = _side_np(side)
    with np.errstate(invalid="ignore", over="ignore"):
        same = (s == golden) | (np.isnan(s) & np.isnan(golden))
        d = np.where(same, 0.0, np.abs(s - golden))
    lost = int(np.count_nonzero(~np.isfinite(d)))
    finite_g = np.abs(golden[np.isfinite(golden)])
    top_g = float(finite_g.max()) if finite_g.size else 0.0
    return (math.inf if lost else float(d.max())), lost, top_g


DTYPES = [torch.bfloat16, torch.float32, torch.float64]


def _side(golden: np.ndarray, dtype: torch.dtype, name: str) -> torch.Tensor:
    g = torch.from_numpy(golden)
    side = g.to(dtype)
    if dtype == torch.float64:  # a float64 side: some rounding of its own
        side = g * (1 + 2.0**-40) + 1e-300
    if name == "zeros":
        side[::3] = -0.0  # -0.0 against +0.0: equal, error 0
    return side


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["noise", "ties", "subnormal", "zeros", "wide"])
@pytest.mark.parametrize("loop", ["compiled", "torch_only"])
def test_scan_matches_numpy_float64(request, loop, name, dtype) -> None:
    request.getfixturevalue(loop)
    golden = _golden(name)
    side = _side(golden, dtype, name)
    got = budget.max_abs_err(side, torch.from_numpy(golden), golden_max=True)
    want = _np_scan(side, golden)
    assert (got.max_abs_err, got.lost, got.golden_max) == want
    assert got.dtype == dtype and got.problem == ""
    assert math.copysign(1.0, got.max_abs_err) == 1.0  # never -0.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "where", ["side_nan", "side_inf", "golden_nan", "golden_inf", "both_inf", "both_nan"]
)
def test_non_finite_values_take_the_rule(compiled, where, dtype) -> None:
    golden = _golden("noise")
    side = _side(golden, dtype, "noise")
    k = N // 2 + 3
    if where.startswith("side"):
        side[k] = math.nan if where.endswith("nan") else math.inf
    elif where.startswith("golden"):
        golden[k] = math.nan if where.endswith("nan") else -math.inf
    else:  # the same non-finite value on both sides: exact, nothing lost
        golden[k] = math.nan if where.endswith("nan") else math.inf
        side[k] = golden[k]
    assert budget_scan.fast_scan(side, torch.from_numpy(golden)) is None  # handed over
    got = budget.max_abs_err(side, torch.from_numpy(golden), golden_max=True)
    assert (got.max_abs_err, got.lost, got.golden_max) == _np_scan(side, golden)


def test_difference_overflow_is_handed_over(compiled) -> None:
    golden = np.full(N, 1.5e308)
    side = torch.from_numpy(-golden)  # finite sides, infinite difference
    assert budget_scan.fast_scan(side, torch.from_numpy(golden)) is None
    got = budget.max_abs_err(side, torch.from_numpy(golden), golden_max=True)
    assert (got.max_abs_err, got.lost, got.golden_max) == _np_scan(side, golden)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_and_torch_paths_give_the_same_scan(monkeypatch, compiled, dtype) -> None:
    for seed in range(4):
        golden = torch.from_numpy(_golden("wide", seed))
        side = golden.to(dtype) if dtype != torch.float64 else golden * (1 + 1e-12)
        on = budget.side_error(golden, side, digest=True)
        with monkeypatch.context() as m:
            m.setitem(budget_scan._STATE, "fn", None)
            m.setitem(budget_scan._STATE, "built", True)
            off = budget.side_error(golden, side, digest=True)
        assert on == off


def test_other_dtypes_and_shapes_are_not_scanned_here(compiled) -> None:
    g = torch.randn(N, dtype=torch.float64)
    assert budget_scan.fast_scan(g.half(), g) is None  # float16: the torch path
    assert budget_scan.fast_scan(g.float(), g.float()) is None  # golden not float64
    assert budget_scan.fast_scan(g[:-1].float(), g) is None  # lengths differ
    assert budget_scan.fast_scan(g[:0].float(), g[:0]) is None  # empty
