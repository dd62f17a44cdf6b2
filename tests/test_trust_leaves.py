"""Issue 13, item 2: non-tensor leaves are compared as 0-d values or named, never dropped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture import flatten
from parity_tracker.capture.leaves import NonTensor
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker


class Router(nn.Module):
    def __init__(self, bias: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gate = nn.Linear(4, 3)
        self.bias = bias

    def forward(self, x):
        probs = self.gate(x).softmax(-1)
        return probs, float(x.mean()) + self.bias


class Wrap(nn.Module):
    def __init__(self, bias: float) -> None:
        super().__init__()
        self.router = Router(bias)

    def forward(self, x):
        return self.router(x)


X = torch.tensor([[0.25, 0.5, 0.75, 1.0]])  # mean 0.625: 0.625 + 0.5 is exact in float64


@pytest.mark.parametrize("mode", ["equal", "allclose"])
def test_router_scalar_output_is_compared(mode):
    result = run_parity(Wrap(0.0), Wrap(0.5), (X,), mode=mode, dump_mode=DumpMode.NOT)
    rows = {r["tag"]: r for r in result.modules.to_pylist()}
    for tag in ("checker_router_output_1", "checker_model_output_1"):
        row = rows[tag]
        assert row["status"] == "mismatch"
        assert row["max_abs_diff"] == 0.5  # |1.125 - 0.625|, by hand
        assert row["ref_dtype"] == "float64" and row["ref_shape"] == []
    assert rows["checker_router_output_0"]["status"] == "equal"
    assert result.passed is False and result.record.tensors_failing >= 2


def test_equal_scalar_outputs_pass():
    result = run_parity(Wrap(0.25), Wrap(0.25), (X,), mode="equal", dump_mode=DumpMode.NOT)
    rows = {r["tag"]: r for r in result.modules.to_pylist()}
    assert rows["checker_router_output_1"]["status"] == "equal"
    assert result.passed


class Emit(nn.Module):
    """Returns whatever leaves it was built with (next to one tensor)."""

    def __init__(self, *leaves) -> None:
        super().__init__()
        self.leaves = leaves

    def forward(self, x):
        return (x * 2, *self.leaves)


def _check(ref_leaves, cand_leaves, mode="equal"):
    checker = TensorChecker(verbose=False)
    ref, cand = Emit(*ref_leaves), Emit(*cand_leaves)
    with (
        module_register_tensor_checker(ref, checker, side=0),
        module_register_tensor_checker(cand, checker, side=1),
    ):
        ref(torch.ones(2))
        cand(torch.ones(2))
    out = checker.check(mode, verbose=False)
    return {r.tag: r for r in out.results}, out


@pytest.mark.parametrize(
    ("ref_leaf", "cand_leaf", "status", "diff"),
    [
        (np.float32(1.5), np.float32(2.0), "mismatch", 0.5),
        (np.float32(1.5), np.float32(1.5), "equal", None),
        (np.array(3, dtype=np.int16), np.array(5, dtype=np.int16), "mismatch", 2.0),
        (True, False, "mismatch", None),
        (7, 7, "equal", None),
        (2**40 + 1, 2**40, "mismatch", 1.0),  # int64, not float32: the 1 is not rounded away
        (0.1, 0.1 + 2**-56, "mismatch", 2**-56),  # the next double after 0.1
        (1 + 2j, 1 + 3j, "mismatch", 1.0),
    ],
)
def test_numbers_and_numpy_scalars_are_compared_as_0d(ref_leaf, cand_leaf, status, diff):
    rows, _ = _check((ref_leaf,), (cand_leaf,))
    row = rows["checker_model_output_1"]
    assert row.status == status, row.comparison.message
    if diff is not None:
        expected = (
            abs(np.float64(cand_leaf) - np.float64(ref_leaf))
            if not isinstance(ref_leaf, complex)
            else abs(cand_leaf - ref_leaf)
        )
        assert row.comparison.max_abs_diff == pytest.approx(float(expected), rel=0, abs=0)


def test_float_leaf_keeps_double_precision():
    a, b = 0.1, np.nextafter(0.1, 1.0)  # differ in float64, equal once rounded to float32
    assert np.float32(a) == np.float32(b)
    rows, _ = _check((a,), (float(b),))
    assert rows["checker_model_output_1"].status == "mismatch"


class Thing:
    pass


@pytest.mark.parametrize(
    ("ref_leaf", "cand_leaf", "names"),
    [
        ("a", "b", ("str", "str")),
        (Thing(), Thing(), ("Thing", "Thing")),
        (None, "x", ("None", "str")),
    ],
)
def test_other_leaves_get_a_not_compared_row_naming_the_type(ref_leaf, cand_leaf, names):
    rows, out = _check((ref_leaf,), (cand_leaf,))
    row = rows["checker_model_output_1"]
    assert row.status == "skipped"
    msg = row.comparison.message
    assert msg.startswith("not compared") and all(n in msg for n in names)
    assert out.passed  # not compared is neutral, the tensors are equal


def test_leaf_on_one_side_only_is_a_structure_difference():
    rows, out = _check(("extra",), ())
    assert rows["checker_model_output_1"].status == "missing_candidate"
    assert "str" in rows["checker_model_output_1"].comparison.message
    rows, out = _check((), (2.5,))
    assert rows["checker_model_output_1"].status == "missing_reference"
    assert not out.passed


def test_tensor_against_number_is_a_structure_difference():
    rows, _ = _check((torch.ones(3),), ("x",))
    assert rows["checker_model_output_1"].status == "shape_mismatch"


def test_none_on_both_sides_gives_no_row():
    rows, _ = _check((None,), (None,))
    assert "checker_model_output_1" not in rows


def test_flatten_turns_scalars_into_exact_0d_tensors():
    leaves = dict(flatten({"f": 0.1, "i": 2**40, "b": True, "n": np.float16(1.5), "s": "hi"}))
    assert leaves["f"].dtype == torch.float64 and leaves["f"].item() == 0.1
    assert leaves["i"].dtype == torch.int64 and leaves["i"].item() == 2**40
    assert leaves["b"].dtype == torch.bool and leaves["n"].dtype == torch.float16
    assert isinstance(leaves["s"], NonTensor) and leaves["s"].type_name == "str"
    big = dict(flatten({"x": 2**70}))["x"]
    assert isinstance(big, NonTensor) and big.type_name.startswith("int")


def test_scalar_inputs_are_compared():
    class Scale(nn.Module):
        def forward(self, x, factor):
            return x * factor

    class M(nn.Module):
        def __init__(self, factor):
            super().__init__()
            self.scale, self.factor = Scale(), factor

        def forward(self, x):
            return self.scale(x, factor=self.factor)

    result = run_parity(M(2.0), M(3.0), (torch.ones(2),), mode="equal", dump_mode=DumpMode.NOT)
    rows = {r["tag"]: r for r in result.modules.to_pylist()}
    assert rows["checker_scale_input_factor"]["status"] == "mismatch"
    assert rows["checker_scale_input_factor"]["max_abs_diff"] == 1.0
    first = result.record.first_divergence
    assert first.tag == "checker_scale_input_factor"


def test_keyword_flag_given_on_one_side_only_is_named_not_failed():
    class Inner(nn.Module):
        def forward(self, x, use_cache=False):
            return x + 1

    class Outer(nn.Module):
        def __init__(self, explicit):
            super().__init__()
            self.inner, self.explicit = Inner(), explicit

        def forward(self, x):
            return self.inner(x, use_cache=False) if self.explicit else self.inner(x)

    result = run_parity(Outer(False), Outer(True), (torch.ones(2),), dump_mode=DumpMode.NOT)
    row = {r["tag"]: r for r in result.modules.to_pylist()}["checker_inner_input_use_cache"]
    assert row["status"] == "skipped" and "'use_cache'" in row["message"]
    assert "candidate only" in row["message"]
    assert result.passed
