"""Issue 19, wave 6: ``cast_copy`` skips the module conversion only when it would change nothing.

``cast_copy`` converts the weights into ``deepcopy``'s memo, then used to call ``.double()`` /
``.to(dtype)`` on the copy, a no-op on the converted tensors. It now skips that call, but a
module class with its own ``_apply`` (an RNN re-flattening its weights) or a root with its own
``double`` / ``to`` must still get it, and every weight must come out at the target dtype with
the values ``copy.deepcopy(module).double()`` gives (compared bit for bit).
"""

from __future__ import annotations

import copy

import pytest
import torch

from parity_tracker.capture.copies import cast_copy


class _Counts(torch.nn.Module):
    """A module whose ``_apply`` counts its calls (as ``RNNBase._apply`` re-flattens weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.applied = 0

    def _apply(self, fn, recurse=True):
        self.applied += 1
        return super()._apply(fn, recurse)


class _OwnDouble(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.doubled = 0

    def double(self):
        self.doubled += 1
        return super().double()


def test_own_apply_is_still_called():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), _Counts())
    out = cast_copy(model, torch.float64)
    assert out[1].applied == 1  # once, by the conversion (the original was never converted)
    assert model[1].applied == 0


def test_own_double_is_still_called():
    out = cast_copy(_OwnDouble(), torch.float64)
    assert out.doubled == 1


def test_lstm_weights_are_converted_and_flat():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 5, num_layers=2)
    want = copy.deepcopy(lstm).double()
    out = cast_copy(lstm, torch.float64)
    assert all(w.dtype == torch.float64 for w in out._flat_weights)
    x = torch.randn(3, 2, 4, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(out(x)[0], want(x)[0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_skipped_conversion_gives_the_deepcopy_conversion(dtype):
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.LayerNorm(6), torch.nn.BatchNorm1d(6), torch.nn.ReLU()
    ).eval()
    model[2].running_mean.uniform_(-1, 1)
    want = (
        copy.deepcopy(model).double() if dtype == torch.float64 else copy.deepcopy(model).to(dtype)
    )
    out = cast_copy(model, dtype)
    got, exp = out.state_dict(), want.state_dict()
    assert list(got) == list(exp)
    for name, t in exp.items():
        assert got[name].dtype == t.dtype, name
        assert torch.equal(got[name], t), name
    assert [type(p) for p in out.parameters()] == [type(p) for p in want.parameters()]
    assert [p.requires_grad for p in out.parameters()] == [
        p.requires_grad for p in want.parameters()
    ]
