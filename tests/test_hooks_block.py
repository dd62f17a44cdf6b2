"""The capture hooks written and removed in one block (issue 19, wave 10: ``hooks._write_block``).

The hook dictionaries are read back by hand after install and after removal: every module
gets exactly one pre-hook and one forward hook of ours (with keyword arguments), the user's
hooks stay in their order, and removal leaves each dictionary as it was before the install,
also when a hook was removed by hand in between or when one module's dictionary is not a
plain dict (then the model is hooked one module at a time, as before).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from parity_tracker.capture.modules import ModuleSite
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
)


def _net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)).eval()


def _state(net: nn.Module) -> list[list[tuple]]:
    return [[tuple(getattr(m, d).items()) for d in _DICTS] for m in net.modules()]


def _ours(net: nn.Module) -> list[tuple[int, int]]:
    """Per module: how many of its pre-hooks and forward hooks are capture sites."""
    return [
        (
            sum(isinstance(h, ModuleSite) for h in m._forward_pre_hooks.values()),
            sum(isinstance(h, ModuleSite) for h in m._forward_hooks.values()),
        )
        for m in net.modules()
    ]


def test_hooks_are_written_after_the_users_and_removed_to_the_state_before():
    net = _net()
    seen = []
    net[1].register_forward_hook(lambda m, a, o: seen.append("user"))
    before = _state(net)
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(net, checker), torch.no_grad():
        assert _ours(net) == [(1, 1), (1, 1), (1, 1), (1, 1)]
        relu_hooks = list(net[1]._forward_hooks.values())
        assert not isinstance(relu_hooks[0], ModuleSite) and isinstance(relu_hooks[1], ModuleSite)
        for m in net.modules():  # our hooks take keyword arguments
            ids = [i for i, h in m._forward_pre_hooks.items() if isinstance(h, ModuleSite)]
            assert all(m._forward_pre_hooks_with_kwargs[i] is True for i in ids)
            assert all(m._forward_hooks_with_kwargs[i + 1] is True for i in ids)
            assert all(isinstance(m._forward_hooks[i + 1], ModuleSite) for i in ids)
        net(torch.ones(1, 2))
    assert seen == ["user"]
    assert _state(net) == before
    tags = {tag for tag, _ in checker._log.groups}
    assert {"checker_0", "checker_1", "checker_2", "checker_model"} <= tags


def test_a_hook_removed_by_hand_leaves_the_others_removed():
    net = _net()
    before = _state(net)
    handle = module_register_tensor_checker(net, TensorChecker(verbose=False))
    net[0]._forward_hooks.clear()  # one of our hooks gone before the handle removes them
    handle.remove()
    after = _state(net)
    assert after[0] == before[0] and after[2:] == before[2:]  # every other module as before
    assert after[1][0] == () and after[1][1] == ()  # net[0]'s pre-hook removed too


class _Hooks(OrderedDict):
    """A hook dictionary of another type: the block refuses the model."""


def test_a_module_with_another_hook_dict_type_is_hooked_the_public_way():
    net = _net()
    net[2]._forward_pre_hooks = _Hooks()
    before = _state(net)
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(net, checker), torch.no_grad():
        assert _ours(net) == [(1, 1), (1, 1), (1, 1), (1, 1)]
        out = net(torch.ones(1, 2))
    assert _state(net) == before
    assert type(net[2]._forward_pre_hooks) is _Hooks
    got = checker._log.groups[("checker_2", 0)].captures[0].meta
    assert got == (tuple(out.shape), "float32", "cpu") == ((1, 2), "float32", "cpu")
