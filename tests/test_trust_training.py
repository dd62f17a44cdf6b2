"""Issue 13, item 15: the training-mode warning fires only for mode-dependent modules."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from parity_tracker.capture.training import mode_dependence, training_mode_dependent
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker


class ReadsMode(nn.Module):
    def forward(self, x):
        return x * 2 if self.training else x


class Plain(nn.Module):
    def forward(self, x):
        return x + 1


@pytest.mark.parametrize(
    ("module", "dependent"),
    [
        (nn.Dropout(0.1), True),
        (nn.Dropout(0.0), False),  # identity in both modes
        (nn.AlphaDropout(0.2), True),
        (nn.BatchNorm1d(2), True),
        (nn.BatchNorm2d(2, track_running_stats=False), False),  # batch statistics either way
        (nn.InstanceNorm1d(2), False),  # no running statistics by default
        (nn.InstanceNorm1d(2, track_running_stats=True), True),
        (nn.RReLU(), True),
        (nn.MultiheadAttention(4, 2, dropout=0.1), True),
        (nn.MultiheadAttention(4, 2), False),
        (nn.Linear(2, 2), False),
        (nn.LayerNorm(2), False),
        (ReadsMode(), True),
        (Plain(), False),
    ],
)
def test_mode_dependence(module, dependent):
    assert (mode_dependence(module) is not None) is dependent


def _forward_warnings(model):
    checker = TensorChecker(verbose=False)
    with module_register_tensor_checker(model, checker), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        model(torch.randn(3, 2))
    return [str(x.message) for x in w if "training mode" in str(x.message)]


def test_no_warning_for_a_training_model_without_mode_dependent_modules():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.LayerNorm(2), Plain())
    assert model.training
    assert _forward_warnings(model) == []


def test_warning_names_the_mode_dependent_modules():
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5), nn.BatchNorm1d(2))
    (msg,) = _forward_warnings(model)
    assert "1: Dropout(p=0.5)" in msg and "2: BatchNorm1d with running statistics" in msg


def test_eval_submodules_do_not_count():
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    model[1].eval()
    assert training_mode_dependent(model) == []
    assert _forward_warnings(model) == []
