"""Issue 19, budget wave 5: ``capture.copies.structural_copy`` builds what ``copy.deepcopy`` builds.

The golden and twin copies (``cast_copy``) now copy the module tree with ``structural_copy``
(``deepcopy``'s own steps for a module, taken directly). Checked against ``copy.deepcopy`` of
the same module with the same memo, walking both object graphs side by side: the same types,
the same ``__dict__`` keys and values, the same tensors (dtype, bytes, requires_grad), the
same sharing (an object reached twice is one object in both copies, a cycle stays a cycle)
and the same objects left shared with the original (functions) — on modules with tied
weights, cycles, hooks, list/dict/tensor attributes, a custom ``__setstate__``, RNNs (their
``_flat_weights`` list), and classes with their own copy rule (handed to ``deepcopy``).
"""

from __future__ import annotations

import copy
import copyreg
import weakref
from collections import OrderedDict

import pytest
import torch
from torch import nn

from parity_tracker.capture import copies
from parity_tracker.capture.copies import _memo, cast_copy, structural_copy


def _graph_ids(obj, seen: set[int]) -> None:
    """Ids of every object reachable from ``obj`` through containers and ``__dict__``."""
    if id(obj) in seen or type(obj) in copies._ATOMIC:
        return
    seen.add(id(obj))
    for child in _children(obj):
        _graph_ids(child, seen)


def _children(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [v for v in obj.__dict__.values()]
    if isinstance(obj, dict):
        return [*obj.keys(), *obj.values()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, weakref.ref):  # RNNs keep weak references to their flat weights
        return [obj()]
    if isinstance(obj, nn.Module) or (hasattr(obj, "__dict__") and not callable(obj)):
        return list(vars(obj).values())
    return []


def _same_graph(a, b, orig_ids: set[int], pairs: dict[int, int]) -> None:
    """``a`` (deepcopy's) and ``b`` (ours) are the same graph, object for object."""
    if id(a) in pairs:
        assert pairs[id(a)] == id(b), f"sharing differs at {type(a).__name__}"
        return
    pairs[id(a)] = id(b)
    assert type(a) is type(b)
    assert (id(a) in orig_ids) == (id(b) in orig_ids)  # shared with the original in both or none
    if id(a) in orig_ids:
        assert a is b
        return
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.requires_grad) == (b.dtype, b.shape, b.requires_grad)
        assert torch.equal(a, b) and a.data_ptr() != 0
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys())
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
    elif isinstance(a, weakref.ref):
        pass  # the referents are compared below
    elif isinstance(a, (set, frozenset)):
        assert a == b
        return
    elif hasattr(a, "__dict__"):
        assert list(vars(a).keys()) == list(vars(b).keys())
    else:
        assert a == b
        return
    for x, y in zip(_children(a), _children(b), strict=True):
        _same_graph(x, y, orig_ids, pairs)


def _check(module: nn.Module, dtype: torch.dtype | None = torch.float64) -> nn.Module:
    memo = _memo(module, dtype) if dtype is not None else {}
    assert memo is not None
    want = copy.deepcopy(module, dict(memo))
    got = structural_copy(module, dict(memo))
    orig: set[int] = set()
    _graph_ids(module, orig)
    _same_graph(want, got, orig, {})
    assert got is not module
    return got


class _Cycle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.child = nn.Linear(3, 3)
        object.__setattr__(self.child, "owner", self)  # a back reference, not a submodule
        self.tied = self.child  # the same submodule registered twice


class _Attrs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.cache: list = [torch.ones(2), {"k": [1, 2]}]
        self.table = {"scale": torch.tensor(0.5), "names": ("a", "b")}
        self.plain = torch.arange(3.0)  # a tensor attribute: neither parameter nor buffer
        self.alias = self.cache  # the same list twice
        self.fn = torch.tanh
        self.register_buffer("steps", torch.tensor([1, 2], dtype=torch.int64))
        self.register_buffer("mask", torch.ones(2, dtype=torch.bool), persistent=False)
        self.seen = set()


class _SetState(nn.Linear):
    def __setstate__(self, state):
        super().__setstate__(state)
        self.restored = True


class _OwnDeepcopy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def __deepcopy__(self, memo):
        out = _OwnDeepcopy.__new__(_OwnDeepcopy)
        nn.Module.__init__(out)
        out.lin = copy.deepcopy(self.lin, memo)
        out.marker = "own"
        return out


class _Holder(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.head = nn.Linear(2, 2)


def _hooked() -> nn.Module:
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    net[0].register_forward_pre_hook(lambda m, a: None)
    net.register_forward_hook(lambda m, a, o: None, with_kwargs=True)
    return net


MODULES = {
    "transformer": lambda: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True),
        2,
        enable_nested_tensor=False,
    ),
    "cycle": _Cycle,
    "attributes": _Attrs,
    "setstate": lambda: _SetState(3, 3),
    "own_deepcopy": lambda: _Holder(_OwnDeepcopy()),
    "hooked": _hooked,
    "lstm": lambda: nn.LSTM(4, 5, num_layers=2),
    "gru": lambda: nn.GRU(4, 3, bidirectional=True),
    "batchnorm_conv": lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)),
    "embedding": lambda: nn.Embedding(10, 4, padding_idx=0),
    "dict_list": lambda: nn.ModuleDict({"a": nn.ModuleList([nn.Linear(2, 2), nn.GELU()])}),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, None], ids=str)
@pytest.mark.parametrize("name", sorted(MODULES))
def test_structural_copy_is_deepcopy(name, dtype) -> None:
    torch.manual_seed(0)
    _check(MODULES[name](), dtype)


def test_the_copy_shares_no_state_with_the_original() -> None:
    net = _Attrs()
    got = _check(net)
    got.cache.append("new")
    got.table["scale"].add_(1)
    got.register_forward_hook(lambda m, a, o: None)
    got.plain.add_(1)
    assert len(net.cache) == 2 and float(net.table["scale"]) == 0.5
    assert not net._forward_hooks and torch.equal(net.plain, torch.arange(3.0))
    assert got.alias is got.cache and got.fn is torch.tanh


def test_cycles_and_ties_are_kept() -> None:
    got = _check(_Cycle())
    assert got.child.owner is got and got.tied is got.child


def test_own_copy_rules_and_setstate_are_honoured() -> None:
    got = _check(_Holder(_OwnDeepcopy()))
    assert got.inner.marker == "own"  # its __deepcopy__ ran
    assert _check(_SetState(2, 2)).restored is True  # deepcopy calls __setstate__


def test_copyreg_and_non_module_classes_fall_back(monkeypatch) -> None:
    calls = []

    def reduce(m):
        calls.append(m)
        return (nn.Identity, ())

    monkeypatch.setitem(copyreg.dispatch_table, _SetState, reduce)
    net = _Holder(_SetState(2, 2))
    got = _check(net, torch.float64)
    assert type(got.inner) is nn.Identity and len(calls) == 2  # deepcopy and ours both asked


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_cast_copy_forward_is_the_deepcopy_forward(dtype) -> None:
    torch.manual_seed(1)
    net = MODULES["transformer"]().eval()
    got = cast_copy(net, dtype)
    want = copy.deepcopy(net)
    want = want.double() if dtype == torch.float64 else want.to(dtype)
    x = torch.randn(2, 5, 16, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(got(x), want(x))
    assert all(p.dtype == dtype for p in got.parameters())
    assert OrderedDict(net.named_parameters()).keys() == OrderedDict(got.named_parameters()).keys()
