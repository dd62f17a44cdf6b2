"""Capture that does not lie (issue 3, section 2): exact tags and statuses per case."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn

from parity_tracker.capture import Snapshotter, flatten, input_leaves, output_leaves
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker


def run_pair(reference, candidate, *args, mode="equal", eager=None, **kwargs):
    """Hook both models on a fresh checker, run each once, return {(tag, step): result}."""
    reference.eval()
    candidate.eval()
    checker = TensorChecker(verbose=False, eager_mode=eager)
    with (
        module_register_tensor_checker(reference, checker),
        module_register_tensor_checker(candidate, checker),
        torch.no_grad(),
    ):
        reference(*args, **kwargs)
        candidate(*args, **kwargs)
    result = checker.check(mode)
    return result, {r.tag: r.status for r in result.results}


def same_weights(ref: nn.Module, cand: nn.Module) -> nn.Module:
    cand.load_state_dict(ref.state_dict())
    return cand


# --------------------------------------------------------------------- key paths (pure)
def test_flatten_key_paths_and_leaves():
    t = torch.zeros(1)

    @dataclasses.dataclass
    class Out:
        a: torch.Tensor
        b: object = None

    leaves = list(flatten((t, None, 3, [t, {"k": t, "n": None}], Out(t))))
    assert [p for p, _ in leaves] == ["0", "1", "2", "3.0", "3.1.k", "3.1.n", "4.a", "4.b"]
    assert leaves[1][1] is None
    assert leaves[2][1].dtype == torch.int64 and leaves[2][1].item() == 3  # a 0-d value


def test_leaf_tags_follow_the_contract():
    t = torch.zeros(1)
    assert output_leaves("m", t) == [("checker_m", "output", t)]
    assert [x[0] for x in output_leaves("m@1", (t, t))] == [
        "checker_m@1_output_0",
        "checker_m@1_output_1",
    ]
    tags = [x[0] for x in input_leaves("blk", (t, [t, t]), {"mask": t})]
    assert tags == [
        "checker_blk_input_0",
        "checker_blk_input_1.0",
        "checker_blk_input_1.1",
        "checker_blk_input_mask",
    ]


# ------------------------------------------------------------------- keyword inputs
class KwModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = KwInner()

    def forward(self, x, scale=None, *, bias=None):
        return self.inner(x, scale=scale, bias=bias)


class KwInner(nn.Module):
    def forward(self, x, scale=None, *, bias=None):
        return x * scale + bias


def test_keyword_and_mixed_inputs_get_named_tags():
    x, s, b = torch.randn(3), torch.randn(3), torch.randn(3)
    ref, cand = KwModel().eval(), KwModel().eval()
    checker = TensorChecker(verbose=False)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
    ):
        ref(x, s, bias=b)  # mixed positional + keyword
        cand(x, s, bias=b + 1)  # the candidate gets a different keyword input
    got = {r.tag: r.status for r in checker.check("equal").results}
    assert got == {
        "checker_inner": "mismatch",
        "checker_inner_input_0": "equal",
        "checker_inner_input_scale": "equal",
        "checker_inner_input_bias": "mismatch",
        "checker_model": "mismatch",
        "checker_model_input_0": "equal",
        "checker_model_input_1": "equal",
        "checker_model_input_bias": "mismatch",
    }


# --------------------------------------------------------------- structured outputs
@dataclasses.dataclass
class DataOut:
    hidden: torch.Tensor
    extra: torch.Tensor | None = None


class Structured(nn.Module):
    def __init__(self, flavour: str):
        super().__init__()
        self.flavour = flavour

    def forward(self, x):
        if self.flavour == "tuple":
            return x * 2, None, 3, [x + 1, {"a": x - 1, "b": None}]
        if self.flavour == "tuple_none_first":
            return None, None, 3, [x + 1, {"a": x - 1, "b": None}]
        if self.flavour == "dataclass":
            return DataOut(hidden=x * 3)
        if self.flavour == "dataclass_extra":
            return DataOut(hidden=x * 3, extra=x)
        raise AssertionError(self.flavour)


class Holder(nn.Module):
    def __init__(self, flavour):
        super().__init__()
        self.sub = Structured(flavour)

    def forward(self, x):
        self.sub(x)
        return x


def test_tuple_list_dict_outputs_with_none_and_non_tensor_leaves():
    _, got = run_pair(Holder("tuple"), Holder("tuple"), torch.randn(4))
    sub = {t: s for t, s in got.items() if t.startswith("checker_sub")}
    # None leaves on both sides hold no value: no tag; the int is compared as a 0-d value
    assert sub == {
        "checker_sub_output_0": "equal",
        "checker_sub_output_2": "equal",
        "checker_sub_output_3.0": "equal",
        "checker_sub_output_3.1.a": "equal",
        "checker_sub_input_0": "equal",
    }


def test_none_against_tensor_is_a_structure_difference():
    result, got = run_pair(Holder("tuple"), Holder("tuple_none_first"), torch.randn(4))
    assert got["checker_sub_output_0"] == "shape_mismatch"
    message = result["checker_sub_output_0"].comparison.message
    assert "structure differs" in message and "None" in message
    assert got["checker_sub_output_3.0"] == "equal"


def test_dataclass_outputs_keep_none_fields():
    _, got = run_pair(Holder("dataclass"), Holder("dataclass"), torch.randn(4))
    assert got["checker_sub_output_hidden"] == "equal"
    assert "checker_sub_output_extra" not in got
    _, got = run_pair(Holder("dataclass"), Holder("dataclass_extra"), torch.randn(4))
    assert got["checker_sub_output_extra"] == "shape_mismatch"


class HFLike(nn.Module):
    def __init__(self, with_hidden: bool):
        super().__init__()
        self.with_hidden = with_hidden
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        from transformers.modeling_outputs import BaseModelOutput

        h = self.proj(x)
        hidden = (x, h) if self.with_hidden else None
        return BaseModelOutput(last_hidden_state=h, hidden_states=hidden)


@pytest.mark.slow  # importing transformers takes ~4 s
def test_hf_model_output():
    """BaseModelOutput: a dataclass and an OrderedDict; None fields are kept as structure."""
    torch.manual_seed(0)
    ref = HFLike(with_hidden=False)
    cand = same_weights(ref, HFLike(with_hidden=True))
    result, got = run_pair(ref, cand, torch.randn(2, 4))
    assert got["checker_model_output_last_hidden_state"] == "equal"
    # reference: hidden_states None; candidate: a tuple of two tensors
    assert got["checker_model_output_hidden_states.0"] == "shape_mismatch"
    assert got["checker_model_output_hidden_states.1"] == "shape_mismatch"
    assert "structure differs" in result["checker_model_output_hidden_states.0"].comparison.message
    assert "checker_model_output_attentions" not in got  # None on both sides
    assert got["checker_proj"] == "equal"


# ------------------------------------------------------------------ repeated calls
class Twice(nn.Module):
    def __init__(self, calls=2):
        super().__init__()
        self.act = nn.Tanh()
        self.calls = calls

    def forward(self, x):
        for _ in range(self.calls):
            x = self.act(x)
        return x


def test_repeated_calls_get_at_k_tags():
    result, got = run_pair(Twice(3), Twice(2), torch.randn(5))
    assert got["checker_act"] == "equal"
    assert got["checker_act_input_0"] == "equal"
    assert got["checker_act@1"] == "equal"
    assert got["checker_act@1_input_0"] == "equal"
    assert got["checker_act@2"] == "missing_candidate"
    assert got["checker_act@2_input_0"] == "missing_candidate"
    assert "ran 2 time(s) on the candidate" in result["checker_act@2"].comparison.message
    assert result["checker_act@2"].call_index == 2
    assert result["checker_act@2"].module == "act"
    assert got["checker_model"] == "mismatch"  # tanh applied 3 times vs 2


# ---------------------------------------------------------------- never called
class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(3, 3)
        self.unused = nn.Linear(3, 3)
        self.blocks = nn.ModuleList([nn.Identity()])

    def forward(self, x):
        return self.blocks[0](self.used(x))


def test_never_called_module_is_reported_not_captured():
    torch.manual_seed(0)
    ref = WithUnused()
    cand = same_weights(ref, WithUnused())
    result, got = run_pair(ref, cand, torch.randn(2, 3))
    assert got["checker_unused"] == "skipped"
    r = result["checker_unused"]
    assert "never called" in r.comparison.message
    assert not r.passed and not r.failed and r.n_tensors == 0
    assert got["checker_unused.weight"] == "equal"  # its weights are still compared
    assert "checker_blocks" not in got  # a ModuleList is a container, never called
    assert got["checker_blocks.0"] == "equal"
    assert result.passed


def test_module_called_on_one_side_only_is_missing():
    class Maybe(nn.Module):
        def __init__(self, call):
            super().__init__()
            self.call = call
            self.extra = nn.ReLU()

        def forward(self, x):
            return self.extra(x) if self.call else x

    result, got = run_pair(Maybe(True), Maybe(False), torch.randn(3))
    assert got["checker_extra"] == "missing_candidate"
    assert (
        "exists on the candidate but was not called" in result["checker_extra"].comparison.message
    )
    assert not result.passed


# ------------------------------------------------------------- in-place after capture
class ConvRelu(nn.Module):
    def __init__(self, candidate=False):
        super().__init__()
        self.body = nn.Sequential(
            BadNegConv(3, 4, 3, padding=1) if candidate else nn.Conv2d(3, 4, 3, padding=1),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        return self.body(x)


class BadNegConv(nn.Conv2d):
    """A conv that doubles negative outputs: invisible after a ReLU."""

    def forward(self, x):
        y = super().forward(x)
        return torch.where(y < 0, y * 2, y)


@pytest.mark.parametrize("eager", [None, "equal"])
def test_inplace_relu_does_not_rewrite_the_conv_capture(eager):
    torch.manual_seed(0)
    ref = ConvRelu()
    cand = same_weights(ref, ConvRelu(candidate=True))
    x = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        negatives = int((ref.body[0](x) < 0).sum())  # independent count of differing elements
    assert negatives > 0
    result, got = run_pair(ref, cand, x, eager=eager)
    assert got["checker_body.0"] == "mismatch"  # a naive hook would report equal
    assert got["checker_body.1_input_0"] == "mismatch"
    assert got["checker_body.1"] == "equal"
    assert got["checker_model"] == "equal"
    assert result["checker_body.0"].comparison.mismatch_count == negatives
    assert result.first_divergence.tag == "checker_body.0"


# ------------------------------------------------------------------ one-sided names
class Left(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(2, 2)
        self.left_only = nn.Tanh()

    def forward(self, x):
        return self.left_only(self.shared(x))


class Right(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(2, 2)
        self.right_only = nn.Tanh()

    def forward(self, x):
        return self.right_only(self.shared(x))


def test_one_sided_names_are_missing_never_a_crash():
    torch.manual_seed(0)
    ref = Left()
    cand = Right()
    cand.shared.load_state_dict(ref.shared.state_dict())
    result, got = run_pair(ref, cand, torch.randn(2))
    assert got["checker_left_only"] == "missing_candidate"
    assert got["checker_left_only_input_0"] == "missing_candidate"
    assert got["checker_right_only"] == "missing_reference"
    assert "the reference has no module named 'right_only'" in (
        result["checker_right_only"].comparison.message
    )
    assert got["checker_shared"] == "equal"
    assert got["checker_model"] == "equal"


# -------------------------------------------------------------- fused vs separate QKV
class FusedAttn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return q + k * v


class SplitQKV(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return torch.stack([self.q(x), self.k(x), self.v(x)])


class SplitAttn(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = SplitQKV()

    def forward(self, x):
        q, k, v = self.qkv(x).unbind(0)
        return q + k * v


class AttnModel(nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def forward(self, x):
        return self.attn(x)


def test_fused_qkv_against_separate_is_shape_mismatch():
    torch.manual_seed(0)
    ref = AttnModel(FusedAttn())
    cand = AttnModel(SplitAttn())
    w, b = ref.attn.qkv.weight.detach(), ref.attn.qkv.bias.detach()
    for i, lin in enumerate((cand.attn.qkv.q, cand.attn.qkv.k, cand.attn.qkv.v)):
        lin.weight.data.copy_(w[8 * i : 8 * i + 8])
        lin.bias.data.copy_(b[8 * i : 8 * i + 8])
    result, got = run_pair(ref, cand, torch.randn(3, 8), mode="allclose")
    assert got["checker_attn.qkv"] == "shape_mismatch"
    r = result["checker_attn.qkv"].comparison
    assert r.ref_shape == (3, 24) and r.cand_shape == (3, 3, 8)
    assert got["checker_attn.qkv.weight"] == "missing_candidate"
    assert got["checker_attn.qkv.q.weight"] == "missing_reference"
    assert got["checker_attn.qkv.q"] == "missing_reference"
    assert result["checker_attn"].passed  # equal or close: same values up to rounding
    assert [w.tag for w in result.weights if w.failed][:2] == [
        "checker_attn.qkv.weight",
        "checker_attn.qkv.bias",
    ]


# ------------------------------------------------------------------- tied params
class Tied(nn.Module):
    def __init__(self, tie: bool):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        if tie:
            self.head.weight = self.emb.weight
        self.block = nn.Linear(4, 4)
        self.block_again = self.block  # one module under two names

    def forward(self, idx):
        return self.head(self.block_again(self.block(self.emb(idx))))


def test_tied_and_shared_parameters_reported_once_per_qualified_name():
    torch.manual_seed(0)
    ref = Tied(tie=True)
    cand = Tied(tie=False)
    cand.load_state_dict(ref.state_dict())
    result, got = run_pair(ref, cand, torch.tensor([1, 2, 3]))
    weights = [(w.tag, w.n_tensors, w.status) for w in result.weights]
    assert weights == [
        ("checker_emb.weight", 2, "equal"),
        ("checker_block.weight", 2, "equal"),
        ("checker_block.bias", 2, "equal"),
        ("checker_block_again.weight", 2, "equal"),
        ("checker_block_again.bias", 2, "equal"),
        ("checker_head.weight", 2, "equal"),
    ]
    assert got["checker_block@1"] == "equal"  # the shared module's second call
    assert result.passed


# ----------------------------------------------------------------- training mode
def test_training_mode_warns_once():
    ref, cand = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)), nn.Sequential(nn.Linear(2, 2))
    cand.eval()
    checker = TensorChecker(verbose=False)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
    ):
        with pytest.warns(UserWarning, match="reference model Sequential is in training mode"):
            ref(torch.randn(2))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ref(torch.randn(2))  # once per handle
            cand(torch.randn(2))  # eval: no warning


# ------------------------------------------------------------------ snapshots
def test_snapshot_is_reused_only_while_unchanged():
    snap = Snapshotter()
    t = torch.arange(4.0)
    a = snap.take(t)
    assert snap.take(t) is a  # same object, same version: one copy
    t.add_(1)
    b = snap.take(t)
    assert b is not a
    assert torch.equal(a, torch.arange(4.0)) and torch.equal(b, torch.arange(4.0) + 1)
    with torch.inference_mode():
        u = torch.ones(2)
    assert snap.take(u) is not snap.take(u)  # inference tensors: no version counter, no reuse


def test_hook_handle_removes_every_hook():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    checker = TensorChecker(verbose=False)
    handle = module_register_tensor_checker(model, checker)
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 7
    handle.remove()
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0
    assert handle.removed
    model(torch.randn(2))
    assert checker.check("equal", verbose=False).results == []


def test_forward_that_raises_leaves_the_checker_usable():
    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def forward(self, x):
            self.inner(x)
            raise RuntimeError("boom")

    checker = TensorChecker(verbose=False)
    model = Boom().eval()
    module_register_tensor_checker(model, checker)
    with pytest.raises(RuntimeError, match="boom"):
        model(torch.randn(2))
    assert checker._stack == []
    checker.register_tensor("x", torch.ones(1))  # outside a forward: side by order again
    checker.register_tensor("x", torch.ones(1))
    assert checker.check("equal")["x"].status == "equal"


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torchscript_root_is_rejected_and_submodules_skipped():
    from parity_tracker.errors import InputError

    checker = TensorChecker(verbose=False)
    with pytest.raises(InputError, match="TorchScript module, which takes no Python hooks"):
        module_register_tensor_checker(torch.jit.script(nn.Linear(2, 2)), checker)
    assert checker._handles == []

    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(2, 2), torch.jit.script(nn.Sequential(nn.Linear(2, 2))))

    ref, cand = build().eval(), build().eval()
    with pytest.warns(UserWarning, match=r"not captured: 1 \(their weights"):
        _, got = run_pair(ref, cand, torch.randn(2))
    assert got["checker_0"] == "equal"
    assert got["checker_1.0.weight"] == "equal"
    assert "checker_1" not in got and "checker_1.0" not in got


@pytest.mark.slow  # imports transformers (several seconds)
def test_hf_llama_first_divergence_in_a_real_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg).eval()
    cand = same_weights(ref, LlamaForCausalLM(cfg)).eval()
    cand.model.layers[1].post_attention_layernorm.variance_epsilon = 1e-2  # the bug
    ids = torch.randint(0, 64, (1, 8))
    result, got = run_pair(ref, cand, input_ids=ids, eager="equal")
    assert result.first_divergence.tag == "checker_model.layers.1.post_attention_layernorm"
    assert all(w.status == "equal" for w in result.weights)
    # kwargs inputs, the backbone child named "model", structured outputs
    assert got["checker_root_input_input_ids"] == "equal"
    assert got["checker_model_input_input_ids"] == "equal"
    assert got["checker_model.layers.0.self_attn_input_hidden_states"] == "equal"
    assert got["checker_model.layers.0.self_attn_input_position_embeddings.0"] == "equal"
    assert got["checker_root_output_logits"] == "mismatch"
    assert got["checker_model.layers.1.post_attention_layernorm_input_0"] == "equal"
