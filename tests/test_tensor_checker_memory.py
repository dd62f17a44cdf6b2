"""The eager (lockstep, low-memory) path, HF-style root naming, and the op recorder."""

from __future__ import annotations

import gc
import weakref

import torch
from torch import nn

from parity_tracker.capture import Snapshotter
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker


class Chain(nn.Module):
    def __init__(self, n=6):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(16, 16) for _ in range(n)])

    def forward(self, x):
        return self.layers(x)


def _pair():
    torch.manual_seed(0)
    ref, cand = Chain().eval(), Chain().eval()
    cand.load_state_dict(ref.state_dict())
    return ref, cand


def test_eager_releases_reference_snapshots_during_the_candidate_forward(monkeypatch):
    copies = []
    take = Snapshotter.take

    def tracking(self, t):
        out = take(self, t)
        copies.append(weakref.ref(out))
        return out

    monkeypatch.setattr(Snapshotter, "take", tracking)
    ref, cand = _pair()
    x = torch.randn(4, 16)

    def distinct_alive():
        return len({id(c()) for c in copies if c() is not None})

    # deferred: 7 copies per side, less x itself, which both sides were given (one copy)
    for eager, alive_after in (("equal", 0), (None, 13)):
        copies.clear()
        checker = TensorChecker(verbose=False, eager_mode=eager)
        with (
            module_register_tensor_checker(ref, checker),
            module_register_tensor_checker(cand, checker),
            torch.no_grad(),
        ):
            ref(x)
            gc.collect()
            # inputs and outputs of 6 linears + Sequential + root: 7 distinct activations
            assert distinct_alive() == 7
            cand(x)
        gc.collect()
        # eager: every pair was compared as it arrived and nothing is kept
        assert distinct_alive() == alive_after
        assert checker.check("equal").passed


def test_no_grad_inputs_are_cloned_once_per_activation(monkeypatch):
    calls = []
    take = Snapshotter.take
    monkeypatch.setattr(Snapshotter, "take", lambda self, t: calls.append(1) or take(self, t))
    ref, _ = _pair()
    checker = TensorChecker(verbose=False, eager_mode="equal")
    with module_register_tensor_checker(ref, checker), torch.no_grad():
        ref(torch.randn(4, 16))
    # 7 tensors (x and the 6 linear outputs) are offered 16 times (inputs and outputs)
    assert len(calls) == 16
    assert (
        len(
            {
                id(g.captures[0].value)
                for g in checker._groups.values()
                if g.kind in ("input", "output")
            }
        )
        == 7
    )


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, input_ids):
        return self.proj(input_ids)


class ForCausalLM(nn.Module):
    """Like transformers' *ForCausalLM: the backbone is a child named ``model``."""

    def __init__(self):
        super().__init__()
        self.model = Backbone()
        self.lm_head = nn.Linear(4, 2)

    def forward(self, input_ids):
        return {"logits": self.lm_head(self.model(input_ids=input_ids))}


def test_child_named_model_does_not_collide_with_the_root():
    torch.manual_seed(0)
    ref, cand = ForCausalLM().eval(), ForCausalLM().eval()
    cand.load_state_dict(ref.state_dict())
    checker = TensorChecker(verbose=False, eager_mode="equal")
    with (
        module_register_tensor_checker(ref, checker) as h1,
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        x = torch.randn(3, 4)
        ref(x)
        cand(x)
    assert h1.root_name == "root"
    result = checker.check("equal")
    got = {r.tag: (r.status, r.module, r.n_tensors) for r in result.results}
    assert got["checker_model"] == ("equal", "model", 2)
    assert got["checker_model_input_input_ids"] == ("equal", "model", 2)
    assert got["checker_root_output_logits"] == ("equal", "root", 2)
    assert got["checker_root_input_0"] == ("equal", "root", 2)
    assert got["checker_model.proj.weight"] == ("equal", "model.proj", 2)
    assert result.passed


def test_hook_work_is_invisible_to_the_op_recorder():
    from parity_tracker.ops import OpSession

    ref, cand = _pair()
    checker = TensorChecker(verbose=False, eager_mode="equal")
    x = torch.randn(2, 16)
    with (
        OpSession(mode="equal") as session,
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        with session.recording(0, model=ref):
            ref(x)
            checker.register_tensor("manual", x * 1)
        with session.recording(1, model=cand):
            cand(x)
            checker.register_tensor("manual", x * 1)
        ops = [r["op"] for r in session.rows() if r["kind"] == "op"]
    # six linears and the two manual multiplications; no clone/equal from the checker
    assert sorted(set(ops)) == ["addmm", "mul"]
    assert ops.count("addmm") == 6  # one row per compared op
    assert checker.check("equal").passed


def test_manual_listeners_see_every_registration():
    checker = TensorChecker(verbose=False)
    seen = []
    checker.manual_listeners.append(lambda side, tag, t: seen.append((side, tag, t.shape)))
    checker.register_tensor("a", torch.ones(2))
    checker.register_tensor("a", torch.ones(2))
    assert seen == [(0, "a", torch.Size([2])), (1, "a", torch.Size([2]))]
