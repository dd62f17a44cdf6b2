"""The fused record path of the module hooks (issue 19, wave 10): one record call per module
call, the input names kept per site for its last call signature, ``called`` derived from the
call counts, own tensors recorded per owner and kind.

Every expected value is written out by hand (the tag grammar of design.md, "Public names";
the shapes of the tensors each test makes), never produced by the code under test. The caches
must never change what is recorded: the tests change the call index, the positional count and
the keyword order between calls and check that each value lands under its own tag.
"""

from __future__ import annotations

import torch
from torch import nn

from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker


class Flex(nn.Module):
    """``x`` (+ ``y`` when given): any signature of two inputs."""

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return x.sum() + (0 if y is None else y.sum())


class Caller(nn.Module):
    """Calls ``f`` with the signatures listed in ``calls`` (one list per step)."""

    def __init__(self) -> None:
        super().__init__()
        self.f = Flex()

    def forward(self, a: torch.Tensor, b: torch.Tensor, how: str) -> torch.Tensor:
        if how == "mixed":  # one step, three signatures: call index 0, 1, 2
            return self.f(a) + self.f(a, b) + self.f(a, y=b)
        if how == "xy":
            return self.f(x=a, y=b)
        return self.f(y=b, x=a)  # "yx": the same keywords, the other order


def _shapes(checker: TensorChecker, step: int) -> dict[str, tuple[int, ...] | str]:
    """Each tag of ``step``: its tensor's shape, or the type of its non-tensor leaf."""
    out = {}
    for (tag, s), g in checker._log.groups.items():
        cap = g.captures[0]
        if s == step:
            out[tag] = cap.meta[0] if cap.is_tensor else repr(cap.value)
    return out


def test_each_value_lands_under_its_own_tag_whatever_the_signature():
    net = Caller().eval()
    checker = TensorChecker(verbose=False)
    a, b = torch.ones(2), torch.ones(3)  # told apart by their shapes
    with module_register_tensor_checker(net, checker), torch.no_grad():
        for step, how in enumerate(("mixed", "xy", "yx", "mixed")):
            checker.step = step
            net(a, b, how)
    mixed = {
        "checker_f_input_0": (2,),
        "checker_f": (),
        "checker_f@1_input_0": (2,),
        "checker_f@1_input_1": (3,),
        "checker_f@1": (),
        "checker_f@2_input_0": (2,),
        "checker_f@2_input_y": (3,),
        "checker_f@2": (),
    }
    keywords = {"checker_f_input_x": (2,), "checker_f_input_y": (3,), "checker_f": ()}
    root = {
        "checker_model_input_0": (2,),
        "checker_model_input_1": (3,),
        "checker_model_input_2": "<str>",  # ``how``: a non-tensor leaf
        "checker_model": (),
    }
    assert _shapes(checker, 0) == {**mixed, **root}
    assert _shapes(checker, 1) == {**keywords, **root}
    assert _shapes(checker, 2) == {**keywords, **root}
    assert _shapes(checker, 3) == {**mixed, **root}
    slots = {g.slot for (tag, s), g in checker._log.groups.items() if tag.startswith("checker_f@2")}
    assert slots == {"input.0", "input.y", "output"}


def test_called_lists_the_modules_each_side_called():
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Identity(), nn.Identity()

        def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
            return self.b(self.a(x)) if use_b else self.a(x)

    ref, cand = Two().eval(), Two().eval()
    checker = TensorChecker(verbose=False)
    with (
        module_register_tensor_checker(ref, checker, side=0),
        module_register_tensor_checker(cand, checker, side=1),
        torch.no_grad(),
    ):
        ref(torch.ones(1), True)
        checker.step = 1
        cand(torch.ones(1), False)
    log = checker._log
    assert log.called == {0: {"model", "a", "b"}, 1: {"model", "a"}}
    assert log.calls == {
        (0, 0, "model"): 1,
        (0, 0, "a"): 1,
        (0, 0, "b"): 1,
        (1, 1, "model"): 1,
        (1, 1, "a"): 1,
    }
    checker.clear()
    assert log.called == {}


class Shared(nn.Module):
    """A batch norm (2 parameters, 3 buffers) reachable under two names, and a scale."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(2)
        self.alias = self.norm  # the same module object under a second name
        self.scale = nn.Parameter(torch.full((1,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * self.scale


def test_own_tensors_of_several_owners_and_kinds_keep_their_order_and_kind():
    net = Shared().eval()
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(net, checker), torch.no_grad():
        net(torch.ones(3, 2))
    groups = sorted(checker._log.groups.values(), key=lambda g: g.captures[0].exec_order)
    got = [(g.tag, g.kind, g.module, g.slot) for g in groups]
    # exec order: the root's input and own scale, the norm's input, then its own tensors
    # under the first name (parameters, then buffers), then under the second name, its
    # output, the root's output
    assert got == [
        ("checker_model_input_0", "input", "model", "input.0"),
        ("checker_scale", "param", "model", "scale"),
        ("checker_norm_input_0", "input", "norm", "input.0"),
        ("checker_norm.weight", "param", "norm", "weight"),
        ("checker_norm.bias", "param", "norm", "bias"),
        ("checker_norm.running_mean", "buffer", "norm", "running_mean"),
        ("checker_norm.running_var", "buffer", "norm", "running_var"),
        ("checker_norm.num_batches_tracked", "buffer", "norm", "num_batches_tracked"),
        ("checker_alias.weight", "param", "alias", "weight"),
        ("checker_alias.bias", "param", "alias", "bias"),
        ("checker_alias.running_mean", "buffer", "alias", "running_mean"),
        ("checker_alias.running_var", "buffer", "alias", "running_var"),
        ("checker_alias.num_batches_tracked", "buffer", "alias", "num_batches_tracked"),
        ("checker_norm", "output", "norm", "output"),
        ("checker_model", "output", "model", "output"),
    ]
    assert [g.captures[0].exec_order for g in groups] == list(range(15))
    assert checker._log.exec == {0: 15}
    metas = {g.tag: g.captures[0].meta for g in groups}
    assert metas["checker_norm.num_batches_tracked"] == ((), "int64", "cpu")
    assert metas["checker_alias.running_var"] == ((2,), "float32", "cpu")
    assert metas["checker_scale"] == ((1,), "float32", "cpu")
