"""run_parity refuses a candidate that shares module objects with the reference (wave 8).

Both sides' hooks sat on the shared object: every forward recorded it on both sides, so its
rows compared one forward with itself (``equal`` whatever the candidate computed there) and
gained ``@1`` tags that no forward made.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from parity_tracker.errors import InputError
from parity_tracker.run.run import run_parity


class Net(nn.Module):
    def __init__(self, a: nn.Module, b: nn.Module) -> None:
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x):
        return self.b(self.a(x))


def _pair():
    torch.manual_seed(0)
    ref = Net(nn.Linear(4, 4), nn.Linear(4, 4))
    return ref, torch.randn(2, 4)


def test_the_same_model_as_both_sides_is_refused_naming_the_root():
    ref, x = _pair()
    with pytest.raises(InputError, match=r"\(<root>, a, b\).*copy\.deepcopy\(candidate\)"):
        run_parity(ref, ref, (x,), dump_mode="not")


def test_a_shared_submodule_is_refused_naming_it():
    """The candidate's own ``a`` computes other values; its ``b`` is the reference's object:
    without the refusal, b's rows compared each forward with itself and said equal."""
    ref, x = _pair()
    cand = Net(nn.Linear(4, 4), ref.b)
    with pytest.raises(InputError, match=r"shares module objects with the reference \(b\)"):
        run_parity(ref, cand, (x,), dump_mode="not")


def test_a_deep_copy_runs_and_finds_the_difference_the_shared_module_hid():
    ref, x = _pair()
    cand = Net(nn.Linear(4, 4), copy.deepcopy(ref.b))  # other weights in a: b's input differs
    result = run_parity(ref, cand, (x,), mode="equal", dump_mode="not")
    rows = {r["tag"]: r for r in result.modules.to_pylist()}
    assert not any("@1" in tag for tag in rows)
    b_in = rows["checker_b_input_0"]
    want = (ref.a(x) - cand.a(x)).abs().max().item()  # b's inputs: a's outputs, by hand
    assert b_in["status"] == "mismatch"
    assert b_in["max_abs_diff"] == pytest.approx(want, rel=1e-6)


def test_shared_parameters_alone_are_not_refused():
    """Tied weights across the sides (one tensor, two module objects) hook nothing twice."""
    ref, x = _pair()
    cand = Net(nn.Linear(4, 4), nn.Linear(4, 4))
    cand.a.weight, cand.a.bias = ref.a.weight, ref.a.bias
    cand.b.weight, cand.b.bias = ref.b.weight, ref.b.bias
    result = run_parity(ref, cand, (x,), mode="equal", dump_mode="not")
    assert result.summary["passed"] is True


def test_the_seed_facade_refuses_a_module_hooked_for_both_sides():
    """module_register_tensor_checker on a candidate holding the reference's ``b``: refused,
    and nothing of the candidate stays hooked (the reference's hooks stay)."""
    from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

    ref, x = _pair()
    cand = Net(nn.Linear(4, 4), ref.b)
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(ref, checker):
        hooks_b = len(ref.b._forward_hooks)
        with pytest.raises(InputError, match=r"\(b\).*copy\.deepcopy"):
            module_register_tensor_checker(cand, checker)
        assert len(ref.b._forward_hooks) == hooks_b  # the candidate's hooks were removed
        assert len(cand.a._forward_hooks) == 0
        with torch.no_grad():
            ref(x)
    tags = {r["tag"] for r in checker.check("equal").to_rows()}
    assert tags and not any("@1" in t for t in tags)


def test_a_compiled_candidate_around_the_reference_itself_is_refused():
    """torch.compile(reference) wraps the reference's own modules (``_orig_mod``)."""
    ref, x = _pair()
    with pytest.raises(InputError, match=r"shares module objects.*_orig_mod.*deepcopy"):
        run_parity(ref, torch.compile(ref, backend="eager"), (x,), dump_mode="not")
