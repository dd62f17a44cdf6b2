"""Issue 19, budget wave 5: small sides go through the compiled scan once it is loaded.

``max_abs_err`` of a finite real side of at most ``budget.SMALL`` elements used torch's
whole-tensor ops only; once the compiled scan is loaded (``budget_scan.loaded``) it answers
too, except where a maximum is zero (every difference, or every golden value, ±0.0: the sign of
that zero is the one ``torch.aminmax`` picks, so the whole-tensor path keeps deciding it).

Checked: the values against numpy float64 from the definitions (the side widened by numpy
alone: bfloat16 from its bits), the loop actually used for a small side, and the very same
``ErrorScan`` as the torch path, sign of zeros included (``math.copysign``), on edge cases.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from parity_tracker.compare import budget, budget_scan

SIZES = [1, 7, 255, 256, 257, 4099, budget.SMALL]
DTYPES = [torch.bfloat16, torch.float32, torch.float64]


@pytest.fixture
def compiled():
    pytest.importorskip("numba")
    if budget_scan._load() is None:
        pytest.skip("compiled scan disabled (PARITY_NO_KERNEL)")


def _side_np(side: torch.Tensor) -> np.ndarray:
    """The side in float64 by numpy alone (bfloat16: its bits as a float32's upper half)."""
    if side.dtype == torch.bfloat16:
        bits = side.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    return side.numpy().astype(np.float64)


def _pair(n: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.from_numpy(np.random.default_rng(seed).standard_normal(n))
    side = g.to(dtype) if dtype != torch.float64 else g * (1 + 2.0**-40) + 1e-300
    return side, g


def _torch_only(side, golden, monkeypatch) -> budget.ErrorScan:
    with monkeypatch.context() as m:
        m.setitem(budget_scan._STATE, "fn", None)
        m.setitem(budget_scan._STATE, "built", True)
        return budget.max_abs_err(side, golden, golden_max=True)


def _signed(x: float | None) -> tuple:
    return (x, None if x is None else math.copysign(1.0, x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_small_side_uses_the_loaded_loop_with_numpy_values(compiled, monkeypatch, n, dtype):
    calls = []
    real = budget.fast_scan
    monkeypatch.setattr(budget, "fast_scan", lambda s, g: calls.append(s.numel()) or real(s, g))
    side, golden = _pair(n, dtype)
    got = budget.max_abs_err(side, golden, golden_max=True)
    s, g = _side_np(side), golden.numpy()
    want_err, want_g = float(np.abs(s - g).max()), float(np.abs(g).max())
    if want_err == 0.0:  # a float64 side of one element may round to the golden
        pytest.skip("no difference to measure")
    assert calls == [n]  # the compiled loop answered this small side
    assert (got.max_abs_err, got.golden_max, got.lost, got.dtype) == (want_err, want_g, 0, dtype)


def _edge(name: str, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    side, g = _pair(n, dtype, seed=n)
    if name == "equal":  # no difference at all: the whole-tensor path's zero
        side = g.to(dtype)
        g = side.to(torch.float64)
    elif name == "golden_zero":  # every golden value ±0.0, the side not
        g = torch.zeros(n, dtype=torch.float64)
        g[::2] = -0.0
    elif name == "signed_zeros":  # -0.0 against +0.0 everywhere: equal, error ±0
        g = torch.zeros(n, dtype=torch.float64)
        side = torch.full((n,), -0.0, dtype=dtype)
    elif name == "one_off":  # one element differs, the rest equal
        side = g.to(dtype)
        g = side.to(torch.float64)
        g[n // 2] += 2.0**-30
    elif name == "subnormal":
        g = g * 1e-40
        side = g.to(dtype)
    elif name == "nan":  # non-finite: both paths hand over to the chunked rule
        side = side.clone()
        side[n // 3] = math.nan
    return side, g


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 255, 4099, budget.SMALL])
@pytest.mark.parametrize(
    "name", ["noise", "equal", "golden_zero", "signed_zeros", "one_off", "subnormal", "nan"]
)
def test_small_side_scan_is_the_torch_paths_bit_for_bit(compiled, monkeypatch, name, n, dtype):
    side, golden = _edge(name, n, dtype)
    off = _torch_only(side, golden, monkeypatch)
    on = budget.max_abs_err(side, golden, golden_max=True)
    assert on == off
    assert _signed(on.max_abs_err) == _signed(off.max_abs_err)  # -0.0 stays -0.0
    assert _signed(on.golden_max) == _signed(off.golden_max)
    s, g = _side_np(side), golden.numpy()
    with np.errstate(invalid="ignore"):
        finite = bool(np.isfinite(s).all())
    if finite:  # the values themselves, from numpy
        assert on.max_abs_err == float(np.abs(s - g).max())
        assert on.golden_max == float(np.abs(g).max())


def test_small_sides_do_not_import_the_scan_by_themselves(monkeypatch) -> None:
    """Without the comparison's loop loaded, a small side never loads the scan."""
    monkeypatch.setitem(budget_scan._STATE, "fn", None)
    monkeypatch.setitem(budget_scan._STATE, "built", False)
    monkeypatch.setattr(budget_scan, "kernel_loaded", lambda: False)
    side, golden = _pair(300, torch.bfloat16)
    got = budget.max_abs_err(side, golden, golden_max=True)
    assert budget_scan._STATE["built"] is False
    assert got.max_abs_err == float(np.abs(_side_np(side) - golden.numpy()).max())
