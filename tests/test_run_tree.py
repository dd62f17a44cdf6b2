"""``run.run._eval_mode`` walks the module tree without names (issue 19): the same modules.

The expected set is torch's own ``Module.modules()`` (identity), and the flags restored are
the ones each module had before, set by hand here.
"""

from __future__ import annotations

import torch

from parity_tracker.run.run import _eval_mode, _tree


def _model() -> torch.nn.Module:
    shared = torch.nn.Linear(2, 2)
    inner = torch.nn.Sequential(shared, torch.nn.Dropout(0.5), torch.nn.ReLU())
    model = torch.nn.Sequential(inner, shared, torch.nn.ModuleList([torch.nn.Dropout(0.1)]))
    model.register_module("absent", None)  # a None child is no module
    model.twice = inner  # the same submodule under a second name
    return model


def test_tree_is_the_set_of_modules():
    model = _model()
    tree = _tree(model)
    assert len(tree) == len({id(m) for m in tree}) == 7  # each module once
    assert {id(m) for m in tree} == {id(m) for m in model.modules()}


def test_eval_mode_sets_and_restores_each_flag():
    model = _model()
    model.train()
    dropout = model[0][1]
    dropout.training = False  # one module already in eval mode before the run
    before = {id(m): m.training for m in model.modules()}
    with _eval_mode(model):
        assert not any(m.training for m in model.modules())
    assert {id(m): m.training for m in model.modules()} == before
    assert model.training and not dropout.training and model[2][0].training
