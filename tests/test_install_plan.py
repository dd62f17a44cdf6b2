"""The install plan kept per model (capture/install_plan.py, issue 19): never a stale capture.

Each test hooks a model once (the plan is made and kept), changes the model's structure, hooks
it again and checks what the second forward captured against tags written by hand and values
computed with numpy from the model's weights. A kept plan that missed the change would hook the
old modules, or miss the new tensors, and fail these tests.
"""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture import install_plan
from parity_tracker.compare.pairing import load
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

X = np.array([[1.0, -2.0], [0.5, 3.0]], dtype=np.float32)


@pytest.fixture(autouse=True)
def _fresh_plans():
    install_plan.forget_plans()
    yield
    install_plan.forget_plans()


def capture(model: nn.Module) -> dict[str, np.ndarray]:
    """``{tag: value}`` of one hooked forward of ``model`` on ``X`` (step 0, side 0)."""
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(model, checker, side=0), torch.no_grad():
        model(torch.from_numpy(X.copy()))
    out = {}
    for (tag, _step), g in checker._log.groups.items():
        value = g.captures[0].value
        out[tag] = None if value is None else load(value).detach().numpy().copy()
    return out


def kept(model: nn.Module) -> bool:
    """Whether a plan is kept for ``model`` (so the next install may reuse it)."""
    plan = install_plan._PLANS.get(id(model))
    return plan is not None and plan._refs[0]() is model


def linear(lin: nn.Linear, x: np.ndarray) -> np.ndarray:
    """``x @ W.T + b`` in numpy (float64, then float32)."""
    w = lin.weight.detach().numpy().astype(np.float64)
    y = x.astype(np.float64) @ w.T
    if lin.bias is not None:
        y = y + lin.bias.detach().numpy().astype(np.float64)
    return y.astype(np.float32)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


class Chain(nn.Module):
    """Calls its ``blocks`` in order."""

    def __init__(self, n: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_plan_is_kept_and_reused_for_an_unchanged_model() -> None:
    model = Chain()
    first = capture(model)
    assert kept(model)
    plan = install_plan._PLANS[id(model)]
    second = capture(model)
    assert install_plan._PLANS[id(model)] is plan  # reused, not walked again
    assert first.keys() == second.keys()
    y0 = linear(model.blocks[0], X)
    assert_close(second["checker_blocks.0"], y0)
    assert_close(second["checker_blocks.1"], linear(model.blocks[1], y0))


def test_added_module_is_captured() -> None:
    model = Chain()
    capture(model)
    assert kept(model)
    torch.manual_seed(1)
    model.blocks.append(nn.Linear(2, 2))
    got = capture(model)
    y = X
    for b in model.blocks:
        y = linear(b, y)
    assert_close(
        got["checker_blocks.2_input_0"], linear(model.blocks[1], linear(model.blocks[0], X))
    )
    assert_close(got["checker_blocks.2"], y)
    assert_close(got["checker_blocks.2.weight"], model.blocks[2].weight.detach().numpy())
    assert_close(got["checker_model"], y)


def test_removed_module_is_not_captured() -> None:
    model = Chain(3)
    capture(model)
    assert kept(model)
    del model.blocks[1]  # ModuleList renumbers: "2" becomes "1" (a new _modules dict)
    got = capture(model)
    tags = {t for t in got if t.startswith("checker_blocks.")}
    assert tags == {
        "checker_blocks.0_input_0", "checker_blocks.0", "checker_blocks.0.weight",
        "checker_blocks.0.bias", "checker_blocks.1_input_0", "checker_blocks.1",
        "checker_blocks.1.weight", "checker_blocks.1.bias",
    }  # fmt: skip
    y = linear(model.blocks[1], linear(model.blocks[0], X))
    assert_close(got["checker_blocks.1"], y)


def test_replaced_module_of_the_same_class_is_captured() -> None:
    model = Chain()
    capture(model)
    assert kept(model)
    new = nn.Linear(2, 2)
    with torch.no_grad():
        new.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, -1.0]]))
        new.bias.fill_(0.25)
    model.blocks[1] = new
    got = capture(model)
    y0 = linear(model.blocks[0], X)
    want = (y0.astype(np.float64) * [2.0, -1.0] + 0.25).astype(np.float32)
    assert_close(got["checker_blocks.1"], want)
    assert_close(got["checker_blocks.1.weight"], np.array([[2.0, 0.0], [0.0, -1.0]]))


def test_replaced_module_of_another_class_is_hooked_as_itself() -> None:
    model = Chain()
    capture(model)
    assert kept(model)
    model.blocks[1] = nn.Sequential(nn.ReLU())  # a container with a child instead of a Linear
    got = capture(model)
    y0 = linear(model.blocks[0], X)
    assert "checker_blocks.1.weight" not in got
    assert_close(got["checker_blocks.1.0"], np.maximum(y0, 0))
    assert_close(got["checker_blocks.1"], np.maximum(y0, 0))


def test_module_written_into_modules_directly_is_captured() -> None:
    model = Chain()
    capture(model)
    assert kept(model)
    new = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        new.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    model.blocks._modules["1"] = new  # no __setattr__, no registration hook
    got = capture(model)
    y0 = linear(model.blocks[0], X)
    assert_close(got["checker_blocks.1"], y0[:, ::-1])
    assert "checker_blocks.1.bias" not in got


class Box(nn.Module):
    """Has a parameter and no forward: a container, never hooked."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.tensor([3.0, -1.0]))


class Scale(Box):
    """``Box`` with a forward: ``x * p``."""

    def forward(self, x):
        return x * self.p


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = Box()

    def forward(self, x):
        return self.sub(x) if type(self.sub).forward is not nn.Module.forward else x + 1


def test_class_swapped_to_one_with_a_forward_is_hooked() -> None:
    model = Outer()
    first = capture(model)
    assert "checker_sub" not in first and kept(model)
    assert_close(first["checker_sub.p"], np.array([3.0, -1.0]))  # an unused weight
    model.sub.__class__ = Scale
    got = capture(model)
    assert_close(got["checker_sub_input_0"], X)
    assert_close(got["checker_sub"], X * np.array([3.0, -1.0], dtype=np.float32))


def test_added_parameter_and_buffer_are_captured() -> None:
    model = Chain()
    capture(model)
    assert kept(model)
    model.blocks[0].register_parameter("extra", nn.Parameter(torch.tensor([7.0])))
    model.blocks[1].register_buffer("scale", torch.tensor([0.5, 2.0]))
    got = capture(model)
    assert_close(got["checker_blocks.0.extra"], np.array([7.0]))
    assert_close(got["checker_blocks.1.scale"], np.array([0.5, 2.0]))


def test_parameter_that_was_none_is_captured_once_set() -> None:
    model = Chain()
    model.blocks[1] = nn.Linear(2, 2, bias=False)  # "bias" registered as None
    first = capture(model)
    assert "checker_blocks.1.bias" not in first and kept(model)
    model.blocks[1].bias = nn.Parameter(torch.tensor([1.0, -1.0]))
    got = capture(model)
    assert_close(got["checker_blocks.1.bias"], np.array([1.0, -1.0]))
    y = linear(model.blocks[1], linear(model.blocks[0], X))
    assert_close(got["checker_blocks.1"], y)


def test_reassigned_parameter_is_captured_with_its_new_value() -> None:
    model = Chain()
    capture(model)
    assert kept(model)
    model.blocks[0].weight = nn.Parameter(torch.tensor([[1.0, 1.0], [0.0, 2.0]]))
    got = capture(model)
    assert_close(got["checker_blocks.0.weight"], np.array([[1.0, 1.0], [0.0, 2.0]]))
    assert_close(got["checker_blocks.0"], linear(model.blocks[0], X))


def test_parameter_set_to_none_is_not_captured() -> None:
    model = Chain()
    capture(model)
    assert kept(model)
    model.blocks[0].bias = None
    got = capture(model)
    assert "checker_blocks.0.bias" not in got
    assert_close(got["checker_blocks.0"], linear(model.blocks[0], X))


def test_user_hook_added_between_installs_is_seen() -> None:
    model = Chain()
    capture(model)
    assert kept(model)
    model.blocks[0].register_forward_hook(lambda m, args, out: out * 2)
    got = capture(model)
    y0 = 2 * linear(model.blocks[0], X)
    assert_close(got["checker_blocks.0"], y0)
    assert_close(got["checker_blocks.1_input_0"], y0)


def test_training_flag_changed_between_installs_warns() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)).eval()
    capture(model)
    assert kept(model)
    model[1].train()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        capture(model)
    assert any("training mode" in str(w.message) and "1: Dropout" in str(w.message) for w in seen)


def test_shared_submodule_unshared_is_captured_under_its_new_name() -> None:
    model = Chain()
    model.blocks[1] = model.blocks[0]  # one module under two names
    first = capture(model)
    assert "checker_blocks.1.weight" in first and kept(model)
    torch.manual_seed(3)
    model.blocks[1] = nn.Linear(2, 2)
    got = capture(model)
    assert_close(got["checker_blocks.1.weight"], model.blocks[1].weight.detach().numpy())
    assert_close(got["checker_blocks.1"], linear(model.blocks[1], linear(model.blocks[0], X)))


def test_plan_dropped_with_its_model() -> None:
    model = Chain()
    capture(model)
    key = id(model)
    assert kept(model)
    del model
    gc.collect()
    assert key not in install_plan._PLANS


def test_kept_plan_captures_exactly_what_a_fresh_walk_captures() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(1, 3, 8)

    def groups() -> list[tuple]:
        checker = TensorChecker(verbose=False)
        with module_register_tensor_checker(model, checker, side=0), torch.no_grad():
            model(x)
        return [
            (tag, g.kind, g.module, g.slot, g.order, load(g.captures[0].value).numpy().tobytes())
            for (tag, _), g in checker._log.groups.items()
            if g.captures[0].value is not None
        ]

    fresh = groups()
    assert kept(model)
    assert groups() == fresh


def test_forward_added_to_the_class_is_hooked() -> None:
    class Later(nn.Module):  # no forward yet: a container
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.Parameter(torch.tensor([0.5, 4.0]))

    model = Outer()
    model.sub = Later()
    first = capture(model)
    assert "checker_sub" not in first and kept(model)
    Later.forward = lambda self, x: x * self.p  # the class gains a forward
    got = capture(model)
    assert_close(got["checker_sub_input_0"], X)
    assert_close(got["checker_sub"], X * np.array([0.5, 4.0], dtype=np.float32))
