"""The seed facade refuses a ``torch.compile``-d side that shares modules with the other side.

``capture.compiled.install_compiled`` listed no modules on its handle, so the hooks' install
(``capture.hooks.refuse_shared_handle``) saw nothing to compare: ``TensorChecker`` +
``module_register_tensor_checker`` accepted a compiled candidate wrapping the reference's own
submodule (main ed626ba), whose rows then compared one forward with itself. ``run_parity``
refused it (``run.validate``); the facade now gives the same error, from the same owner.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from parity_tracker.errors import InputError
from parity_tracker.run.run import run_parity
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker


class Net(nn.Module):
    def __init__(self, a: nn.Module, b: nn.Module) -> None:
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x):
        return self.b(self.a(x))


def _ref() -> tuple[Net, torch.Tensor]:
    torch.manual_seed(0)
    return Net(nn.Linear(4, 4), nn.Linear(4, 4)), torch.randn(2, 4)


def _compiled(model: nn.Module) -> nn.Module:
    return torch.compile(model, backend="eager")


def _run_parity_error(ref: nn.Module, cand: nn.Module, x: torch.Tensor) -> str:
    with pytest.raises(InputError) as info:
        run_parity(ref, cand, (x,), dump_mode="not")
    return str(info.value)


def test_a_compiled_candidate_around_the_references_submodule_is_refused_as_run_parity_does():
    ref, x = _ref()
    inner = Net(nn.Linear(4, 4), ref.b)
    cand = _compiled(inner)
    want = _run_parity_error(ref, cand, x)
    assert "(_orig_mod.b)" in want and "copy.deepcopy" in want
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(ref, checker):
        hooks_b = len(ref.b._forward_hooks)
        with pytest.raises(InputError) as info:
            module_register_tensor_checker(cand, checker)  # accepted on main
        assert str(info.value) == want
        assert len(ref.b._forward_hooks) == hooks_b  # nothing of the candidate stays hooked
        assert len(inner.a._forward_hooks) == len(cand._forward_hooks) == 0
        with torch.no_grad():
            ref(x)
    tags = {r["tag"] for r in checker.check("equal").to_rows()}
    assert tags and not any("@1" in t for t in tags)


def test_a_plain_candidate_sharing_a_compiled_references_submodule_is_refused():
    """The compiled side hooked first: the plain side's install now sees its modules."""
    ref, _ = _ref()
    cand = Net(nn.Linear(4, 4), ref.b)
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(_compiled(ref), checker):
        with pytest.raises(InputError, match=r"shares module objects with the reference \(b\)"):
            module_register_tensor_checker(cand, checker)
        assert len(cand.a._forward_hooks) == 0


def test_the_compiled_reference_itself_as_candidate_is_refused_naming_every_module():
    ref, x = _ref()
    cand = _compiled(ref)
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(ref, checker), pytest.raises(InputError) as info:
        module_register_tensor_checker(cand, checker)
    assert "(_orig_mod, _orig_mod.a, _orig_mod.b)" in str(info.value)
    assert str(info.value) == _run_parity_error(ref, cand, x)


def test_a_compiled_deep_copy_is_accepted_and_finds_the_difference():
    """The fix the message names: each side its own modules; b's input differs (a differs)."""
    ref, x = _ref()
    cand = _compiled(Net(nn.Linear(4, 4), copy.deepcopy(ref.b)))
    checker = TensorChecker(verbose=False)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(x)
        cand(x)
    rows = {r["tag"]: r for r in checker.check("equal").to_rows()}
    assert not any("@1" in tag for tag in rows)
    b_in = rows["checker_b_input_0"]
    want = (ref.a(x) - cand._orig_mod.a(x)).abs().max().item()  # by hand
    assert b_in["status"] == "mismatch"
    assert b_in["max_abs_diff"] == pytest.approx(want, rel=1e-6)
