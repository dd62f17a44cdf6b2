"""Adversarial tests of the wave-11 per-site leaf plans (``capture.leaves.planned_value_leaves``,
``planned_output_leaves``, kept in ``ModuleSite.sig`` / ``ModuleSite.out_plan``, issue 19).

Each scenario changes, between calls of one module, what the plan keys on and what it does not:
the positional count, keyword names and order, a value replaced by ``None`` / a list / a tuple /
a dict / a dataclass / a namedtuple / a tuple subclass / a ``ModelOutput``, a tuple growing or
shrinking, nested structures, a leaf's kind (tensor, int, bool, float, big int, numpy scalar,
opaque cache-like object, an object exposing DLPack, a mapping registered at run time), the same
tensor passed twice, one module called several times a step with other signatures, recursion,
and the user's own hooks rewriting args and outputs. Candidates differ at chosen leaves.

Truth: (1) every run is compared row for row, column for column, with the same run through the
generic walk (``value_leaves`` / ``output_leaves``, main's path, patched in for the planned
functions); (2) the hand-worked cases assert tags, statuses and mismatch counts written out by
hand or computed with numpy from private copies, never by the code under test.
"""

from __future__ import annotations

import ctypes
import math
from collections import OrderedDict, namedtuple
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import parity_tracker.capture.modules as capture_modules
from parity_tracker.capture.leaves import output_leaves, value_leaves
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker


# ----------------------------------------------------------------------------- structures
@dataclass
class DC:
    x: Any
    y: Any = None


@dataclass
class DC2:  # DC's field names, the other order
    y: Any
    x: Any = None


NT = namedtuple("NT", "a b")


class TupSub(tuple):
    __slots__ = ()


class Opaque:
    pass


class Cache:  # a DynamicCache-like opaque input
    def __init__(self, ks: list) -> None:
        self.ks = ks


class DL:
    """An object exposing DLPack (a tensor-like leaf; its values are compared)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __dlpack__(self, *a, **k):
        return self.t.__dlpack__(*a, **k)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def _map_class() -> type:
    """A fresh mapping-like class, not a ``Mapping`` until registered."""

    class MyMap:
        def __init__(self, d: dict) -> None:
            self.d = d

        def __getitem__(self, k):
            return self.d[k]

        def __iter__(self):
            return iter(self.d)

        def __len__(self) -> int:
            return len(self.d)

        def items(self):
            return self.d.items()

    return MyMap


# ----------------------------------------------------------------------------- the model
ARG0 = "arg0"
BETWEEN = "!"


class Echo(nn.Module):
    """Returns its next queued output: a value, ``ARG0`` (its first input) or ``f(args, kw)``."""

    def __init__(self) -> None:
        super().__init__()
        self.q: list = []
        self.lin = nn.Linear(3, 3)

    def forward(self, *args, **kwargs):
        r = self.q.pop(0)
        if isinstance(r, str) and r == ARG0:
            return args[0]
        if callable(r) and not isinstance(r, type):
            return r(self, args, kwargs)
        return r


class Net(nn.Module):
    """Plays one step: ``calls`` is a list of ``(submodule, args, kwargs, output)``."""

    def __init__(self) -> None:
        super().__init__()
        self.f = Echo()
        self.g = Echo()
        self.h = nn.Sequential(Echo(), Echo())

    def forward(self, calls):
        for mod, args, kwargs, ret in calls:
            if mod == BETWEEN:  # the parent's own code between two calls
                ret()
                continue
            m = self.get_submodule(mod)
            if isinstance(m, nn.Sequential):
                m[0].q.append(ret)
                m[1].q.append(ARG0)
            else:
                m.q.append(ret)
            m(*args, **kwargs)
        return torch.zeros(1)


def _hooked_net() -> Net:
    """A Net whose ``f`` carries the user's own hooks that rewrite its args and its output."""
    net = Net()

    def pre(m, args, kwargs):
        if args and isinstance(args[0], torch.Tensor) and args[0].numel() == 2:
            args = (*args, args[0] * 2)
        if "x" in kwargs:
            kwargs = {"xx": kwargs.pop("x"), **kwargs}
        return args, kwargs

    def post(m, args, out):
        if isinstance(out, tuple) and len(out) == 2:
            return (*out, out[0])
        return None

    net.f.register_forward_pre_hook(pre, with_kwargs=True)
    net.f.register_forward_hook(post)
    return net


def T(n: int, side: int = 0, bump: bool = False) -> torch.Tensor:
    """``[1 … n]`` float32; with ``bump`` the candidate's (side 1) last element is one more."""
    t = torch.arange(n, dtype=torch.float32) + 1
    if bump and side == 1:
        t[-1] += 1
    return t


# ----------------------------------------------------------------------------- scenarios
def positional_count(s):
    a, b, c = T(2), T(3), T(5, s, True)
    return [[("f", v, {}, ARG0)] for v in ((a,), (a, b), (a, b, c), (a,), (c, b), (a,))]


def kw_names_order(s):
    a, b, c = T(2), T(3), T(5, s, True)
    return [
        [("f", (a,), {"x": b, "y": c}, a)],
        [("f", (a,), {"y": c, "x": b}, a)],
        [("f", (a,), {"z": c}, a)],
        [("f", (), {"x": b, "y": c}, a)],
        [("f", (a,), {"x": b, "y": c}, a)],
    ]


def _structs(a, b, c):
    return [
        a,
        None,
        [a, c],
        (a, c),
        {"k": c, "j": a},
        DC(a, c),
        NT(a, c),
        TupSub((a, c)),
        (a, c, b),
        (a,),
        (),
        [],
        (a, (b, c)),
        ((a, c),),
        (a, [c, (b,)]),
        torch.Size([2, 3]),
        (a, DL(c)),
        (a, None),
        a,
    ]


def tensor_to_structs(s):
    a, b, c = T(2), T(3), T(5, s, True)
    vals = _structs(a, b, c)
    return [[("f", (b,), {"v": v}, v)] for v in vals] + [[("f", (v,), {}, v)] for v in vals]


def tuple_grow_shrink(s):
    a, b, c = T(2), T(3), T(5, s, True)
    seq = [(a, b), (a, b, c), (a, b), (a,), (c, b, a), [a, b], (a, b), [a, b, c], (a, b)]
    return [[("f", (v,), {"pe": v}, v)] for v in seq]


def leaf_kind_change(s):
    a, c = T(2), T(5, s, True)
    cache = Cache([a])
    vals = [
        a,
        3,
        True,
        2.5,
        cache,
        Opaque(),
        DL(c),
        "txt",
        np.float32(2.0),
        np.arange(3) + s,
        1 << 70,
        c,
        3 if s == 0 else 4,
        s == 0,
        (3, True, cache),
        (cache, a),
        (1 << 70, DL(c), np.int8(3 + s)),
        a,
    ]
    return [[("f", (a,), {"cache": v, "flag": v}, (a, v)), ("f", (v, a), {}, [v, a])] for v in vals]


def dicts(s):
    a, c = T(2), T(5, s, True)
    vals = [
        {"a": a},
        {"a": a, "b": c},
        {"b": c, "a": a},
        OrderedDict(x=c),
        {"a": {"b": (c, None)}},
        {"a": a},
    ]
    return [[("f", (v,), {"d": v}, v)] for v in vals]


def dataclass_outputs(s):
    a, b, c = T(2), T(3), T(5, s, True)
    vals = [
        DC(a, c),
        DC(a, None),
        DC(c, a),
        DC2(a, c),
        DC(a, (b, c)),
        DC(a, Opaque()),
        DC(a, Cache([c])),
        DC(a, DC(c, b)),
        DC(a, {"k": c}),
        DC(a, 3),
        DC(a, DL(c)),
        (a, c),
        DC(a, c),
        DC(None, None),
    ]
    return [[("g", (a,), {}, v)] for v in vals]


def output_varies(s):
    a, b, c = T(2), T(3), T(5, s, True)
    vals = [
        (a, b),
        (a, b, c),
        [a, b],
        (a, None),
        (None, None),
        (a, (b, c)),
        (a, DC(b, c)),
        TupSub((a, c)),
        NT(a, c),
        (a, 3),
        (a, Opaque()),
        (a, Cache([c])),
        a,
        3,
        None,
        {"a": c},
        (a, DL(c)),
        (a, b),
        torch.return_types.max((a, c)),
        ((), []),
        (a, b),
    ]
    return [[("g", (a,), {}, v)] for v in vals]


def same_tensor_twice(s):
    a, c = T(2), T(5, s, True)
    return [
        [("f", (a, a), {"k": a}, (a, a))],
        [("f", ((a, a), a), {"k": (c, c)}, (c, c, a))],
        [("f", ((c, c),), {}, DC(c, c))],
        [("f", (c,), {}, c), ("g", (c,), {}, c), ("h.0", (c,), {}, c)],
    ]


def several_calls_per_step(s):
    a, b, c = T(2), T(3), T(5, s, True)
    return [
        [
            ("f", (a,), {}, a),
            ("f", (a, b), {}, (a, b)),
            ("f", (), {"x": (a, c)}, DC(a, c)),
            ("f", ((a, b),), {}, [a, c]),
        ],
        [("f", ((a, b, c),), {}, (a,)), ("f", (a,), {}, (a, b, c)), ("f", ((a,),), {}, DC(c))],
        [("f", ((a, b),), {}, [a, c]), ("f", (a,), {}, a)],
        [
            ("f", (a,), {}, (a, b)),
            ("f", (a, b), {}, (c,)),
            ("f", (a,), {}, a),
            ("f", (), {"x": (a, c)}, DC(a, c)),
        ],
    ]


def nested_seq(s):
    a, b, c = T(2), T(3), T(5, s, True)
    return [
        [("h", ((a, b),), {}, (a, c))],
        [("h.0", ((a, c),), {}, (a,)), ("h.1", ((a, c, b),), {}, DC(a, c))],
        [("h", ((a, b),), {}, DC(a, c))],
    ]


def recursion(s):
    """``f`` calls itself from inside its forward (call index 1 ends before call index 0)."""
    a, b, c = T(2), T(3), T(5, s, True)

    def inner(m, args, kwargs):
        m.q.append(DC(c, args[0]))
        m((args[0], b), k=(c,))
        return (args[0], c)

    return [
        [("f", (a,), {}, inner)],
        [("f", (a,), {"z": 1}, inner), ("f", (a,), {}, (a,))],
        [("f", (a,), {}, inner)],
    ]


def int_values_differ(s):
    a = T(2)
    return [
        [("f", (a,), {"n": 3, "t": (1, 2)}, (a, 3))],
        [("f", (a,), {"n": 3 + s, "t": (1, 2 + s)}, (a, 3 + s))],
        [("f", (a,), {"n": 2.5 + s, "t": (1.0, s == 0)}, DC(a, 2.5 + s))],
        [("f", (a,), {"n": 3, "t": (1, 2)}, (a, 3))],
    ]


def runtime_mapping(s):
    """A mapping class registered with ``Mapping`` between two calls: opaque, then walked."""
    a, c = T(2), T(5, s, True)
    cls = _map_class()

    def register(m, args, kwargs):
        Mapping.register(cls)
        return a

    return [
        [("f", (a,), {"m": cls({"p": c})}, (a, cls({"q": c})))],
        [("g", (a,), {}, register)],
        [("f", (a,), {"m": cls({"p": c})}, (a, cls({"q": c})))],
    ]


def raw_write(s):
    """The reference's tensors are written through numpy between two captures of one object."""

    def write(m, args, kwargs):
        if s == 0:
            args[0].numpy()[0] = 99.0
        return args[0]

    def write_child(m, args, kwargs):
        if s == 0:
            args[0][0].numpy()[1] = 77.0
        return args[0]

    (a0, a1, a2), b = (T(4) for _ in range(3)), T(3)
    t1, t2 = (a1, b), (b, a2)
    return [
        [("f", (a0,), {}, ARG0), ("g", (a0,), {}, write), ("f", (a0,), {}, ARG0)],
        [("f", (t1,), {}, t1), ("g", (t1,), {}, write_child), ("f", (t1,), {}, t1)],
        [
            ("f", (a2,), {"k": t2}, DC(a2, b)),
            ("g", ((a2, b),), {}, write_child),
            ("f", (a2,), {"k": t2}, DC(a2, b)),
        ],
    ]


class Boom(ValueError):
    pass


def raises(s):
    """The candidate's ``f`` raises in its second call of step 1 (its pre-hook ran, not its
    forward hook); the reference's returns; the run stops there on the candidate's side."""
    a, b, c = T(2), T(3), T(5, s, True)

    def boom(m, args, kwargs):
        if s == 1:
            raise Boom("the candidate fails")
        return (a, c)

    return [
        [("f", ((a, b),), {}, (a, c)), ("g", (a,), {}, DC(a, c))],
        [("f", ((a, b),), {}, (a, c)), ("f", ((a, b, c),), {}, boom)],
        [("f", ((a, b),), {}, (a, c)), ("g", (a,), {}, iter(()))],
    ]


def side_kinds(s):
    """The reference and the candidate pass leaves of other kinds at the same tags."""
    a, b = T(2), T(3)
    ref = [a, (a, b), DC(a, b), 3, Cache([a]), DL(b), (a,), {"k": a}, None, a]
    cand = [Cache([a]), (a,), (a, b), a, 3.5, b, DC(a), [a, b], a, DL(a)]
    vals = ref if s == 0 else cand
    return [[("f", (v,), {"kw": v}, (v, a)), ("g", (a,), {}, v)] for v in vals]


SCENARIOS = {
    f.__name__: f
    for f in (
        raises,
        side_kinds,
        positional_count,
        kw_names_order,
        tensor_to_structs,
        tuple_grow_shrink,
        leaf_kind_change,
        dicts,
        dataclass_outputs,
        output_varies,
        same_tensor_twice,
        several_calls_per_step,
        nested_seq,
        recursion,
        int_values_differ,
        runtime_mapping,
        raw_write,
    )
}
HOOKED = ("positional_count", "kw_names_order", "tuple_grow_shrink", "several_calls_per_step")


# ----------------------------------------------------------------------------- the runs
def _generic_in(plans, base, name, tag, slot, value, out):
    value_leaves(base, name, tag, slot, value, out)


def _generic_out(plan, base, output):
    return output_leaves(base, output), None


@pytest.fixture
def generic(monkeypatch):
    """A callable that runs ``f()`` with the capture's planned functions replaced by the walk."""

    def run(f):
        with monkeypatch.context() as m:
            m.setattr(capture_modules, "planned_value_leaves", _generic_in)
            m.setattr(capture_modules, "planned_output_leaves", _generic_out)
            return f()

    return run


def _pair(hooked: bool) -> tuple[Net, Net]:
    torch.manual_seed(0)
    ref = _hooked_net() if hooked else Net()
    cand = _hooked_net() if hooked else Net()
    cand.load_state_dict(ref.state_dict())
    return ref, cand


def _via_run(name: str, hooked: bool) -> list[dict]:
    make = SCENARIOS[name]

    def drive(model, rec):
        for k, calls in enumerate(make(rec.side)):
            rec(k)
            model(calls)

    ref, cand = _pair(hooked)
    result = run_parity(
        ref, cand, drive=drive, mode="equal", dump_mode=DumpMode.NOT, settings={"target": "x"}
    )
    return result.modules.drop_columns(["run_id"]).to_pylist()


def _via_checker(name: str, hooked: bool) -> list[dict]:
    ref, cand = _pair(hooked)
    checker = TensorChecker(verbose=False)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        for side, model in ((0, ref), (1, cand)):
            try:
                for k, calls in enumerate(SCENARIOS[name](side)):
                    checker.step = k
                    model(calls)
            except Boom:
                assert name == "raises"
    return checker.check("equal").to_rows()


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y


def _assert_same_rows(got: list[dict], want: list[dict]) -> None:
    assert [(r["tag"], r["step"]) for r in got] == [(r["tag"], r["step"]) for r in want]
    for g, w in zip(got, want, strict=True):
        bad = {c: (g[c], w[c]) for c in w if c != "run_id" and not _same(g[c], w[c])}
        assert not bad, (w["tag"], w["step"], bad)


_CASES = [(n, False) for n in SCENARIOS] + [(n, True) for n in HOOKED]
_IDS = [n + ("-user_hooks" if h else "") for n, h in _CASES]


@pytest.mark.parametrize(("name", "hooked"), _CASES, ids=_IDS)
def test_run_parity_rows_equal_the_generic_walk(name, hooked, generic):
    want = generic(lambda: _via_run(name, hooked))
    got = _via_run(name, hooked)
    assert got, name
    _assert_same_rows(got, want)


@pytest.mark.parametrize(("name", "hooked"), _CASES, ids=_IDS)
def test_seed_facade_rows_equal_the_generic_walk(name, hooked, generic):
    want = generic(lambda: _via_checker(name, hooked))
    got = _via_checker(name, hooked)
    assert got, name
    _assert_same_rows(got, want)


# ----------------------------------------------------------------------------- hand-worked
def _by_tag(rows: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["tag"], r["step"]): r for r in rows}


def _mismatches(ref: np.ndarray, cand: np.ndarray) -> int:
    return int(np.count_nonzero(ref != cand))


def test_raw_write_between_two_captures_reads_as_a_mismatch_at_its_tag():
    rows = _by_tag(_via_run("raw_write", False))
    a, b = np.arange(1, 5, dtype=np.float32), np.arange(1, 4, dtype=np.float32)
    a99 = a.copy()
    a99[0] = 99.0
    a77 = a.copy()
    a77[1] = 77.0
    # (tag, step): (reference's values at the capture, candidate's)
    want = {
        ("checker_f_input_0", 0): (a, a),
        ("checker_f", 0): (a, a),
        ("checker_g_input_0", 0): (a, a),
        ("checker_g", 0): (a99, a),  # g returns its input after the write
        ("checker_f@1_input_0", 0): (a99, a),
        ("checker_f@1", 0): (a99, a),
        ("checker_f_input_0.0", 1): (a, a),
        ("checker_f_input_0.1", 1): (b, b),
        ("checker_f_output_0", 1): (a, a),
        ("checker_g_input_0.0", 1): (a, a),
        ("checker_g_output_0", 1): (a77, a),
        ("checker_g_output_1", 1): (b, b),
        ("checker_f@1_input_0.0", 1): (a77, a),
        ("checker_f@1_input_0.1", 1): (b, b),
        ("checker_f@1_output_0", 1): (a77, a),
        ("checker_f@1_output_1", 1): (b, b),
        ("checker_f_input_0", 2): (a, a),
        ("checker_f_input_k.1", 2): (a, a),
        ("checker_f_output_x", 2): (a, a),
        ("checker_f@1_input_0", 2): (a77, a),
        ("checker_f@1_input_k.0", 2): (b, b),
        ("checker_f@1_input_k.1", 2): (a77, a),
        ("checker_f@1_output_x", 2): (a77, a),
        ("checker_f@1_output_y", 2): (b, b),
    }
    for key, (ref, cand) in want.items():
        row = rows[key]
        n = _mismatches(ref, cand)
        assert (row["status"], row["mismatch_count"]) == (("mismatch", n) if n else ("equal", 0))
        assert row["max_abs_diff"] == float(np.abs(ref - cand).max()), key


def test_a_differing_child_shows_its_mismatch_at_its_own_tag_as_the_tuple_changes():
    rows = _by_tag(_via_run("tuple_grow_shrink", False))
    # seq: (a,b) (a,b,c) (a,b) (a,) (c,b,a) [a,b] (a,b) [a,b,c] (a,b); c's last element differs
    bad = {k for k, r in rows.items() if r["status"] == "mismatch" and k[0].startswith("checker_f")}
    want = set()
    for step, where in ((1, "2"), (4, "0"), (7, "2")):
        for tag in ("checker_f_input_0.", "checker_f_input_pe.", "checker_f_output_"):
            want.add((tag + where, step))
    assert bad == want
    for key in want:
        assert (rows[key]["mismatch_count"], rows[key]["max_abs_diff"]) == (1, 1.0)
        assert rows[key]["ref_shape"] == [5]


def test_a_mapping_registered_at_run_time_is_walked_from_its_next_call_on():
    rows = _by_tag(_via_run("runtime_mapping", False))
    assert rows[("checker_f_input_m", 0)]["status"] == "skipped"  # opaque: named, not compared
    assert rows[("checker_f_output_1", 0)]["status"] == "skipped"
    assert ("checker_f_input_m.p", 0) not in rows
    for tag in ("checker_f_input_m.p", "checker_f_output_1.q"):
        row = rows[(tag, 2)]
        assert (row["status"], row["mismatch_count"], row["ref_shape"]) == ("mismatch", 1, [5])
    assert ("checker_f_input_m", 2) not in rows
    assert ("checker_f_output_1", 2) not in rows


def test_a_call_that_raises_keeps_its_inputs_and_misses_its_outputs():
    rows = _by_tag(_via_run("raises", False))
    got = {(t, s): r["status"] for (t, s), r in rows.items() if t.startswith("checker_f") and s}
    assert got == {
        ("checker_f_input_0.0", 1): "equal",
        ("checker_f_input_0.1", 1): "equal",
        ("checker_f_output_0", 1): "equal",
        ("checker_f_output_1", 1): "mismatch",  # c
        ("checker_f@1_input_0.0", 1): "equal",
        ("checker_f@1_input_0.1", 1): "equal",
        ("checker_f@1_input_0.2", 1): "mismatch",  # c, captured before the candidate raised
        ("checker_f@1_output_0", 1): "missing_candidate",
        ("checker_f@1_output_1", 1): "missing_candidate",
        ("checker_f_input_0.0", 2): "missing_candidate",
        ("checker_f_input_0.1", 2): "missing_candidate",
        ("checker_f_output_0", 2): "missing_candidate",
        ("checker_f_output_1", 2): "missing_candidate",
    }


def test_recursion_tags_each_call_by_its_own_index():
    rows = _by_tag(_via_run("recursion", False))
    # step 0: outer call 0 takes (a); inner call 1 takes ((a, b), k=(c,)) and returns DC(c, a)
    want_mismatch = {
        ("checker_f@1_input_k.0", 0),
        ("checker_f@1_output_x", 0),
        ("checker_f_output_1", 0),
    }
    want_equal = {
        ("checker_f_input_0", 0),
        ("checker_f@1_input_0.0", 0),
        ("checker_f@1_input_0.1", 0),
        ("checker_f@1_output_y", 0),
        ("checker_f_output_0", 0),
        ("checker_f.lin.weight", 0),
        ("checker_f.lin.bias", 0),
    }
    step0 = {k: r["status"] for k, r in rows.items() if k[1] == 0 and k[0].startswith("checker_f")}
    assert {k for k, v in step0.items() if v == "mismatch"} == want_mismatch
    assert {k for k, v in step0.items() if v == "equal"} == want_equal


def _model_outputs(s):
    from transformers import DynamicCache
    from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

    @dataclass
    class Sub(CausalLMOutputWithPast):  # a subclass of a ModelOutput, one field more
        extra: Any = None

    a, b, c = T(2), T(3), T(5, s, True)
    dc = DynamicCache()
    vals = [
        CausalLMOutputWithPast(logits=c),
        CausalLMOutputWithPast(logits=c, loss=a),
        CausalLMOutputWithPast(logits=c, past_key_values=dc),
        CausalLMOutputWithPast(logits=a, hidden_states=(b, c)),
        BaseModelOutputWithPast(last_hidden_state=c),
        Sub(logits=c, extra=a),
        Sub(logits=c),
        CausalLMOutputWithPast(logits=c, attentions=(a, (b, c))),
        (a, c),
        CausalLMOutputWithPast(logits=c),
    ]
    return [[("g", (a,), {"past_key_values": dc, "mo": v}, v)] for v in vals]


@pytest.mark.slow
@pytest.mark.parametrize("via", ["run_parity", "checker"])
def test_model_outputs_equal_the_generic_walk(via, generic):
    pytest.importorskip("transformers")
    from transformers.modeling_outputs import CausalLMOutputWithPast

    SCENARIOS["model_outputs"] = _model_outputs
    try:
        call = _via_run if via == "run_parity" else _via_checker
        want = generic(lambda: call("model_outputs", False))
        got = call("model_outputs", False)
    finally:
        del SCENARIOS["model_outputs"]
    _assert_same_rows(got, want)
    rows = _by_tag(got)
    row = rows[("checker_g_output_logits", 0)]
    assert (row["status"], row["mismatch_count"]) == ("mismatch", 1)
    cache = (
        "past_key_values"
        if "past_key_values" in CausalLMOutputWithPast.__dataclass_fields__
        else "cache"
    )
    assert rows[(f"checker_g_output_{cache}", 2)]["status"] == "skipped"  # a DynamicCache
    assert rows[("checker_g_output_extra", 5)]["status"] == "equal"
    outs = {t for t, s in rows if s == 6 and t.startswith("checker_g_output")}
    assert outs == {"checker_g_output_logits"}  # None on both sides: no row


def _write(t: torch.Tensor, kind: str) -> None:
    """Add 10 to ``t[0]`` (a float32 ``[1 … 4]``) in one of the ways a shortcut could miss."""
    if kind == "numpy":  # a raw view: no version bump
        t.numpy()[0] += 10
    elif kind == "data":  # .data: its own version counter
        t.data[0] += 10
    elif kind == "ctypes":  # a raw pointer
        ctypes.c_float.from_address(t.data_ptr()).value += 10
    elif kind == "set_":  # other storage under the same object
        new = t.clone()
        new[0] += 10
        t.set_(new)
    elif kind == "inplace":
        t[0] += 10
    else:
        raise AssertionError(kind)


_WRITES = ["numpy", "data", "ctypes", "set_", "inplace"]


@pytest.mark.parametrize("who", [0, 1], ids=["ref_writes", "cand_writes"])
@pytest.mark.parametrize("kind", _WRITES)
def test_a_write_inside_a_module_between_two_captures_is_seen(kind, who):
    def make(s):
        def write(m, args, kwargs):
            if s == who:
                _write(args[0], kind)
            return args[0]

        def write_child(m, args, kwargs):
            if s == who:
                _write(args[0][0], kind)
            return args[0]

        a0, a1, b = T(4), T(4), T(3)
        t1 = (a1, b)
        return [
            [("f", (a0,), {}, ARG0), ("g", (a0,), {}, write), ("f", (a0,), {}, ARG0)],
            [("f", (t1,), {}, t1), ("g", (t1,), {}, write_child), ("f", (t1,), {}, t1)],
        ]

    SCENARIOS["writes"] = make
    try:
        rows = _by_tag(_via_run("writes", False))
    finally:
        del SCENARIOS["writes"]
    changed = {
        ("checker_g", 0),
        ("checker_f@1_input_0", 0),
        ("checker_f@1", 0),
        ("checker_g_output_0", 1),
        ("checker_f@1_input_0.0", 1),
        ("checker_f@1_output_0", 1),
    }
    same = {
        ("checker_f_input_0", 0),
        ("checker_f", 0),
        ("checker_g_input_0", 0),
        ("checker_f_input_0.0", 1),
        ("checker_f_input_0.1", 1),
        ("checker_f_output_0", 1),
        ("checker_f_output_1", 1),
        ("checker_g_input_0.0", 1),
        ("checker_g_input_0.1", 1),
        ("checker_g_output_1", 1),
        ("checker_f@1_input_0.1", 1),
        ("checker_f@1_output_1", 1),
    }
    for key in changed:
        row = rows[key]
        assert (row["status"], row["mismatch_count"], row["max_abs_diff"]) == ("mismatch", 1, 10.0)
    for key in same:
        assert rows[key]["status"] == "equal", key


@pytest.mark.parametrize("who", [0, 1], ids=["ref_writes", "cand_writes"])
@pytest.mark.parametrize("kind", _WRITES)
def test_a_write_between_two_modules_is_seen_at_the_second_capture(kind, who):
    """The object one module returned, written by the parent, then handed to the next module
    (or to the same one again) under another tag: the second capture holds the new values."""

    def make(s):
        a0, a1, a2, b = T(4), T(4), T(4), T(3)

        def w(t):
            return (BETWEEN, (), {}, lambda: _write(t, kind) if s == who else None)

        t1 = (a1, b)
        return [
            [("f", (a0,), {}, ARG0), w(a0), ("g", (a0,), {}, ARG0)],
            [("f", (t1,), {}, t1), w(a1), ("g", (t1,), {"k": a1}, t1)],
            [("f", (), {"x": a2}, DC(a2, b)), w(a2), ("f", (), {"x": a2}, DC(a2, b))],
        ]

    SCENARIOS["between"] = make
    try:
        rows = _by_tag(_via_run("between", False))
    finally:
        del SCENARIOS["between"]
    changed = {
        ("checker_g_input_0", 0),
        ("checker_g", 0),
        ("checker_g_input_0.0", 1),
        ("checker_g_input_k", 1),
        ("checker_g_output_0", 1),
        ("checker_f@1_input_x", 2),
        ("checker_f@1_output_x", 2),
    }
    same = {
        ("checker_f_input_0", 0),
        ("checker_f", 0),
        ("checker_f_input_0.0", 1),
        ("checker_f_output_0", 1),
        ("checker_g_input_0.1", 1),
        ("checker_g_output_1", 1),
        ("checker_f_input_x", 2),
        ("checker_f_output_x", 2),
        ("checker_f@1_output_y", 2),
    }
    for key in changed:
        row = rows[key]
        assert (row["status"], row["mismatch_count"], row["max_abs_diff"]) == ("mismatch", 1, 10.0)
    for key in same:
        assert rows[key]["status"] == "equal", key


# ----------------------------------------------------------------------------- llama-tiny
def _llama_drives():
    from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList

    from pipelines.targets import _llama_tiny as llama

    p = llama.PROMPT_LEN
    ids = llama.token_ids(length=p + 12)

    def mixed(model, rec):
        cache = DynamicCache(config=model.config)
        rec(0)
        model(input_ids=ids[:, :p], cache=cache, use_cache=True)
        rec(1)
        model(input_ids=ids[:, p : p + 1], cache=cache, use_cache=True, return_dict=False)
        rec(2)
        model(ids[:, : p + 2], use_cache=False, output_hidden_states=True)
        rec(3)
        model(input_ids=ids[:, p + 1 : p + 2], use_cache=True, cache=cache, output_attentions=True)
        rec(4)
        mask = torch.ones(1, p + 3, dtype=torch.long)
        model(
            attention_mask=mask,
            input_ids=ids[:, p + 2 : p + 3],
            cache=cache,
            use_cache=True,
            position_ids=torch.tensor([[p + 2]]),
        )
        rec(5)
        model(input_ids=ids[:, :4])

    class Steps(LogitsProcessor):
        def __init__(self, rec) -> None:
            self.rec, self.k = rec, 0

        def __call__(self, input_ids, scores):
            self.k += 1
            self.rec(self.k)
            return scores

    def generate(model, rec):
        rec(0)
        procs = LogitsProcessorList([Steps(rec)])
        model.generate(
            ids[:, :p], max_new_tokens=4, do_sample=False, logits_processor=procs, pad_token_id=0
        )

    def cache_differs(model, rec):
        cache = DynamicCache(config=model.config)
        rec(0)
        model(input_ids=ids[:, :p], cache=cache, use_cache=True)
        if rec.side == 1:  # the candidate's cache, written through numpy (no version bump)
            cache.layers[0].keys.numpy()[0, 0, 3, 0] += 1.0
        for k in range(1, 3):
            rec(k)
            model(input_ids=ids[:, p + k - 1 : p + k], cache=cache, use_cache=True)

    return llama, {
        "kv": llama.kv_drive(ids, p, 4),
        "mixed": mixed,
        "generate": generate,
        "cache_differs": cache_differs,
    }


@pytest.mark.slow
@pytest.mark.parametrize("perturb", [False, True], ids=["same", "perturbed"])
@pytest.mark.parametrize("drive", ["kv", "mixed", "generate", "cache_differs"])
def test_llama_tiny_loops_equal_the_generic_walk(drive, perturb, generic):
    pytest.importorskip("transformers")
    llama, drives = _llama_drives()

    def run():
        ref, cand = llama.make_model(), llama.make_model()
        if perturb:  # one weight element of the candidate 0.5 larger
            with torch.no_grad():
                cand.model.layers[1].mlp.down_proj.weight[0, 0] += 0.5
        result = run_parity(
            ref,
            cand,
            drive=drives[drive],
            mode="equal",
            dump_mode=DumpMode.NOT,
            settings={"target": "x"},
        )
        return result.modules.drop_columns(["run_id"]).to_pylist()

    want = generic(run)
    got = run()
    _assert_same_rows(got, want)
    rows = _by_tag(got)
    w = rows[("checker_model.layers.1.mlp.down_proj.weight", 0)]
    assert (w["status"], w["mismatch_count"]) == (("mismatch", 1) if perturb else ("equal", 0))
    if drive == "cache_differs":  # the written key reaches layer 0's attention at step 1
        assert rows[("checker_model.layers.0.self_attn.o_proj", 1)]["status"] == "mismatch"
