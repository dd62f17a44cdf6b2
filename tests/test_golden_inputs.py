"""Issue 19, budget wave 5: the golden's input pre-hook and the budget record, built for less.

- ``golden_copy``'s pre-hook (``_promote_inputs``) returns ``None`` (the call keeps its own
  arguments) when every argument is a plain tensor that needs no promotion or a
  ``None``/number/string; anything else still goes through ``promote``. Checked: the module
  sees float64 where the documented rule says so (float32/bfloat16/float16 → float64,
  complex64 → complex128, integer and bool kept), the very same objects otherwise, and
  ``promote`` is not called for already wide inputs.
- ``budget_compare``'s record is ``dataclasses.replace`` of the candidate-vs-reference
  comparison with the budget fields, field for field, and still frozen.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from parity_tracker.capture import golden as golden_mod
from parity_tracker.capture.golden import golden_copy
from parity_tracker.compare import budget
from parity_tracker.compare.core import compare_tensors


class _Seen(nn.Module):
    """Records what its forward receives."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.got: list = []

    def forward(self, *args, **kwargs):
        self.got.append((args, kwargs))
        return args[0] if args else None


WIDE = {torch.float32: torch.float64, torch.bfloat16: torch.float64, torch.float16: torch.float64}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.complex64])
def test_narrow_inputs_are_promoted_anywhere(dtype) -> None:
    net = golden_copy(_Seen())
    x = torch.ones(2, dtype=dtype)
    i = torch.arange(3)
    net(x, i, None, 3, flag=True, nested=[x, {"k": x}], mask=torch.ones(2, dtype=torch.bool))
    (args, kwargs), want = net.got[0], WIDE.get(dtype, torch.complex128)
    assert args[0].dtype == want and torch.equal(args[0], x.to(want))
    assert args[1] is i and args[2] is None and args[3] == 3 and kwargs["flag"] is True
    assert kwargs["nested"][0].dtype == want and kwargs["nested"][1]["k"].dtype == want
    assert kwargs["mask"].dtype == torch.bool


def test_wide_inputs_keep_their_objects_without_promote(monkeypatch) -> None:
    calls = []
    real = golden_mod.promote
    monkeypatch.setattr(golden_mod, "promote", lambda tree: calls.append(tree) or real(tree))
    net = golden_copy(_Seen())
    x, i = torch.ones(2, dtype=torch.float64), torch.arange(2)
    c = torch.ones(2, dtype=torch.complex128)
    net(x, i, c, None, 1.5, "s", flag=False, mask=torch.ones(2, dtype=torch.bool))
    args, kwargs = net.got[0]
    assert args[0] is x and args[1] is i and args[2] is c and args[3:] == (None, 1.5, "s")
    assert kwargs["flag"] is False and kwargs["mask"].dtype == torch.bool
    assert calls == []  # nothing to promote: the hook returned None
    net(torch.ones(2))  # a float32 input: promoted through promote
    assert len(calls) == 2 and net.got[1][0][0].dtype == torch.float64


def test_parameter_inputs_take_the_full_path() -> None:
    net = golden_copy(_Seen())
    p = nn.Parameter(torch.ones(2))  # a tensor subclass, float32: promoted as before
    net(p)
    assert net.got[0][0][0].dtype == torch.float64


def test_budget_record_is_the_replaced_comparison() -> None:
    g = torch.randn(64, dtype=torch.float64)
    ref, cand, twin = g.float(), (g * 1.01).bfloat16(), g.bfloat16()
    out = budget.budget_compare(g, twin, cand, reference=ref)
    want = dataclasses.replace(
        compare_tensors(ref, cand, mode="equal"),
        status=out.status,
        mode="budget",
        message=out.message,
        golden_max_abs_err=out.golden_max_abs_err,
        twin_max_abs_err=out.twin_max_abs_err,
        error_ratio=out.error_ratio,
    )
    assert dataclasses.asdict(out.comparison) == dataclasses.asdict(want)
    assert out.comparison == want and type(out.comparison) is type(want)
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.comparison.status = "equal"
