"""The per-site plan of a module call's leaves (issue 19, wave 11): the tags of a tuple input's
children and of a structured output's children are kept per call signature and call index, and
what each child is (tensor, ``None``, opaque leaf, nested structure) is tested at every call.

Every expected value is written out by hand (the tag grammar of design.md, "Public names"; the
shapes of the tensors each test makes, told apart by their sizes), never produced by the code
under test. The plan must never change what is recorded: the tests change the length, the type
and the children of a structured input or output between calls, a leaf's kind (an opaque
object that gains ``__dlpack__``), and the call index under one plan, and check that each value
lands under its own tag with its own shape or type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from parity_tracker.capture.leaves import (
    NonTensor,
    opaque_leaf,
    output_leaves,
    planned_output_leaves,
    planned_value_leaves,
    value_leaves,
)
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

A, B, C, X = torch.ones(2), torch.ones(3), torch.ones(5), torch.ones(7)


class Opaque:
    """A leaf no walk enters: a ``NonTensor`` named ``Opaque`` (unless it exposes DLPack)."""


@dataclass
class Out:
    x: Any
    y: Any = None


@dataclass
class OutYX:  # the same field names as Out, the other order
    y: Any
    x: Any


class Take(nn.Module):
    """Takes ``x`` and any keyword inputs; returns ``x.sum()``."""

    def forward(self, x, pe=None, cache=None, flag=None):
        return x.sum()


class Give(nn.Module):
    """Returns what it is handed (the structured outputs under test)."""

    def forward(self, x, out):
        return out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = Take()
        self.g = Give()

    def forward(self, x, calls):
        for kind, value in calls:
            if kind == "in":
                self.f(x, **value)
            else:
                self.g(x, value)
        return x.sum()


def _leaf(cap) -> tuple[int, ...] | str:
    return cap.meta[0] if cap.is_tensor else repr(cap.value)


def _tags(checker: TensorChecker, step: int, prefix: str) -> dict[str, tuple[int, ...] | str]:
    """Each tag of ``step`` starting with ``prefix``: its tensor's shape or its leaf's repr."""
    return {
        tag: _leaf(g.captures[0])
        for (tag, s), g in checker._log.groups.items()
        if s == step and tag.startswith(prefix)
    }


def _run(steps: list[list[tuple[str, Any]]]) -> TensorChecker:
    net = Net().eval()
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(net, checker), torch.no_grad():
        for step, calls in enumerate(steps):
            checker.step = step
            net(X, calls)
    return checker


def _kw(pe: Any, cache: Any = None, flag: Any = None) -> tuple[str, dict[str, Any]]:
    """One call of ``f`` with the same three keywords, in the same order (one signature)."""
    return ("in", {"pe": pe, "cache": cache, "flag": flag})


def test_tuple_inputs_changing_between_calls_land_under_their_own_tags():
    dl = Opaque()
    steps = [
        [_kw((A, B), Opaque(), True)],
        [_kw((A, B, C), Opaque())],  # one child more
        [_kw([B, A])],  # a list, the same length as step 0's tuple
        [_kw((A, (B, C)))],  # a nested child
        [_kw((A, None))],
        [_kw(A, C)],  # a tensor where a tuple / an opaque leaf was
        [_kw((A, B), dl)],  # back to step 0's plan
        [_kw((A, 2.5), Opaque())],  # a number child: a 0-d tensor
        [("in", {"pe": (C, A)})],  # another signature (one keyword), then step 0's again
        [_kw((B,), Opaque(), False)],
        [_kw((A, B)), _kw((C, A))],  # one signature, call index 0 and 1 in one step
    ]
    dl.__dlpack__ = B.__dlpack__  # the same type as step 0's opaque cache, now a DLPack
    dl.__dlpack_device__ = B.__dlpack_device__  # producer: its values are captured
    checker = _run(steps)
    p = "checker_f_input_"
    x = {p + "0": (7,), p + "cache": "None", p + "flag": "None"}
    opq = {p + "cache": "<Opaque>"}
    assert _tags(checker, 0, p) == {
        **x,
        **opq,
        p + "pe.0": (2,),
        p + "pe.1": (3,),
        p + "flag": (),
    }
    assert _tags(checker, 1, p) == {
        **x,
        **opq,
        p + "pe.0": (2,),
        p + "pe.1": (3,),
        p + "pe.2": (5,),
    }
    assert _tags(checker, 2, p) == {**x, p + "pe.0": (3,), p + "pe.1": (2,)}
    assert _tags(checker, 3, p) == {**x, p + "pe.0": (2,), p + "pe.1.0": (3,), p + "pe.1.1": (5,)}
    assert _tags(checker, 4, p) == {**x, p + "pe.0": (2,), p + "pe.1": "None"}
    assert _tags(checker, 5, p) == {**x, p + "pe": (2,), p + "cache": (5,)}
    assert _tags(checker, 6, p) == {**x, p + "pe.0": (2,), p + "pe.1": (3,), p + "cache": (3,)}
    assert _tags(checker, 7, p) == {**x, **opq, p + "pe.0": (2,), p + "pe.1": ()}
    assert _tags(checker, 8, p) == {p + "0": (7,), p + "pe.0": (5,), p + "pe.1": (2,)}
    assert _tags(checker, 9, p) == {**x, **opq, p + "pe.0": (3,), p + "flag": ()}
    p1 = "checker_f@1_input_"
    x1 = {p1 + "0": (7,), p1 + "cache": "None", p1 + "flag": "None"}
    assert _tags(checker, 10, "checker_f") == {
        **x,
        p + "pe.0": (2,),
        p + "pe.1": (3,),
        **x1,
        p1 + "pe.0": (5,),
        p1 + "pe.1": (2,),
        "checker_f": (),  # the outputs: x.sum()
        "checker_f@1": (),
    }
    pe1 = checker._log.groups[(p + "pe.1", 7)].captures[0]
    assert pe1.meta[1] == "float64"  # 2.5 as the float64 0-d tensor a Python float is
    slots = {g.slot for (tag, s), g in checker._log.groups.items() if s == 3 and tag.startswith(p)}
    assert slots == {"input.0", "input.pe.0", "input.pe.1.0", "input.pe.1.1"} | {
        "input.cache",
        "input.flag",
    }


def test_structured_outputs_changing_between_calls_land_under_their_own_tags():
    steps = [
        [("out", (A, B))],
        [("out", (A, B, C))],
        [("out", [A, None])],
        [("out", Out(A, B))],
        [("out", OutYX(A, B))],  # other field order: y is A, x is B
        [("out", Out(A, (B, C)))],
        [("out", Out(A, Opaque()))],
        [("out", A)],
        [("out", (A, B)), ("out", (C, A))],  # two calls of one step: call index 0 and 1
        [("out", Out(B, A)), ("out", Out(C, B))],
    ]
    checker = _run(steps)
    p, p1 = "checker_g_output_", "checker_g@1_output_"
    assert _outs(checker, 0) == {p + "0": (2,), p + "1": (3,)}
    assert _outs(checker, 1) == {p + "0": (2,), p + "1": (3,), p + "2": (5,)}
    assert _outs(checker, 2) == {p + "0": (2,), p + "1": "None"}
    assert _outs(checker, 3) == {p + "x": (2,), p + "y": (3,)}
    assert _outs(checker, 4) == {p + "y": (2,), p + "x": (3,)}
    assert _outs(checker, 5) == {
        p + "x": (2,),
        p + "y.0": (3,),
        p + "y.1": (5,),
    }
    assert _outs(checker, 6) == {p + "x": (2,), p + "y": "<Opaque>"}
    assert _outs(checker, 7) == {"checker_g": (2,)}
    assert _outs(checker, 8) == {
        p + "0": (2,),
        p + "1": (3,),
        p1 + "0": (5,),
        p1 + "1": (2,),
    }
    assert _outs(checker, 9) == {
        p + "x": (3,),
        p + "y": (2,),
        p1 + "x": (5,),
        p1 + "y": (3,),
    }
    slots = {g.slot for (tag, s), g in checker._log.groups.items() if tag.startswith(p1)}
    assert slots == {"output.0", "output.1", "output.x", "output.y"}
    order = [
        x.exec_order for (t, s), g in checker._log.groups.items() if s == 5 for x in g.captures
    ]
    assert order == sorted(order)  # recorded in walk order: x, y.0, y.1 after the inputs


def _outs(checker: TensorChecker, step: int) -> dict[str, tuple[int, ...] | str]:
    """``g``'s output tags of a step (its inputs, the structure handed in, left out)."""
    return {t: v for t, v in _tags(checker, step, "checker_g").items() if "_input_" not in t}


def _norm(leaves: list) -> list:
    return [(t, s, repr(v) if isinstance(v, NonTensor) else v) for t, s, v in leaves]


def test_planned_leaves_equal_the_walk_for_many_values():
    """The planned functions give what ``value_leaves`` / ``output_leaves`` give, value by value,
    with one plan carried through all of them (each value a change of the last one's shape)."""
    values = [
        (A, B),
        (A, B),
        [A, B],
        (A,),
        (A, (B, {"k": C})),
        Opaque(),
        {"a": A},
        Out(A, B),
        OutYX(A, None),
        Out(A, Out(B, C)),
        Out(A, [B, Opaque()]),
        3,
        2.5,
        None,
        A,
        "text",
        (None, None),
    ]
    plans: dict = {}
    plan = None
    for v in values:
        want: list = []
        value_leaves("m@1", "pe", "checker_m@1_input_pe", "input.pe", v, want)
        got: list = []
        if v is None or isinstance(v, torch.Tensor) or type(v) in (int, float):
            value_leaves("m@1", "pe", "checker_m@1_input_pe", "input.pe", v, got)
        else:
            planned_value_leaves(plans, "m@1", "pe", "checker_m@1_input_pe", "input.pe", v, got)
        assert _norm(got) == _norm(want), v
        leaves, plan = planned_output_leaves(plan, "m@1", v)
        assert _norm(leaves) == _norm(output_leaves("m@1", v)), v
    first: list = []
    planned_value_leaves({}, "m", "pe", "checker_m_input_pe", "input.pe", (A, (B, C)), first)
    assert [(t, s) for t, s, _ in first] == [
        ("checker_m_input_pe.0", "input.pe.0"),
        ("checker_m_input_pe.1.0", "input.pe.1.0"),
        ("checker_m_input_pe.1.1", "input.pe.1.1"),
    ]


def test_opaque_leaf_is_decided_per_object_not_per_type():
    o = Opaque()
    assert repr(opaque_leaf(o)) == "<Opaque>"
    o.__dlpack__ = A.__dlpack__  # an instance attribute: flatten takes it as tensor-like
    assert opaque_leaf(o) is None
    for v in (None, A, 1, 2.5, True, (A,), [A], {"a": A}, Out(A), Out):
        assert (opaque_leaf(v) is None) == (v is not Out), v
    assert repr(opaque_leaf(Out)) == "<type>"  # a dataclass class is no instance: a leaf
