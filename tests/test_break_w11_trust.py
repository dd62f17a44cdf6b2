"""Adversarial cases against w11trust's pinned-weight checks and spill-pool lock (w11brk1).

Every case builds a reference whose weight (or buffer) is used, then changed after its
capture, and a candidate whose weight holds the values the reference's weight was changed
to. Expected, independently: the reference's weight at capture time differs from the
candidate's at every one of its ``numel`` elements (each is the capture value ``+ 1``), so
the row is ``mismatch`` with ``numel`` mismatches, or an ``error`` saying the weight changed
after it was captured (its capture-time value not kept); never ``equal``. A weight changed
and changed back before the candidate runs holds its capture-time values again: ``equal``.

Silent pass found here (fixed, ``capture.snapshot._pin_hashable``): a parameter that is a
view with gaps of a larger storage (a column slice, ``w[:, ::2]``), an overlapping
``as_strided`` view or a conjugate view was held by reference without a content hash
(``digestible`` refuses those layouts), so an uncounted write to it (``.data.copy_``, a numpy
view of its base taken before the capture) read ``equal``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

CHANGED = "changed after it was captured"
MODIFIED = "modified in place after it was captured"


class Use(nn.Module):
    """Uses its weight (a parameter, or a buffer) in its forward."""

    def __init__(self, w: torch.Tensor, as_buffer: bool = False) -> None:
        super().__init__()
        if as_buffer:
            self.register_buffer("weight", w)
        else:
            grad = w.is_floating_point() or w.is_complex()
            self.weight = nn.Parameter(w, requires_grad=grad)

    def forward(self, x):
        return x + self.weight.sum().real.float()


class After(nn.Module):
    """Runs ``fn()`` in its forward: after the previous module's capture, inside the run."""

    def __init__(self, fn=None) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        if self.fn is not None:
            self.fn()
        return x + 0.0


def _rand(shape, dtype):
    g = torch.Generator().manual_seed(7)
    return (torch.rand(shape, generator=g) * 4).to(dtype)


# layout -> (view, base): the weight, a view of ``base`` (its whole storage)
def _layout(name: str, shape: tuple[int, int], dtype: torch.dtype):
    r, c = shape
    if name == "whole":
        b = _rand(shape, dtype)
        return b, b
    if name == "gapped":  # every other column of a (r, 2c) buffer
        b = _rand((r, 2 * c), dtype)
        return b[:, ::2], b
    if name == "colslice":  # the first c columns of a (r, c + 3) buffer
        b = _rand((r, c + 3), dtype)
        return b[:, :c], b
    if name == "overlap":  # rows overlapping by all but one element
        b = _rand((r + c,), dtype)
        return b.as_strided(shape, (1, 1), 0), b
    if name == "offset":  # all but the first row of a flat buffer
        b = _rand((r + 1, c), dtype)
        return b[1:], b
    if name == "transposed":
        b = _rand((c, r), dtype)
        return b.t(), b
    if name == "channels_last":  # (r, c, 3, 3) stored as (r, 3, 3, c)
        b = _rand((r, 3, 3, c), dtype)
        return b.permute(0, 3, 1, 2), b
    raise AssertionError(name)


def _raw(base: torch.Tensor) -> np.ndarray:
    """A numpy view of ``base``'s bytes (taken before the capture: torch never sees writes)."""
    if base.dtype == torch.bfloat16:
        return base.view(torch.int16).numpy()
    return base.numpy()


def _changer(how: str, w_of, view: torch.Tensor, base: torch.Tensor, new: torch.Tensor):
    """``fn()`` that sets the reference's weight to ``new`` (or back to itself) by ``how``."""
    arr = _raw(base)  # now: before the capture

    def image(values: torch.Tensor) -> np.ndarray:
        tmp = base.clone()
        tmp.as_strided(view.shape, view.stride(), view.storage_offset()).copy_(values)
        return _raw(tmp).copy()

    if how == "numpy":
        return lambda: arr.__setitem__(Ellipsis, image(new))
    if how == "data":
        return lambda: w_of().data.copy_(new)
    if how == "no_grad":

        def fn():
            with torch.no_grad():
                w_of().copy_(new)

        return fn
    if how == "data_swap":  # the module's weight now another tensor: the captured one kept

        def fn():
            w_of().data = new.clone()

        return fn
    if how == "write_back":  # changed, then its old bytes written back: unchanged

        def fn():
            old = _raw(base).copy()
            arr[...] = image(new)
            arr[...] = old

        return fn
    raise AssertionError(how)


def _models(layout, shape, dtype, how, as_buffer=False):
    view, base = _layout(layout, shape, dtype)
    new = view + 1
    ref_use = Use(view, as_buffer)
    fn = _changer(how, lambda: ref_use.weight, view, base, new)
    cand_w = view.clone() if how == "write_back" else new.clone()
    return nn.Sequential(ref_use, After(fn)), nn.Sequential(Use(cand_w, as_buffer), After())


def _weight_row(rows: list[dict]) -> dict:
    (row,) = [r for r in rows if r["tag"].endswith(".weight")]
    return row


def _assert_verdict(row: dict, how: str, numel: int) -> None:
    if how == "write_back":
        assert (row["status"], row["mismatch_count"]) == ("equal", 0), row
    elif row["status"] == "error":
        assert how in ("numpy", "data", "no_grad"), row  # never for a swapped .data
        assert CHANGED in row["message"] or MODIFIED in row["message"], row
    else:
        assert (row["status"], row["mismatch_count"]) == ("mismatch", numel), row


def _check(ref, cand, eager) -> list[dict]:
    checker = TensorChecker(verbose=False, eager_mode=eager)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(torch.ones(3))
        cand(torch.ones(3))
        return checker.check("equal").to_rows()


SILENT = ["gapped", "colslice", "overlap"]  # were held without a hash: equal (fixed)
HASHED = ["whole", "offset", "transposed", "channels_last"]
HOWS = ["numpy", "data", "no_grad", "data_swap", "write_back"]


@pytest.mark.parametrize("eager", ["equal", None], ids=["eager", "deferred"])
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8, torch.complex64])
@pytest.mark.parametrize("layout", SILENT + HASHED)
@pytest.mark.parametrize("shape", [(4, 8), (256, 128)], ids=["small", "large"])
def test_weight_changed_after_capture_is_never_equal(shape, layout, dtype, how, eager):
    ref, cand = _models(layout, shape, dtype, how)
    numel = 9 * shape[0] * shape[1] if layout == "channels_last" else shape[0] * shape[1]
    row = _weight_row(_check(ref, cand, eager))
    _assert_verdict(row, how, numel)
