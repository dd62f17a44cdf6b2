"""A wrapper tensor subclass (values in inner tensors, no storage of its own) is never compared
by its own bytes: w11brk1 found torch's ``TwoTensor`` of zeros reading ``equal`` to one of ones
(the core read the wrapper's invalid storage; the verdict was random)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from parity_tracker import run_parity
from parity_tracker.compare.core import compare_tensors
from parity_tracker.tensor_checker import DumpMode

two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")


class Plain(torch.Tensor):
    """A subclass without ``__torch_dispatch__``: its storage holds its values."""


@pytest.mark.parametrize("mode", ["equal", "allclose"])
@pytest.mark.parametrize("n", [1, 8, 4096])
def test_wrapper_subclasses_that_differ_are_an_error_naming_the_type(mode, n):
    zeros = two_tensor.TwoTensor(torch.zeros(n), torch.zeros(n))
    ones = two_tensor.TwoTensor(torch.ones(n), torch.ones(n))
    for ref, cand in ((zeros, ones), (zeros, zeros), (torch.zeros(n), ones)):
        comp = compare_tensors(ref, cand, mode=mode)
        assert comp.status == "error", comp
        assert "TwoTensor" in comp.message and "plain tensor" in comp.message


def test_a_subclass_with_its_own_storage_is_still_compared_by_value():
    ones = torch.ones(3)
    assert compare_tensors(ones.as_subclass(Plain), torch.ones(3)).status == "equal"
    comp = compare_tensors(ones.as_subclass(Plain), torch.tensor([1.0, 2.0, 1.0]))
    assert (comp.status, comp.mismatch_count, comp.max_abs_diff) == ("mismatch", 1, 1.0)


class Wrap(nn.Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def forward(self, x):
        y = x * 0 + self.value
        return two_tensor.TwoTensor(y, y)


@pytest.mark.parametrize("ops", [False, True], ids=["module", "op"])
def test_a_run_whose_outputs_are_wrapper_subclasses_never_passes(ops):
    root = nn.Sequential  # the wrapper output is the root's and its child's
    res = run_parity(
        root(Wrap(0.0)), root(Wrap(1.0)), (torch.ones(8),), mode="equal",
        capture_ops=ops, dump_mode=DumpMode.NOT,
    )  # fmt: skip
    outs = [r for r in res.modules.to_pylist() if r["kind"] == "output"]
    assert len(outs) == 2 and {r["status"] for r in outs} == {"error"}, outs
    assert not res.passed
