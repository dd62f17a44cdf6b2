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


# ---------------------------------------------------------------------------------------------
# Resident budget of the snapshots: spilled to disk past it, results unchanged (issue 5/9)


class _Deep(nn.Module):
    """48 near-identity Linear(16, 16) blocks, each followed by an elementwise op."""

    def __init__(self, depth=48, bump=None):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(depth))
        with torch.no_grad():
            for i, lin in enumerate(self.layers):
                lin.weight.copy_(
                    torch.eye(16) + 0.01 * torch.sin(torch.arange(256.0) + i).view(16, 16)
                )
                lin.bias.fill_(0.001 * i)
                if i == bump:
                    lin.bias[3] += 1e-3  # a real divergence from this block on

    def forward(self, x):
        for lin in self.layers:
            x = torch.tanh(lin(x))
        return x


def _deep_run(tmp_path, monkeypatch, budget, name):
    """run_parity over the deep pair with the snapshot budget ``budget``; (result, checker)."""
    import parity_tracker.tensor_checker as tc
    from parity_tracker.run import run_parity

    made = []

    class Recorded(TensorChecker):
        def __init__(self, **kw):
            super().__init__(**kw, max_resident_bytes=budget)
            made.append(self)

    monkeypatch.setattr(tc, "TensorChecker", Recorded)
    torch.manual_seed(0)
    x = torch.randn(8, 16)  # 512 bytes per activation
    result = run_parity(
        _Deep(),
        _Deep(bump=30),
        (x,),
        mode="allclose",
        dump_mode="not_equal",
        dump_path=tmp_path / name,
        environment={},
    )
    (checker,) = made
    return result, checker


def _rows(result):
    drop = {"run_id", "dump_path"}
    return [{k: v for k, v in r.items() if k not in drop} for r in result.modules.to_pylist()]


def test_deep_run_keeps_snapshots_within_budget_with_identical_results(tmp_path, monkeypatch):
    import math

    from parity_tracker.files.dump import load_dump

    budget = 4 << 10  # 4 KiB: 8 activations of 512 bytes
    bounded, checker = _deep_run(tmp_path, monkeypatch, budget, "bounded")
    free, unbounded = _deep_run(tmp_path, monkeypatch, math.inf, "free")
    # without a bound the reference's 97 snapshots (48 blocks' outputs + the input; each
    # block's input is the previous output, one shared snapshot) wait for the candidate
    assert unbounded.peak_resident_bytes >= 97 * 512
    assert unbounded.spilled_bytes == 0
    assert 0 < checker.peak_resident_bytes <= budget
    assert checker.spilled_bytes >= (97 - 8) * 512
    rows = _rows(bounded)
    assert rows == _rows(free)
    failing = [r["tag"] for r in rows if r["status"] == "mismatch"]
    assert "checker_layers.30" in failing and "checker_layers.29" not in failing
    # the tensors dumped for the divergences were read back from disk intact
    (b_dir,), (f_dir,) = (list((tmp_path / n).iterdir()) for n in ("bounded", "free"))
    b_dump, f_dump = load_dump(b_dir), load_dump(f_dir)
    assert len(b_dump) == len(f_dump) >= 2 * 18
    for (be, bt), (fe, ft) in zip(b_dump, f_dump, strict=True):
        assert be["tag"] == fe["tag"] and be["role"] == fe["role"]
        assert torch.equal(bt, ft)
    # the spill folder went with the run
    assert checker._store._dir.path is None or not checker._store._dir.path.exists()


def test_spilled_snapshots_compare_like_resident_ones_in_both_paths():
    import math

    ref, cand = _pair()
    with torch.no_grad():
        cand.layers[3].weight[0, 0] += 1e-3
    x = torch.randn(4, 16)
    seen = {}
    for eager in ("equal", None):
        for budget in (0, math.inf):
            checker = TensorChecker(verbose=False, eager_mode=eager, max_resident_bytes=budget)
            with (
                module_register_tensor_checker(ref, checker),
                module_register_tensor_checker(cand, checker),
                torch.no_grad(),
            ):
                ref(x)
                if budget == 0:
                    assert checker.resident_bytes == 0 and checker.spilled_bytes > 0
                    files = list(checker._store._dir.path.iterdir())
                    assert files  # written to disk, not kept
                cand(x)
            seen[(eager, budget)] = [
                (r["tag"], r["status"], r["max_abs_diff"]) for r in checker.check_equal().to_rows()
            ]
            if eager and budget == 0:
                # every pair compared and released: its spill file deleted
                gc.collect()
                weights = {"param", "buffer"}
                kept = [
                    c
                    for g in checker._groups.values()
                    if g.kind not in weights
                    for c in g.captures
                    if c.value is not None
                ]
                assert not list(checker._store._dir.path.iterdir()), kept
            assert checker.peak_resident_bytes <= budget
    first = seen[("equal", 0)]
    assert any(status == "mismatch" for _, status, _ in first)
    assert all(v == first for v in seen.values())


def test_negative_budget_is_an_input_error():
    import pytest

    from parity_tracker.errors import InputError

    with pytest.raises(InputError, match="max_resident_bytes"):
        TensorChecker(verbose=False, eager_mode="equal", max_resident_bytes=-1)
