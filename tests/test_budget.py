"""Error budgets (issue 15): the formula, the float64 golden, the twin, bugs found per module.

Expected values are computed independently: numpy float64 for the formula and the golden
model, hand-chosen bugs for the verdicts.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from parity_tracker.capture.golden import (
    fallback_reason,
    golden_copy,
    golden_mode,
    promote,
    require_deterministic,
    run_golden,
)
from parity_tracker.capture.twin import (
    budget_infeasible,
    cast_floating,
    compute_dtype,
    is_quantized,
    make_twin,
)
from parity_tracker.compare.budget import DEFAULT_K, Budgets, budget_compare, side_error
from parity_tracker.compare.tolerances import first_match
from parity_tracker.errors import EXIT_USAGE, InputError

BF16_EPS = 2.0**-7  # bfloat16 keeps 8 significant bits (7 stored)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def _expected_ratio(g, t, c, eps) -> float:
    g, t, c = _np(g), _np(t), _np(c)
    e_c, e_t = np.abs(c - g).max(), np.abs(t - g).max()
    return float(e_c / max(e_t, eps * np.abs(g).max()))


# --- the formula ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_error_ratio_matches_numpy_bf16(seed):
    gen = torch.Generator().manual_seed(seed)
    golden = torch.randn(4096, dtype=torch.float64, generator=gen) * 3
    noise = torch.randn(4096, dtype=torch.float64, generator=gen) * 0.02 * (seed + 1)
    twin, cand = golden.bfloat16(), (golden + noise).bfloat16()
    out = budget_compare(golden, twin, cand, reference=golden.float())
    want = _expected_ratio(golden, twin, cand, BF16_EPS)
    assert out.error_ratio == pytest.approx(want, rel=1e-12)
    assert out.golden_max_abs_err == pytest.approx(np.abs(_np(cand) - _np(golden)).max())
    assert out.twin_max_abs_err == pytest.approx(np.abs(_np(twin) - _np(golden)).max())
    assert out.floor == pytest.approx(BF16_EPS * np.abs(_np(golden)).max())
    assert out.status == ("close" if want <= DEFAULT_K else "mismatch")
    assert out.comparison.mode == "budget" and out.comparison.status == out.status


def test_error_ratio_fp16_uses_fp16_eps_and_max_abs_diff_vs_reference():
    gen = torch.Generator().manual_seed(7)
    golden = torch.randn(300, dtype=torch.float64, generator=gen)
    reference = golden.float()
    twin = golden.half()
    cand = (golden + 1e-3).half()
    out = budget_compare(golden, twin, cand, reference=reference)
    eps = float(np.finfo(np.float16).eps)
    assert out.error_ratio == pytest.approx(_expected_ratio(golden, twin, cand, eps), rel=1e-12)
    assert out.comparison.max_abs_diff == pytest.approx(np.abs(_np(cand) - _np(reference)).max())
    assert out.compared_dtype == "float16"


def test_verdict_and_ratio_never_disagree():
    gen = torch.Generator().manual_seed(3)
    for i in range(40):
        golden = torch.randn(64, dtype=torch.float64, generator=gen)
        cand = (golden + torch.randn(64, dtype=torch.float64, generator=gen) * 0.005 * i).bfloat16()
        out = budget_compare(golden, golden.bfloat16(), cand, reference=golden.float(), k=1.5)
        assert out.passed == (out.error_ratio <= 1.5)
        assert out.status in ("close", "mismatch")


def test_equal_when_candidate_is_the_reference_bitwise():
    golden = torch.linspace(-2, 2, 50, dtype=torch.float64)
    reference = golden.float() * 1.001  # a reference with its own error
    out = budget_compare(golden, reference, reference.clone())
    assert out.status == "equal" and out.error_ratio == pytest.approx(1.0)
    assert out.comparison.max_abs_diff == 0.0


def test_far_more_accurate_candidate_is_said_so():
    # The model rounds to bf16 (reference = twin = rounded); the engine skips the rounding.
    gen = torch.Generator().manual_seed(1)
    golden = torch.randn(1000, dtype=torch.float64, generator=gen) * 5
    reference = golden.bfloat16().float()
    cand = golden.float()
    out = budget_compare(golden, reference, cand)
    assert out.status == "close" and out.error_ratio < 0.01
    assert "far more accurate than PyTorch" in out.message
    plain = budget_compare(golden, golden.bfloat16(), golden.bfloat16(), reference=golden.float())
    assert "far more accurate" not in plain.message


def test_non_finite_rules_never_nan():
    golden = torch.tensor([1.0, 2.0, math.inf, math.nan, 0.5], dtype=torch.float64)
    twin = golden.float()
    same = budget_compare(golden, twin, twin.clone())
    assert same.golden_max_abs_err == 0.0 and same.error_ratio == 0.0
    lost = twin.clone()
    lost[0] = math.nan
    out = budget_compare(golden, twin, lost)
    assert out.error_ratio == math.inf and out.status == "mismatch"
    assert "candidate 1, twin 0" in out.message
    # both overflow: the ratio is the count of lost values, candidate over twin
    g = torch.full((6,), 6e4, dtype=torch.float64)  # < 65504, the float16 max
    t = g.half().clone()
    t[0] = math.inf
    c_one, c_three = t.clone(), t.clone()
    c_three[1:3] = math.inf
    assert budget_compare(g, t, c_one, reference=g.float()).error_ratio == 1.0
    three = budget_compare(g, t, c_three, reference=g.float())
    assert three.error_ratio == 3.0 and three.status == "mismatch"


def test_zero_golden_floor_is_zero():
    zeros = torch.zeros(8, dtype=torch.float64)
    exact = budget_compare(zeros, zeros.float(), zeros.float())
    assert exact.floor == 0.0 and exact.error_ratio == 0.0 and exact.status == "equal"
    off = zeros.float().clone()
    off[2] = 1e-30
    assert budget_compare(zeros, zeros.float(), off).error_ratio == math.inf


def test_integer_tags_are_exact():
    golden = torch.tensor([1, 2, 3])
    assert budget_compare(golden, golden, golden.clone()).status == "equal"
    out = budget_compare(golden, golden, torch.tensor([1, 2, 4]))
    assert out.status == "mismatch" and out.floor == 0.0 and out.error_ratio == math.inf


def test_shapes_and_unusable_sides():
    g = torch.zeros(4, dtype=torch.float64)
    out = budget_compare(g, torch.zeros(4), torch.zeros(5))
    assert out.status == "shape_mismatch" and out.error_ratio is None
    out = budget_compare(torch.zeros(3, dtype=torch.float64), torch.zeros(4), torch.zeros(4))
    assert out.status == "error" and "golden shape (3,)" in out.message
    assert budget_compare(g, None, torch.zeros(4)).status == "error"


def test_k_per_tag_by_glob_and_validation():
    budgets = Budgets({"decoder.up*": 4.0, "decoder*": 3.0})
    assert budgets.resolve("decoder.up_blocks.1") == 4.0
    assert budgets.resolve("decoder.mid") == 3.0
    assert budgets.resolve("encoder") == DEFAULT_K
    assert budgets.resolve("decoder.mid", k=1.5) == 1.5
    golden = torch.ones(4, dtype=torch.float64)
    twin = golden.float() + 0.01
    cand = golden.float() + 0.03  # 3x the twin's error
    assert budget_compare(golden, twin, cand, tag="encoder", budgets=budgets).status == "mismatch"
    assert budget_compare(golden, twin, cand, tag="decoder.up", budgets=budgets).status == "close"
    for bad in (0.5, math.nan, math.inf, "x"):
        with pytest.raises(InputError):
            Budgets(k=bad)
    with pytest.raises(InputError, match="'dec'"):
        Budgets({"dec": 0.0})
    assert first_match([("a*", 1), ("ab*", 2)], "abc") == 1 and first_match([], "a") is None


# --- models --------------------------------------------------------------------------------


class Net(nn.Module):
    """Conv → GroupNorm → SiLU, twice, then global mean and two Linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.norm1 = nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16)
        self.conv2, self.norm2 = nn.Conv2d(16, 16, 3, padding=1), nn.GroupNorm(4, 16)
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 10)

    def forward(self, x):
        x = F.silu(self.norm1(self.conv1(x)))
        x = F.silu(self.norm2(self.conv2(x)))
        return self.fc2(F.silu(self.fc1(x.mean((2, 3)))))


class EngineGroupNorm(nn.Module):
    """A hand-written GroupNorm: statistics in float32, output in the input's dtype."""

    def __init__(self, ref: nn.GroupNorm, eps: float | None = None) -> None:
        super().__init__()
        self.groups, self.eps = ref.num_groups, ref.eps if eps is None else eps
        self.weight, self.bias = ref.weight, ref.bias

    def forward(self, x):
        h = x.float().reshape(x.shape[0], self.groups, -1)
        mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
        y = ((h - mean) / torch.sqrt(var + self.eps)).reshape(x.shape)
        y = y * self.weight.float()[None, :, None, None] + self.bias.float()[None, :, None, None]
        return y.to(x.dtype)


class EngineLinear(nn.Module):
    """A hand-written Linear: float32 accumulation, one rounding to the input's dtype."""

    def __init__(self, ref: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = ref.weight, ref.bias

    def forward(self, x):
        return (x.float() @ self.weight.float().T + self.bias.float()).to(x.dtype)


def engine(reference: Net, norm2_eps: float | None = None) -> Net:
    cand = copy.deepcopy(reference).bfloat16()
    cand.norm1, cand.norm2 = EngineGroupNorm(cand.norm1), EngineGroupNorm(cand.norm2, norm2_eps)
    cand.fc1, cand.fc2 = EngineLinear(cand.fc1), EngineLinear(cand.fc2)
    return cand


def capture(model: nn.Module, *args) -> dict[str, torch.Tensor]:
    """Every named submodule's output and the model's output, by forward hooks."""
    out: dict[str, torch.Tensor] = {}
    handles = [
        mod.register_forward_hook(lambda m, i, o, name=name: out.__setitem__(name, o.clone()))
        for name, mod in model.named_modules()
        if name
    ]
    try:
        with torch.no_grad():
            out["output"] = model(*args)
    finally:
        for handle in handles:
            handle.remove()
    return out


def budget_by_tag(reference: nn.Module, candidate: nn.Module, x: torch.Tensor, cand_dtype):
    with golden_mode():
        golden = capture(golden_copy(reference), promote(x))
    twin = capture(make_twin(reference, cand_dtype), cast_floating(x, cand_dtype))
    ref = capture(reference, x)
    cand = capture(candidate, cast_floating(x, cand_dtype))
    assert list(golden) == list(twin) == list(cand) == list(ref)
    return {n: budget_compare(golden[n], twin[n], cand[n], reference=ref[n]) for n in golden}, (
        ref,
        cand,
    )


@pytest.fixture(scope="module")
def net_and_input():
    torch.manual_seed(0)
    return Net().eval(), torch.randn(2, 3, 16, 16)


def test_bf16_cast_model_passes_at_every_module(net_and_input):
    reference, x = net_and_input
    for candidate in (copy.deepcopy(reference).bfloat16(), engine(reference)):
        verdicts, _ = budget_by_tag(reference, candidate, x, compute_dtype(candidate))
        assert {n: v.status for n, v in verdicts.items()} == dict.fromkeys(verdicts, "close")
        assert all(v.error_ratio <= 2 for v in verdicts.values())


def test_groupnorm_eps_bug_fails_at_that_module_below_old_tolerance(net_and_input):
    reference, x = net_and_input
    verdicts, (ref, cand) = budget_by_tag(reference, engine(reference, 5e-3), x, torch.bfloat16)
    failing = [n for n, v in verdicts.items() if not v.passed]
    assert failing[0] == "norm2"
    assert all(verdicts[n].passed for n in ("conv1", "norm1", "conv2"))
    # the bug's absolute error is under the old hand-set tolerance of the nightly (0.25)
    abs_err = np.abs(_np(cand["norm2"]) - _np(ref["norm2"])).max()
    assert 0.05 < abs_err < 0.25  # measured 0.115
    assert verdicts["norm2"].error_ratio > 2


class Attn(nn.Module):
    def __init__(self, softmax: nn.Module) -> None:
        super().__init__()
        self.proj, self.softmax, self.out = nn.Linear(16, 16), softmax, nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.softmax(self.proj(x)))


class NaiveSoftmax(nn.Module):
    """Softmax without subtracting the maximum: ``exp(x) / sum(exp(x))``."""

    def forward(self, x):
        e = torch.exp(x)
        return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("scale,bad", [(1.0, False), (100.0, True)])
def test_softmax_without_max_fails_on_large_logits_only(scale, bad):
    torch.manual_seed(4)
    reference = Attn(nn.Softmax(-1)).eval()
    candidate = copy.deepcopy(reference)
    candidate.softmax = NaiveSoftmax()
    x = torch.randn(8, 16) * scale
    verdicts, _ = budget_by_tag(reference, candidate, x, torch.float32)
    failing = [n for n, v in verdicts.items() if not v.passed]
    assert verdicts["proj"].status == "equal"
    assert failing[:1] == (["softmax"] if bad else [])


# --- the golden ----------------------------------------------------------------------------


class Casting(nn.Module):
    """Casts inside its forward: ``.to(bfloat16)``, ``.half()``, autocast, softmax dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.emb = nn.Linear(4, 8), nn.Linear(8, 3), nn.Embedding(5, 8)

    def forward(self, x, idx):
        h = (self.a(x) + self.emb(idx)).to(torch.bfloat16)
        h = h.half().float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.b(h)
        return F.softmax(y, dim=-1, dtype=torch.float32), idx + 1


def _numpy_casting(m: Casting, x: torch.Tensor, idx: torch.Tensor) -> np.ndarray:
    w1, b1, w2, b2 = (_np(p) for p in (m.a.weight, m.a.bias, m.b.weight, m.b.bias))
    h = _np(x) @ w1.T + b1 + _np(m.emb.weight)[idx.numpy()]
    y = h @ w2.T + b2
    e = np.exp(y - y.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_golden_stays_float64_through_in_forward_casts():
    torch.manual_seed(2)
    model = Casting().eval()
    x, idx = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 4, 0])
    want = _numpy_casting(model, x, idx)
    run = run_golden(golden_copy(model), x, idx)
    probs, ids = run.output
    assert probs.dtype == torch.float64 and ids.dtype == torch.int64
    np.testing.assert_allclose(probs.numpy(), want, rtol=1e-12, atol=1e-15)
    assert torch.equal(ids, idx + 1) and run.random_ops == []
    # the model as written rounds: far from float64, and a plain .double() copy crashes
    assert np.abs(model(x, idx)[0].detach().double().numpy() - want).max() > 1e-4
    with pytest.raises(RuntimeError):
        copy.deepcopy(model).double()(x.double(), idx)
    assert torch.get_default_dtype() == torch.float32


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.drop = nn.Linear(4, 4), nn.Dropout(0.1)

    def forward(self, x):
        att = F.scaled_dot_product_attention(x[None], x[None], x[None], dropout_p=0.0)
        return self.drop(self.lin(x) + att[0])


def test_random_ops_are_detected_and_refused():
    model, x = Noisy(), torch.randn(3, 4)
    assert run_golden(golden_copy(model.eval()), x).random_ops == []
    random_ops = run_golden(golden_copy(model.train()), x).random_ops
    assert len(random_ops) == 1 and "bernoulli" in random_ops[0].op
    with pytest.raises(InputError, match="bernoulli") as info:
        require_deterministic(random_ops)
    assert info.value.exit_code == EXIT_USAGE
    assert "allclose" in fallback_reason(random_ops) and fallback_reason([]) is None
    require_deterministic([])
    with golden_mode() as mode:
        torch.randn(3)
    assert [c.op for c in mode.random_ops] == ["aten.randn.default"]


def test_golden_factories_and_integer_inputs():
    with golden_mode() as mode:
        made = torch.zeros(2), torch.arange(3), torch.tensor([0.1]), torch.ones(2).half()
    assert [t.dtype for t in made] == [torch.float64, torch.int64, torch.float64, torch.float64]
    assert made[2].item() == 0.1 and mode.calls > 0
    with golden_mode():
        copied = golden_copy(nn.Linear(2, 2))  # deepcopy inside the mode
    assert copied.weight.dtype == torch.float64
    tree = promote(
        {"x": torch.ones(2, dtype=torch.bfloat16), "i": torch.ones(2, dtype=torch.int32)}
    )
    assert tree["x"].dtype == torch.float64 and tree["i"].dtype == torch.int32


# --- the twin ------------------------------------------------------------------------------


def test_compute_dtype_and_twin():
    model = Net()
    assert compute_dtype(model) == torch.float32
    mixed = copy.deepcopy(model).bfloat16()
    mixed.fc2.float()  # 330 float32 elements against the rest in bf16
    assert compute_dtype(mixed) == torch.bfloat16
    assert compute_dtype(mixed, "float16") == torch.float16
    assert compute_dtype(nn.ReLU()) is None
    assert make_twin(model, torch.float32) is model and make_twin(model, None) is model
    twin = make_twin(model, "bfloat16")
    assert twin is not model and compute_dtype(twin) == torch.bfloat16
    assert compute_dtype(model) == torch.float32  # the reference is untouched
    own = nn.Linear(2, 2)
    assert make_twin(model, torch.bfloat16, twin=own) is own
    with pytest.raises(InputError, match="floating compute dtype"):
        make_twin(model, torch.int8)


def test_attention_kernel_with_default_dropout_is_not_random():
    q = torch.randn(1, 2, 4, 8)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    with golden_mode() as mode:
        out = flash(q, q, q)[0]  # dropout_p left at its schema default, 0.0
    assert mode.random_ops == [] and out.dtype == torch.float64
    dropout = torch.ops.aten.native_dropout
    with golden_mode() as mode:
        dropout(q, 0.5, False)  # train=False: deterministic
        dropout(q, 0.5, True)
    assert [c.op for c in mode.random_ops] == [str(dropout.default)]


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_budget_feasibility():
    reference = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    int8 = torch.ao.quantization.quantize_dynamic(copy.deepcopy(reference), {nn.Linear})
    assert is_quantized(int8) and not is_quantized(copy.deepcopy(reference).bfloat16())
    assert budget_infeasible(reference, reference) is None
    assert "twin=" in budget_infeasible(reference, int8)
    assert budget_infeasible(reference, int8, twin=reference) is None
    assert "not a torch.nn.Module" in budget_infeasible(lambda x: x, reference)
    holder = nn.Module()
    holder.register_buffer("w", torch.zeros(3, dtype=torch.int8))
    assert is_quantized(holder) and not is_quantized("an ONNX session")


def test_twin_reduced_to_its_error_early_gives_the_same_verdict():
    gen = torch.Generator().manual_seed(9)
    golden = torch.randn(2, 50, dtype=torch.float64, generator=gen)
    twin, reference = golden.bfloat16(), golden.float()
    cand = (golden * 1.01).bfloat16()
    scan = side_error(golden, twin)
    assert scan.max_abs_err == pytest.approx(np.abs(_np(twin) - _np(golden)).max())
    early = budget_compare(golden, scan, cand, reference=reference)
    full = budget_compare(golden, twin, cand, reference=reference)
    assert (early.status, early.error_ratio, early.floor) == (
        full.status,
        full.error_ratio,
        full.floor,
    )
    with pytest.raises(InputError, match="reference="):
        budget_compare(golden, scan, cand)
    assert "shape" in side_error(golden, twin[:1]).problem
    assert side_error(None, twin).problem.startswith("golden")


_values = st.one_of(
    st.floats(-1e4, 1e4, width=32), st.sampled_from([math.inf, -math.inf, math.nan])
)


@settings(max_examples=150, deadline=None, database=None)
@given(
    st.lists(st.tuples(_values, _values, _values), min_size=1, max_size=12),
    st.floats(1.0, 10.0),
)
def test_ratio_never_nan_and_verdict_follows_it(triples, k):
    columns = zip(*triples, strict=True)
    golden, twin, cand = (torch.tensor(col, dtype=torch.float64) for col in columns)
    out = budget_compare(golden, twin.float(), cand.bfloat16(), reference=twin.float(), k=k)
    assert not math.isnan(out.error_ratio) and out.error_ratio >= 0
    assert out.passed == (out.error_ratio <= k)


def test_chunked_passes_match_numpy(monkeypatch):
    import parity_tracker.compare.budget as budget

    monkeypatch.setattr(budget, "CHUNK", 7)  # many chunks and a ragged last one
    gen = torch.Generator().manual_seed(11)
    golden = torch.randn(100, dtype=torch.float64, generator=gen) * 10
    golden[93] = 250.0  # the largest magnitude, in the last chunk
    golden[5] = math.inf
    twin, cand = golden.bfloat16(), (golden * 1.003).bfloat16()
    out = budget_compare(golden, twin, cand, reference=golden.float())
    finite = np.isfinite(_np(golden))
    g, t, c = (_np(x)[finite] for x in (golden, twin, cand))
    want = np.abs(c - g).max() / max(np.abs(t - g).max(), BF16_EPS * 250.0)
    assert out.floor == BF16_EPS * 250.0
    assert out.error_ratio == pytest.approx(want, rel=1e-12)


def test_in_place_write_into_a_narrow_tensor_is_kept():
    buf = torch.zeros(3, dtype=torch.bfloat16)  # made outside the golden, e.g. a plain attribute
    scale = torch.tensor(0.1, dtype=torch.bfloat16)
    with golden_mode():
        buf.add_(torch.full((3,), 0.5))
        scaled = torch.full((3,), 3.0) * scale
    assert buf.dtype == torch.bfloat16 and buf.tolist() == [0.5, 0.5, 0.5]
    assert scaled.dtype == torch.float64
    assert scaled.tolist() == [3.0 * scale.item()] * 3  # the bf16 value, promoted exactly
