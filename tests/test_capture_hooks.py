"""The capture hooks of issue 19 (wave 6): one walk, hooks written into torch's dictionaries,
one site per module and side, tags kept per call signature.

Every expected tag below is written out by hand from the tag grammar (design.md, "Public
names"; ``parity_tracker.capture.tags``), never produced by the code under test.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from parity_tracker.capture.hook_marks import drop_capture_hooks, is_capture_hook
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


class Shared(nn.Module):
    """``a`` is also reachable as ``shared``; ``blocks`` is a container that is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.shared = self.a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        for block in self.blocks:
            x = block(x)
        return self.shared(x)


def _hook_state(model: nn.Module) -> dict[tuple[str, str], list]:
    return {
        (name, d): list(getattr(mod, d).items())
        for name, mod in model.named_modules()
        for d in _HOOK_DICTS
    }


def _user_hook(module, args, output):
    return None


def test_hooked_names_tags_and_removal_leave_the_hook_dicts_as_they_were():
    torch.manual_seed(0)
    net = Shared().eval()
    net.a.register_forward_hook(_user_hook)
    before = _hook_state(net)
    checker = TensorChecker(verbose=False)
    handle = module_register_tensor_checker(net, checker)
    # named_modules() order, the shared module once (its first name), the container skipped
    assert handle.module_names == ["model", "a", "blocks.0", "blocks.1"]
    pre = {n: len(m._forward_pre_hooks) for n, m in net.named_modules()}
    post = {n: len(m._forward_hooks) for n, m in net.named_modules()}
    # one pre and one forward hook per hooked module; the root also has its always-called one;
    # ``a`` keeps the user's hook first
    assert pre == {"": 1, "a": 1, "blocks": 0, "blocks.0": 1, "blocks.1": 1}
    assert post == {"": 2, "a": 2, "blocks": 0, "blocks.0": 1, "blocks.1": 1}
    assert next(iter(net.a._forward_hooks.values())) is _user_hook
    with torch.no_grad():
        net(torch.randn(2, 4))
    handle.remove()
    assert _hook_state(net) == before
    expected = {
        "checker_model_input_0",
        "checker_model",
        "checker_a_input_0",
        "checker_a",
        "checker_blocks.0_input_0",
        "checker_blocks.0",
        "checker_blocks.1_input_0",
        "checker_blocks.1",
        "checker_a@1_input_0",  # the second call of ``a`` (as ``shared``)
        "checker_a@1",
        "checker_a.weight",
        "checker_a.bias",
        "checker_shared.weight",  # every qualified name of a shared weight
        "checker_shared.bias",
        "checker_blocks.0.weight",
        "checker_blocks.0.bias",
        "checker_blocks.1.weight",
        "checker_blocks.1.bias",
    }
    assert {tag for tag, step in checker._log.groups} == expected
    assert {step for _, step in checker._log.groups} == {0}


class Keywords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.m = Scale()

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        if step == 0:
            x = self.m(x)
            x = self.m(x, x)
            return self.m(x, scale=torch.tensor(2.0))
        x = self.m(x, scale=torch.tensor(2.0))  # call 0 now has the keyword
        return self.m((x, x))  # call 1, same count of positional inputs, now a tuple


class Scale(nn.Module):
    def forward(self, x, y=None, *, scale=None):
        if isinstance(x, tuple):
            x = x[0] + x[1]
        return x * (1.0 if scale is None else scale) + (0.0 if y is None else y)


def test_tags_follow_each_calls_signature_across_calls_and_steps():
    net = Keywords().eval()
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(net, checker), torch.no_grad():
        for step in (0, 1):
            checker.step = step
            net(torch.ones(2), step)
    got = {(tag, step) for tag, step in checker._log.groups}
    step0 = {
        "checker_model_input_0",
        "checker_model_input_1",
        "checker_model",
        "checker_m_input_0",
        "checker_m",
        "checker_m@1_input_0",
        "checker_m@1_input_1",
        "checker_m@1",
        "checker_m@2_input_0",
        "checker_m@2_input_scale",
        "checker_m@2",
    }
    step1 = {
        "checker_model_input_0",
        "checker_model_input_1",
        "checker_model",
        "checker_m_input_0",
        "checker_m_input_scale",
        "checker_m",
        "checker_m@1_input_0.0",
        "checker_m@1_input_0.1",
        "checker_m@1",
    }
    assert got == {(t, 0) for t in step0} | {(t, 1) for t in step1}
    slots = {(g.tag, g.step): g.slot for g in checker._log.groups.values()}
    assert slots[("checker_m@1_input_0.1", 1)] == "input.0.1"
    assert slots[("checker_m_input_scale", 1)] == "input.scale"


def test_weights_are_captured_again_after_a_clear():
    net = nn.Sequential(nn.Linear(3, 3)).eval()
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(net, checker), torch.no_grad():
        net(torch.ones(1, 3))
        checker.clear()
        net(torch.ones(1, 3))
    tags = {tag for tag, _ in checker._log.groups}
    assert {"checker_0.weight", "checker_0.bias"} <= tags
    weight = checker._log.groups[("checker_0.weight", 0)]
    assert [c.side for c in weight.captures] == [0]  # once, not once per forward


def test_a_deep_copy_keeps_the_same_hooks_and_drop_removes_only_ours():
    net = Shared().eval()
    net.blocks[0].register_forward_pre_hook(lambda m, a: None)
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(net, checker):
        twin = copy.deepcopy(net)
        ours = [
            fn
            for m in twin.modules()
            for fn in (*m._forward_pre_hooks.values(), *m._forward_hooks.values())
            if is_capture_hook(fn)
        ]
        # 4 hooked modules x (pre, forward) + the root's always-called hook
        assert len(ours) == 9
        assert drop_capture_hooks(twin) == 9
        assert len(twin.blocks[0]._forward_pre_hooks) == 1  # the user's, kept
        with torch.no_grad():
            twin(torch.randn(1, 4))
        assert checker._log.groups == {}  # the copy records nothing


def test_a_hooked_model_refuses_pickling_until_its_hooks_are_removed():
    net = nn.Sequential(nn.Linear(2, 2))
    handle = module_register_tensor_checker(net, TensorChecker(verbose=False))
    with pytest.raises(TypeError, match="remove them"):
        pickle.dumps(net)
    handle.remove()
    restored = pickle.loads(pickle.dumps(net))
    assert torch.equal(restored[0].weight, net[0].weight)
