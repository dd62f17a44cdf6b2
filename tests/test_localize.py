"""align_ops, classify, layout_differences, isolate (issue 5 §2, §3)."""

from __future__ import annotations

from functools import cache

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from parity_tracker.errors import InputError
from parity_tracker.localize import (
    align_ops,
    classify,
    compare_structured,
    isolate,
    layout_differences,
)


def _check_alignment(ref, cand, pairs):
    """Every index once, in increasing order, matched keys equal."""
    assert [i for i, _ in pairs if i is not None] == list(range(len(ref)))
    assert [j for _, j in pairs if j is not None] == list(range(len(cand)))
    for i, j in pairs:
        if i is not None and j is not None:
            assert ref[i] == cand[j]


def _lcs_length(a, b):
    """Independent LCS length by memoised recursion (small inputs only)."""

    @cache
    def f(i, j):
        if i == len(a) or j == len(b):
            return 0
        if a[i] == b[j]:
            return 1 + f(i + 1, j + 1)
        return max(f(i + 1, j), f(i, j + 1))

    return f(0, 0)


def test_identical_sequences_match_one_to_one():
    ops = [("addmm", (2, 4)), ("gelu", (2, 4)), ("addmm", (2, 2))]
    assert align_ops(ops, ops) == [(0, 0), (1, 1), (2, 2)]


def test_one_extra_candidate_op_is_one_missing_reference_rest_matched():
    ref = ["relu", "mul", "add", "sum"]
    cand = ["relu", "abs", "mul", "add", "sum"]
    assert align_ops(ref, cand) == [(0, 0), (None, 1), (1, 2), (2, 3), (3, 4)]


def test_one_missing_candidate_op():
    ref = ["a", "b", "c", "d"]
    cand = ["a", "c", "d"]
    assert align_ops(ref, cand) == [(0, 0), (1, None), (2, 1), (3, 2)]


def test_substituted_op_is_unmatched_on_both_sides():
    ref = [("mm", (4, 4)), ("gelu", (4, 4)), ("sum", ())]
    cand = [("mm", (4, 4)), ("silu", (4, 4)), ("sum", ())]
    pairs = align_ops(ref, cand)
    assert pairs == [(0, 0), (1, None), (None, 1), (2, 2)]


def test_output_shape_is_part_of_the_key():
    ref = [("add", (2, 3)), ("add", (2, 4))]
    cand = [("add", (2, 4))]
    assert align_ops(ref, cand) == [(0, None), (1, 0)]


def test_empty_sides():
    assert align_ops([], []) == []
    assert align_ops(["a", "b"], []) == [(0, None), (1, None)]
    assert align_ops([], ["a"]) == [(None, 0)]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from("abcd"), max_size=9),
    st.lists(st.sampled_from("abcd"), max_size=9),
)
def test_alignment_is_a_longest_common_subsequence(ref, cand):
    pairs = align_ops(ref, cand)
    _check_alignment(ref, cand, pairs)
    matched = sum(1 for i, j in pairs if i is not None and j is not None)
    assert matched == _lcs_length(tuple(ref), tuple(cand))


def test_long_sequences_fall_back_and_stay_valid(monkeypatch):
    import parity_tracker.localize.align as loc

    monkeypatch.setattr(loc, "MAX_DP_CELLS", 10)
    ref = list("xabcabcabcy")
    cand = list("xabcQabcabcy")
    pairs = align_ops(ref, cand)
    _check_alignment(ref, cand, pairs)
    assert [p for p in pairs if p[0] is None] == [(None, 4)]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (dict(present="reference", inputs_status="passing"), "C"),
        (dict(present="candidate", inputs_status="unknown"), "C"),
        # case A needs bitwise-equal inputs: passing allclose alone is case B (look upstream)
        (dict(present="both", inputs_status="passing", inputs_equal=True), "A"),
        (dict(present="both", inputs_status="passing"), "B"),
        (dict(present="both", inputs_status="passing", inputs_equal=False), "B"),
        (
            dict(
                present="both",
                inputs_status="passing",
                inputs_equal=True,
                layout_diffs=["input 0 stride"],
            ),
            "B",
        ),
        (
            dict(
                present="both",
                inputs_status="passing",
                inputs_equal=True,
                output_diffs=["output 0 dtype"],
            ),
            "B",
        ),
        (dict(present="both", inputs_status="failing"), None),
        (dict(present="both", inputs_status="unknown"), None),
        # fed by a copy/conversion that ran on one side only (a candidate-only _to_copy): B
        (dict(present="both", inputs_status="failing", fed_by=["_to_copy"]), "B"),
        (
            dict(present="both", inputs_status="passing", inputs_equal=True, fed_by=["_to_copy"]),
            "B",
        ),
    ],
)
def test_classify_cases(kwargs, expected):
    assert classify(**kwargs) == expected


def test_classify_rejects_unknown_values():
    with pytest.raises(InputError, match="present"):
        classify(present="left", inputs_status="passing")
    with pytest.raises(InputError, match="inputs_status"):
        classify(present="both", inputs_status="ok")


def test_layout_differences_names_stride_dtype_contiguity():
    ref = [
        {"dtype": "float32", "stride": (1000, 1), "contiguous": True},
        {"dtype": "float32", "stride": (1,), "contiguous": True},
    ]
    cand = [
        {"dtype": "float32", "stride": (1, 1000), "contiguous": False},
        {"dtype": "float64", "stride": (1,), "contiguous": True},
    ]
    assert layout_differences(ref, cand) == [
        "input 0 stride (1000, 1) vs (1, 1000)",
        "input 0 contiguous vs non-contiguous",
        "input 1 dtype float32 vs float64",
    ]
    assert layout_differences(ref, ref) == []
    assert layout_differences(ref, ref[:1]) == ["input 1 only on the reference side"]


def test_compare_structured_worst_leaf_and_max_diff():
    a = {"x": torch.zeros(3), "y": (torch.ones(2), 5)}
    b = {"x": torch.zeros(3), "y": (torch.tensor([1.0, 1.25]), 5)}
    assert compare_structured(a, a, mode="equal") == ("equal", 0.0)
    status, diff = compare_structured(a, b, mode="equal")
    assert status == "mismatch"
    assert diff == 0.25
    assert compare_structured(a, {"x": torch.zeros(3)}, mode="equal") == ("shape_mismatch", None)


class _Chain(nn.Module):
    """Two linear layers with a ReLU between (named layer0, act, layer1)."""

    def __init__(self):
        super().__init__()
        self.layer0 = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.layer1 = nn.Linear(4, 3)

    def forward(self, x):
        return self.layer1(self.act(self.layer0(x)))


def _chain_pair():
    torch.manual_seed(0)
    ref = _Chain().eval()
    cand = _Chain().eval()
    cand.load_state_dict(ref.state_dict())
    with torch.no_grad():
        cand.layer0.bias += 0.5  # only layer 0 is wrong
    return ref, cand


def test_isolate_two_layer_chain_separates_local_from_propagated_error():
    ref, cand = _chain_pair()
    x = torch.randn(5, 4)
    names = ["layer0", "layer1", "model"]
    with torch.no_grad():
        result = isolate(ref, cand, lambda: ref(x), names, mode="equal")
        # Independent expectations, computed with plain torch in float64.
        h_ref = torch.relu(x.double() @ ref.layer0.weight.double().T + ref.layer0.bias.double())
        h_cand = torch.relu(x.double() @ cand.layer0.weight.double().T + cand.layer0.bias.double())
        propagated = (cand(x) - ref(x)).abs().max().item()
    layer0_local = (
        (
            (x.double() @ ref.layer0.weight.double().T + ref.layer0.bias.double())
            - (x.double() @ cand.layer0.weight.double().T + cand.layer0.bias.double())
        )
        .abs()
        .max()
        .item()
    )
    assert set(result) == {("layer0", 0), ("layer1", 0), ("model", 0)}
    assert result[("layer0", 0)][0] == "mismatch"
    assert result[("layer0", 0)][1] == pytest.approx(layer0_local, abs=1e-6)
    assert layer0_local == pytest.approx(0.5, abs=1e-6)  # the bias offset, by hand
    assert result[("layer1", 0)] == ("equal", 0.0)  # local error 0 ...
    assert propagated > 0.0  # ... while the propagated error is not
    assert not torch.equal(h_ref, h_cand)
    assert result[("model", 0)][0] == "mismatch"
    assert result[("model", 0)][1] == pytest.approx(propagated, abs=1e-6)


def test_isolate_counts_repeated_calls_and_restores_hooks():
    class Twice(nn.Module):
        def __init__(self, offset):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.offset = offset

        def forward(self, x):
            return self.lin(self.lin(x)) + self.offset

    torch.manual_seed(1)
    ref, cand = Twice(0.0), Twice(1.0)
    cand.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3)
    with torch.no_grad():
        result = isolate(ref, cand, lambda: ref(x), ["lin", "model"], mode="allclose")
    assert result[("lin", 0)] == ("equal", 0.0)
    assert result[("lin", 1)] == ("equal", 0.0)
    assert result[("model", 0)][0] == "mismatch"
    assert result[("model", 0)][1] == pytest.approx(1.0, abs=1e-6)
    assert not ref.lin._forward_pre_hooks and not ref.lin._forward_hooks


def test_isolate_candidate_error_is_recorded_not_raised():
    class Boom(nn.Module):
        def forward(self, x):
            raise RuntimeError("not implemented in the engine")

    class Wrap(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    ref, cand = Wrap(nn.Identity()), Wrap(Boom())
    result = isolate(ref, cand, lambda: ref(torch.ones(2)), ["inner"], mode="equal")
    assert result == {("inner", 0): ("error", None)}


def test_isolate_unknown_module_names_the_close_matches():
    ref, cand = _chain_pair()
    with pytest.raises(InputError, match=r"layer2.*layer\d"):
        isolate(ref, cand, lambda: None, ["layer2"], mode="equal")


class _Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class _ForCausalLM(nn.Module):  # Hugging Face shape: the backbone is a child named "model"
    def __init__(self):
        super().__init__()
        self.model = _Backbone()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.model(x))


def test_isolate_on_a_model_with_a_child_named_model(tmp_path):
    """Regression (issue 12): the root is ``root`` there; isolate used to name it ``model``."""
    import copy

    from parity_tracker.run import run_parity

    torch.manual_seed(0)
    ref = _ForCausalLM()
    cand = copy.deepcopy(ref)
    with torch.no_grad():
        cand.head.weight[0, 0] += 1e-3
    result = run_parity(
        ref,
        cand,
        (torch.randn(3, 4),),
        isolate=True,
        dump_mode="not",
        dump_path=tmp_path / "d",
        environment={},
    )
    outputs = {r["module"]: r for r in result.modules.to_pylist() if r["kind"] == "output"}
    # the root and the head differ (the head's weight was nudged); the backbone does not
    assert outputs["root"]["status"] == "mismatch" and outputs["head"]["status"] == "mismatch"
    assert outputs["model"]["status"] == "equal"
    # each failing output row has its local verdict: the head is itself wrong, and so is the
    # root (re-run on the reference's input it still goes through the nudged head)
    assert outputs["head"]["local_status"] == "mismatch"
    assert outputs["root"]["local_status"] == "mismatch"
    assert outputs["model"]["local_status"] is None
