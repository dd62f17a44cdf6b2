"""The capture record path of issue 19 (wave 7): shared ``meta`` tuples, names formatted once
per signature for every install, weights done per side, the root's unused-weights check.

Every expected value is written out by hand (the tag grammar of design.md, "Public names";
shapes and dtypes of tensors the test makes), never produced by the code under test. The
caches must never change what is recorded: these tests change shapes, dtypes, names and call
signatures between captures and rounds and check that each record follows.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from parity_tracker.capture.modules import Group, meta
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker


def test_meta_follows_a_tensor_changed_in_place():
    t = torch.zeros(2, 3)
    assert meta(t) == ((2, 3), "float32", "cpu")
    t.resize_(4, 5)  # the same object, another shape
    assert meta(t) == ((4, 5), "float32", "cpu")
    t.data = torch.zeros(6, dtype=torch.float64)  # the same object, another dtype
    assert meta(t) == ((6,), "float64", "cpu")
    assert type(meta(t)[0]) is tuple  # a plain tuple, never a torch.Size
    assert meta(torch.zeros((), dtype=torch.int8)) == ((), "int8", "cpu")


class Scaled(nn.Module):
    """``out = x * p.sum()``: the parameter's shape never constrains the input's."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.p.sum()


def test_a_parameter_replaced_between_rounds_is_recorded_with_its_new_shape():
    net = nn.Sequential(Scaled()).eval()
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(net, checker), torch.no_grad():
        net(torch.ones(2))
        first = checker._log.groups[("checker_0.p", 0)].captures[0].meta
        checker.clear()
        net[0].p.data = torch.ones(5, 2, dtype=torch.float64)
        net(torch.ones(2, dtype=torch.float64))
        second = checker._log.groups[("checker_0.p", 0)].captures[0].meta
    assert first == ((3,), "float32", "cpu")
    assert second == ((5, 2), "float64", "cpu")


def test_rows_are_ordered_outputs_then_inputs_then_weights_per_call():
    net = nn.Sequential(nn.Linear(2, 2)).eval()
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(net, checker), torch.no_grad():
        net(torch.ones(1, 2))
    # the child returns first: its output, its input, its weights; then the root's
    # output and input (results order = first registration order at each call's end)
    order = {tag: g.order for (tag, _), g in checker._log.groups.items()}
    assert order == {
        "checker_0": 0,
        "checker_0_input_0": 1,
        "checker_0.weight": 2,
        "checker_0.bias": 3,
        "checker_model": 4,
        "checker_model_input_0": 5,
    }
    created = {tag: g.created for (tag, _), g in checker._log.groups.items()}
    assert created == {
        "checker_model_input_0": 0,
        "checker_0_input_0": 1,
        "checker_0.weight": 2,
        "checker_0.bias": 3,
        "checker_0": 4,
        "checker_model": 5,
    }
    assert checker._log.exec == {0: 6}


class Pair(nn.Module):
    """Two children with the same call signature, one returning a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Identity()
        self.b = Split()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, z = self.b(self.a(x))
        return self.a(y + z)


class Split(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x * 2


def test_names_shared_across_installs_stay_per_module_and_call():
    seen = []
    for _ in range(2):  # the second install reads the shared name caches
        net = Pair().eval()
        checker = TensorChecker(verbose=False)
        with module_register_tensor_checker(net, checker), torch.no_grad():
            net(torch.ones(2))
        seen.append(
            {(tag, g.slot, g.module, g.call_index) for (tag, _), g in checker._log.groups.items()}
        )
    expected = {
        ("checker_model_input_0", "input.0", "model", 0),
        ("checker_model", "output", "model", 0),
        ("checker_a_input_0", "input.0", "a", 0),
        ("checker_a", "output", "a", 0),
        ("checker_b_input_0", "input.0", "b", 0),
        ("checker_b_output_0", "output.0", "b", 0),
        ("checker_b_output_1", "output.1", "b", 0),
        ("checker_a@1_input_0", "input.0", "a", 1),
        ("checker_a@1", "output", "a", 1),
    }
    assert seen == [expected, expected]


class Skips(nn.Module):
    """Calls ``b`` only when ``use_b``: its weights then come from the root's end."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        x = self.a(x)
        return self.b(x) if use_b else x


def test_weights_of_a_module_skipped_in_a_later_round_are_still_recorded():
    net = Skips().eval()
    checker = TensorChecker(verbose=False)
    rounds = []
    with module_register_tensor_checker(net, checker), torch.no_grad():
        for use_b in (True, False, False):
            net(torch.ones(1, 2), use_b)
            groups = checker._log.groups
            rounds.append({tag: (g.kind, g.module) for (tag, _), g in groups.items() if "." in tag})
            unused = [g.order for (tag, _), g in groups.items() if tag.startswith("checker_b.")]
            last = max(g.order for g in groups.values())
            rounds.append(sorted(unused) == [last - 1, last] if not use_b else None)
            checker.clear()
    weights = {
        "checker_a.weight": ("param", "a"),
        "checker_a.bias": ("param", "a"),
        "checker_b.weight": ("param", "b"),
        "checker_b.bias": ("param", "b"),
    }
    # b's weights, captured at the root's end when b is not called, come last
    assert rounds == [weights, None, weights, True, weights, True]


def test_two_sides_record_their_own_weights():
    ref, cand = nn.Linear(2, 2).eval(), nn.Linear(2, 2).eval()
    checker = TensorChecker(verbose=False)
    with (
        module_register_tensor_checker(ref, checker, side=0),
        module_register_tensor_checker(cand, checker, side=1),
        torch.no_grad(),
    ):
        ref(torch.ones(1, 2))
        cand(torch.ones(1, 2))
        cand(torch.ones(1, 2))  # the same step again: weights not captured twice
    weight = checker._log.groups[("checker_weight", 0)]
    assert [c.side for c in weight.captures] == [0, 1]
    assert checker._log.weights_done == {0: {"weight", "bias"}, 1: {"weight", "bias"}}


def test_group_compares_field_by_field_and_is_unhashable():
    def make(order):
        return Group("checker_x", 0, "output", "x", "output", 0, 3, order)

    assert make(None) == make(None)
    assert make(None) != make(1)
    assert make(None).captures == [] and make(None).pairs == {}
    assert make(None).captures is not make(None).captures  # never shared between groups
    with pytest.raises(TypeError):
        hash(make(None))
