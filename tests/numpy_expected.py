"""Expected comparison results computed with numpy, never with the code under test, and the
models and switches the in-place / resize tests share (import as ``from numpy_expected import
...``; pytest puts ``tests/`` on ``sys.path``).

Used by tests/test_break_w9_inplace.py, tests/test_trust_resize.py and
tests/test_break_w8_recapture.py (its own ``_expected`` keeps per-tag overrides and the
non-finite rule of the recapture runs).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.compare import fused

#: torch.testing's ``_DTYPE_PRECISIONS`` (rtol, atol), written out rather than imported from
#: the code under test.
TORCH_TESTING_TOL = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def wide(t: torch.Tensor) -> np.ndarray:
    """A private C-order numpy copy of ``t``'s values: float64, complex128, or int64 (exact)
    for integers and bool; a quantized tensor by its dequantized values."""
    t = t.detach().clone().contiguous()
    if t.is_quantized:
        t = t.dequantize()
    if t.dtype.is_complex:
        return t.to(torch.complex128).numpy()
    if t.dtype.is_floating_point:
        return t.to(torch.float64).numpy()
    return t.to(torch.int64).numpy()


def expected(ref: torch.Tensor, cand: torch.Tensor, mode: str) -> tuple[str, int, float]:
    """(status, mismatch count, max |c − r|) of ``mode`` (``equal`` / ``allclose``) from numpy.

    NaN matches NaN by position and an inf only the same inf (``torch.testing``); allclose
    uses :data:`TORCH_TESTING_TOL` for the dtypes it lists, exact equality for the others
    (integers, bool).
    """
    a, b = wide(ref).reshape(-1), wide(cand).reshape(-1)
    with np.errstate(invalid="ignore"):
        same = (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind in "fc" else a == b
        rtol, atol = TORCH_TESTING_TOL.get(ref.dtype, (0.0, 0.0))
        finite = np.isfinite(a) & np.isfinite(b)  # |c - inf| <= rtol * inf would hold
        near = same | (finite & (np.abs(b - a) <= atol + rtol * np.abs(a)))
        near = same if mode == "equal" else near
        bad = ~near
        top = float(np.max(np.abs(b - a))) if a.size else 0.0
    status = "equal" if same.all() else ("mismatch" if bad.any() else "close")
    return status, int(bad.sum()), top


def use_fold(fold: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pairs below ``fused.KERNEL_MIN`` through the numpy fold (``"numpy"``) or the compiled
    loop (``"compiled"``: skipped without numba or with ``PARITY_NO_KERNEL``)."""
    if fold == "numpy":
        monkeypatch.setattr(fused, "kernel_loaded", lambda: False)
        monkeypatch.setattr(fused, "kernel", lambda: None)
        return
    pytest.importorskip("numba")
    if fused.kernel() is None:
        pytest.skip("compiled loop disabled (PARITY_NO_KERNEL)")


class Source(nn.Module):
    """Returns a fresh tensor of ``values``: the model's own storage, captured as its output."""

    def __init__(self, values: torch.Tensor) -> None:
        super().__init__()
        self.values = values

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.values.clone()
