"""A weight written after its capture through a raw view taken before it is never ``equal``.

``Snapshotter.pin`` held parameters as lazy clones (or by reference): a buffer shared with numpy
(``torch.from_numpy``, a ``.numpy()`` view, DLPack) or a pointer taken before the capture
wrote both the parameter and its clone, and the reference's weight, changed to the
candidate's values after it was used, read ``equal`` (w10brk, fixed by w11trust: small weights
are cloned, the rest hashed at capture and checked before their verdict).

The reference's weight (or buffer) is all ones when the reference uses it; afterwards every
element is set to 2.0 through the raw view, and the candidate's is all 2.0. Expected,
independently: the captured values (ones) and the candidate's (twos) differ at all ``n``
elements, so the row is ``mismatch`` with ``n`` mismatches, or (a weight hashed, not
copied: at least ``COW_MIN_BYTES``) an ``error`` saying it changed after it was captured;
never ``equal``.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture.snapshot import COW_MIN_BYTES
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker

SIZES = [4, 1000, 3000, COW_MIN_BYTES // 4, 1 << 18]
BACKINGS = ["from_numpy", "numpy_view", "dlpack", "pointer"]
CHANGED = "changed after it was captured"


def _backed(backing: str, n: int):
    """A float32 tensor of ``n`` ones and ``write(v)``: sets every element through a raw view
    taken now (never through torch)."""
    if backing == "from_numpy":
        arr = np.ones(n, dtype=np.float32)
        return torch.from_numpy(arr), arr.fill
    if backing == "numpy_view":
        t = torch.ones(n)
        arr = t.numpy()
        return t, arr.fill
    if backing == "dlpack":
        arr = np.ones(n, dtype=np.float32)
        return torch.from_dlpack(arr), arr.fill
    t = torch.ones(n)
    ptr = t.data_ptr()

    def write(v: float) -> None:
        src = np.full(n, v, dtype=np.float32)
        ctypes.memmove(ptr, src.ctypes.data, src.nbytes)

    return t, write


class Scale(nn.Module):
    def __init__(self, w: torch.Tensor, as_buffer: bool) -> None:
        super().__init__()
        if as_buffer:
            self.register_buffer("weight", w)
        else:
            self.weight = nn.Parameter(w)

    def forward(self, x):
        return x * self.weight


class Write(nn.Module):
    """Runs ``write(2.0)`` in its forward: after the first module's capture, inside the run."""

    def __init__(self, write) -> None:
        super().__init__()
        self.write = write

    def forward(self, x):
        if self.write is not None:
            self.write(2.0)
        return x + 0.0


def _pair(backing: str, n: int, as_buffer: bool):
    w, write = _backed(backing, n)
    ref = nn.Sequential(Scale(w, as_buffer), Write(write))
    cand = nn.Sequential(Scale(torch.full((n,), 2.0), as_buffer), Write(None))
    return ref, cand


def _assert_never_equal(rows: list[dict], n: int) -> None:
    hit = [r for r in rows if r["tag"].endswith("weight") or r.get("kind") in ("param", "buffer")]
    hit = [r for r in hit if "weight" in r["tag"]]
    assert hit, rows
    for r in hit:
        if n * 4 < COW_MIN_BYTES:  # copied at capture: a verdict on the captured values
            assert (r["status"], r["mismatch_count"]) == ("mismatch", n), r
        elif r["status"] == "error":
            assert CHANGED in r["message"], r
        else:
            assert (r["status"], r["mismatch_count"]) == ("mismatch", n), r


@pytest.mark.parametrize("as_buffer", [False, True], ids=["param", "buffer"])
@pytest.mark.parametrize("backing", BACKINGS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("eager", ["equal", None], ids=["eager", "deferred"])
def test_checker(eager, n, backing, as_buffer):
    ref, cand = _pair(backing, n, as_buffer)
    checker = TensorChecker(verbose=False, eager_mode=eager)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(torch.ones(n))
        cand(torch.ones(n))
        rows = checker.check("equal").to_rows()
    _assert_never_equal(rows, n)


@pytest.mark.parametrize("as_buffer", [False, True], ids=["param", "buffer"])
@pytest.mark.parametrize("backing", BACKINGS)
@pytest.mark.parametrize("n", [4, 3000, 1 << 18])
@pytest.mark.parametrize("capture_ops", [False, True], ids=["modules", "ops"])
def test_run_parity(capture_ops, n, backing, as_buffer):
    ref, cand = _pair(backing, n, as_buffer)
    res = run_parity(
        ref,
        cand,
        (torch.ones(n),),
        mode="equal",
        dump_mode=DumpMode.NOT,
        capture_ops=capture_ops,
        environment={"commit": "w11trust"},
    )
    _assert_never_equal(res.modules.to_pylist(), n)


def test_an_unchanged_hashed_weight_is_equal_and_costs_no_error():
    """The check itself: a large weight nobody writes reads ``equal`` (its hash matches)."""
    n = 1 << 18
    w = torch.from_numpy(np.ones(n, dtype=np.float32))
    ref = nn.Sequential(Scale(w, False), Write(None))
    cand = nn.Sequential(Scale(torch.ones(n), False), Write(None))
    res = run_parity(ref, cand, (torch.ones(n),), mode="equal", dump_mode=DumpMode.NOT,
                     environment={"commit": "w11trust"})  # fmt: skip
    (row,) = [r for r in res.modules.to_pylist() if "weight" in r["tag"]]
    assert (row["status"], row["mismatch_count"]) == ("equal", 0)
