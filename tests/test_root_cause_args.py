"""Case A names the non-tensor arguments the two sides passed differently.

A candidate calling ``gelu`` with ``approximate='tanh'`` on bitwise-equal inputs is a case-A
root cause, but the kernel is not what differs: the call is. The message says so.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from parity_tracker.capture.ops import arg_spec
from parity_tracker.localize.root_cause import argument_differences
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode


def test_argument_differences_by_hand():
    x, y = torch.zeros(2), torch.ones(2)  # tensors stand as placeholders: never a difference
    same = argument_differences(arg_spec((x, 2, [x, 3]), {"alpha": 0.5}),
                                arg_spec((y, 2, [y, 3]), {"alpha": 0.5}))  # fmt: skip
    assert same == []
    nan = argument_differences(arg_spec((x, math.nan), {}), arg_spec((y, math.nan), {}))
    assert nan == []  # NaN is the same argument on both sides
    diff = argument_differences(arg_spec((x, 2, [x, 3]), {}),
                                arg_spec((y, 1, [y, 4]), {"approximate": "tanh"}))  # fmt: skip
    assert diff == ["argument 1: 2 vs 1", "argument 2: [TensorArg(index=1), 3] vs "
                    "[TensorArg(index=1), 4]", "approximate: (default) vs 'tanh'"]  # fmt: skip
    assert argument_differences(None, arg_spec((x,), {})) == []  # not recorded: nothing said


class Net(nn.Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.GELU(approximate=approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


def test_gelu_tanh_candidate_is_named_by_its_argument():
    torch.manual_seed(0)
    ref, cand = Net(), Net("tanh")
    cand.load_state_dict(ref.state_dict())
    out = run_parity(ref, cand, torch.randn(3, 4), mode="equal", capture_ops=True,
                     dump_mode=DumpMode.NOT)  # fmt: skip
    causes = [r for r in out.ops.to_pylist() if r["root_cause"]]
    assert [(r["op"], r["cause"]) for r in causes] == [("gelu", "A")]
    assert "other arguments: approximate: (default) vs 'tanh'" in causes[0]["message"]
    assert "the kernel differs" not in causes[0]["message"]
