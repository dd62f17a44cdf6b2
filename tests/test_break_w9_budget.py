"""Adversarial cases for budget mode's twin-as-reference-side (wave 9, w9brk1; merge cd57a7c).

Since ``run.budget`` (2026-12-01), the twin (``make_twin`` at the candidate's compute dtype, or
the caller's ``twin=``) IS the run's reference side: the user's reference forward never runs,
the reference-vs-candidate columns compare the candidate with the twin, and ``equal`` means
bitwise the twin. These cases attack it with model kinds the change's own tests do not use:
integer-only inputs (embeddings) and tied weights, BatchNorm running statistics, in-forward
casts, a mixed-precision candidate, ``compute_dtype`` overrides, a caller's fake-quant twin,
multi-step drives with keywords and nested outputs, ``align``, ``mode="auto"`` and its
fall-backs, twins that raise or share modules, the seed facade and MLflow logging.

Expected values are computed independently of the product: hand-built ``copy.deepcopy``
copies of the models (``.double()`` for the golden, ``.half()``/``.bfloat16()`` for the twin;
in-forward casts are attributes the golden copy sets to float64), captured by this file's own
forward hooks and reduced with numpy in float64 (e_cand, e_twin, floor = eps·max|golden|,
ratio, status) — never the code's own output.
"""

from __future__ import annotations

import copy
import json
import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.errors import InputError
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode

ENV = {"commit": "w9brk1"}
EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23}
K = 2.0  # the default budget factor (FlashAttention's tests)
LOW = [torch.float16, torch.bfloat16]


def _run(reference, candidate, inputs, **kw):
    kw.setdefault("mode", "budget")
    kw.setdefault("dump_mode", DumpMode.NOT)
    return run_parity(reference, candidate, inputs, environment=ENV, **kw)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def _capture(model: nn.Module, *args, **kwargs) -> dict[str, torch.Tensor]:
    """Each named submodule's tensor output and the root's (``"output"``), by forward hooks."""
    out: dict[str, torch.Tensor] = {}

    def keep(name):
        def hook(_m, _i, o):
            if isinstance(o, torch.Tensor):
                out[name] = o.detach().clone()

        return hook

    handles = [m.register_forward_hook(keep(n)) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad():
            res = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    if isinstance(res, torch.Tensor):
        out["output"] = res.detach().clone()
    return out


def _outputs(result) -> dict[tuple[str, int], dict]:
    """Output rows by (module name, step); the root is ``"output"``."""
    rows = {}
    for r in result.modules.to_pylist():
        if r["kind"] == "output":
            name = "output" if r["module"] in ("", "model") else r["module"]
            rows[(name, r["step"])] = r
    return rows


def _low(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """The lower-precision dtype of two (larger eps)."""
    return max((a, b), key=lambda d: EPS.get(d, 0.0))


def _expected(g: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> dict:
    """Budget columns of one tag from its golden, twin and candidate values (numpy float64)."""
    gn, tn, cn = _np(g), _np(t), _np(c)
    e_c, e_t = float(np.abs(cn - gn).max()), float(np.abs(tn - gn).max())
    floor = EPS[_low(c.dtype, t.dtype)] * float(np.abs(gn).max())
    den = max(e_t, floor)
    ratio = 0.0 if e_c == 0 else (math.inf if den == 0 else e_c / den)
    bitwise = c.dtype == t.dtype and torch.equal(c, t)
    status = "mismatch" if ratio > K else ("equal" if bitwise else "close")
    return dict(e_c=e_c, e_t=e_t, ratio=ratio, status=status, diff=float(np.abs(cn - tn).max()))


def _assert_row(row: dict, want: dict, name) -> None:
    assert row["status"] == want["status"], (name, row["message"])
    assert row["max_abs_diff"] == pytest.approx(want["diff"], rel=1e-12, abs=0), name
    assert row["golden_max_abs_err"] == pytest.approx(want["e_c"], rel=1e-9, abs=0), name
    assert row["twin_max_abs_err"] == pytest.approx(want["e_t"], rel=1e-9, abs=0), name
    assert row["error_ratio"] == pytest.approx(want["ratio"], rel=1e-9, abs=0), name


def _cast_in(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """An engine that casts its floating positional inputs (a root pre-hook)."""
    model.register_forward_pre_hook(
        lambda _m, a: tuple(x.to(dtype) if x.is_floating_point() else x for x in a)
    )
    return model


# --- models of kinds the change's tests do not use --------------------------------------------


class TiedLM(nn.Module):
    """Embedding → LayerNorm → Linear whose weight IS the embedding's (tied); integer inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.ln = nn.Embedding(40, 24), nn.LayerNorm(24)
        self.head = nn.Linear(24, 40, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.ln(self.emb(ids)))


class ConvBN(nn.Module):
    """Conv → BatchNorm (eval: running statistics are buffers) → ReLU → pool → Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


class RMS(nn.Module):
    """RMSNorm that upcasts inside forward (``.to(self.upcast)``) as LLaMA's does."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(n))
        self.upcast: torch.dtype | None = torch.float32  # the golden copy sets float64
        self.eps = 1e-6

    def forward(self, x):
        h = x if self.upcast is None else x.to(self.upcast)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class CastNet(nn.Module):
    """Linear → RMS (in-forward casts) → Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.norm, self.b = nn.Linear(10, 48), RMS(48), nn.Linear(48, 5)

    def forward(self, x):
        return self.b(self.norm(self.a(x) * 300))


def _tied(bug: bool, dtype):
    torch.manual_seed(11)
    ref = TiedLM().eval()
    ids = torch.randint(0, 40, (4, 9))
    cand = copy.deepcopy(ref).to(dtype)
    if bug:
        cand.ln.eps = 0.3  # a wrong LayerNorm eps, only in the candidate
    return ref, cand, (ids,), copy.deepcopy(ref).double(), (ids,), "ln"


def _bn(bug: bool, dtype):
    torch.manual_seed(12)
    ref = ConvBN()
    with torch.no_grad():
        ref.bn.running_mean.uniform_(-1, 1)
        ref.bn.running_var.uniform_(0.5, 2.0)
        ref.bn.weight.uniform_(0.5, 1.5)
    ref.eval()
    x = torch.randn(2, 3, 9, 9)
    cand = _cast_in(copy.deepcopy(ref).to(dtype), dtype)
    if bug:
        with torch.no_grad():
            cand.bn.running_var.mul_(1.05)  # a stale running variance buffer
    return ref, cand, (x,), copy.deepcopy(ref).double(), (x.double(),), "bn"


def _casts(bug: bool, dtype):
    torch.manual_seed(13)
    ref = CastNet().eval()
    x = torch.randn(6, 10)
    cand = _cast_in(copy.deepcopy(ref).to(dtype), dtype)
    if bug:
        cand.norm.upcast = None  # the norm computed without the fp32 upcast the reference does
    golden = copy.deepcopy(ref).double()
    golden.norm.upcast = torch.float64
    return ref, cand, (x,), golden, (x.double(),), "norm"


MODELS = {"tied_embedding_int_inputs": _tied, "batchnorm_buffers": _bn, "in_forward_casts": _casts}


@pytest.mark.parametrize("bug", [False, True], ids=["clean", "bug"])
@pytest.mark.parametrize("dtype", LOW, ids=["fp16", "bf16"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_verdict_matches_hand_built_golden_and_twin(kind, dtype, bug):
    ref, cand, inputs, golden_model, golden_in, bug_at = MODELS[kind](bug, dtype)
    twin_model = copy.deepcopy(ref).to(dtype)  # PyTorch at the candidate's dtype, by hand
    twin_in = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    golden = _capture(golden_model, *golden_in)
    twin = _capture(twin_model, *twin_in)
    cand_out = _capture(cand, *inputs)
    result = _run(ref, cand, inputs)
    assert result.summary["status"] == "completed"
    name = str(dtype).removeprefix("torch.")
    assert result.settings["reference_side"] == (
        f"twin (the reference at {name}; its own forward not run)"
    )
    rows = _outputs(result)
    assert {n for n, _ in rows} == set(golden)
    for n in golden:
        _assert_row(rows[(n, 0)], _expected(golden[n], twin[n], cand_out[n]), n)
    if bug and not (kind == "in_forward_casts" and dtype == torch.bfloat16):
        # (bf16: CPU's bf16 mean accumulates in fp32, so a norm without the upcast stays
        # within budget there; its rows are still checked against the hand-built sides above)
        assert rows[(bug_at, 0)]["status"] == "mismatch"
        assert result.first_divergence["module"] == bug_at
    elif not bug:
        assert {r["status"] for r in rows.values()} == {"equal"}
        assert result.passed


def test_tied_weight_stays_tied_in_the_twin_and_rows_name_both_params():
    """The twin of a tied model must keep one tensor for both names (cast_copy's memo)."""
    ref, cand, inputs, *_ = _tied(False, torch.bfloat16)
    result = _run(ref, cand, inputs)
    params = {r["tag"]: r for r in result.modules.to_pylist() if r["kind"] == "param"}
    w = _np(ref.emb.weight)
    g_vs_t = float(np.abs(_np(ref.emb.weight.bfloat16()) - w).max())
    for tag in ("checker_emb.weight", "checker_head.weight"):
        if tag in params:  # a tied weight may be listed once
            assert params[tag]["status"] == "equal"
            assert params[tag]["twin_max_abs_err"] == pytest.approx(g_vs_t, rel=1e-12)
    assert any(t in params for t in ("checker_emb.weight", "checker_head.weight"))


# --- a mixed-precision candidate and compute_dtype overrides ---------------------------------


class MP(nn.Module):
    """Linear → LayerNorm → Linear, each casting to its own weights' dtype (mixed precision)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.ln, self.b = nn.Linear(8, 64), nn.LayerNorm(64), nn.Linear(64, 4)

    def forward(self, x):
        h = self.ln(self.a(x.to(self.a.weight.dtype)).to(self.ln.weight.dtype))
        return self.b(h.to(self.b.weight.dtype))


def test_mixed_precision_candidate_fp32_layernorm_in_a_bf16_model():
    """Dominant bf16 → twin at bf16; the candidate's fp32 LayerNorm is more accurate than the
    twin's: ``close`` (dtypes differ), |Δ| vs the bf16 twin, floor from bf16's eps."""
    torch.manual_seed(21)
    ref, x = MP().eval(), torch.randn(5, 8) * 3
    cand = copy.deepcopy(ref).bfloat16()
    cand.ln.float()
    golden = _capture(copy.deepcopy(ref).double(), x.double())
    twin = _capture(copy.deepcopy(ref).bfloat16(), x)
    c = _capture(cand, x)
    result = _run(ref, cand, (x,))
    assert result.settings["reference_side"].startswith("twin (the reference at bfloat16")
    rows = _outputs(result)
    for n in golden:
        _assert_row(rows[(n, 0)], _expected(golden[n], twin[n], c[n]), n)
    assert rows[("ln", 0)]["status"] == "close" and rows[("ln", 0)]["max_abs_diff"] > 0
    assert rows[("a", 0)]["status"] == "equal"


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(12, 20), nn.Linear(20, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class Wrapped(nn.Module):
    """``inner`` run as it is (the reference's tree: ``inner``, ``inner.a``, ``inner.b``)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


class Autocasting(Wrapped):
    """fp32 weights, but every Linear runs under bf16 autocast: parameters do not tell."""

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.inner(x)


def test_compute_dtype_override_makes_a_bf16_twin_for_an_autocast_candidate():
    torch.manual_seed(22)
    ref, x = Wrapped(Plain()).eval(), torch.randn(7, 12)
    cand = Autocasting(copy.deepcopy(ref.inner)).eval()
    golden = _capture(copy.deepcopy(ref).double(), x.double())
    twin = _capture(copy.deepcopy(ref).bfloat16(), x.bfloat16())
    c = _capture(copy.deepcopy(cand), x)
    result = _run(ref, cand, (x,), settings={"compute_dtype": "bfloat16"})
    assert result.settings["reference_side"].startswith("twin (the reference at bfloat16")
    assert result.settings["compute_dtype"] == "bfloat16"
    rows = _outputs(result)
    assert {n for n, _ in rows} == set(golden)
    for n in golden:
        _assert_row(rows[(n, 0)], _expected(golden[n], twin[n], c[n]), n)


def test_compute_dtype_override_equal_to_the_reference_dtype_keeps_the_reference():
    torch.manual_seed(23)
    ref, x = Plain().eval(), torch.randn(3, 12)
    calls = []
    hook = ref.register_forward_pre_hook(lambda m, a: calls.append(m is ref))
    try:
        result = _run(ref, copy.deepcopy(ref).bfloat16(), (x.bfloat16(),),
                      settings={"compute_dtype": "float32"})  # fmt: skip
    finally:
        hook.remove()
    assert "reference_side" not in result.settings
    assert calls.count(True) == 1  # the reference itself is the twin: its forward runs


def test_compute_dtype_override_that_is_not_a_dtype_is_an_input_error():
    ref = Plain().eval()
    with pytest.raises(InputError) as err:
        _run(ref, copy.deepcopy(ref), (torch.randn(2, 12),), settings={"compute_dtype": "bf17"})
    assert err.value.exit_code == 2


# --- the caller's twin (fake-quant) ----------------------------------------------------------


def _fake_quant(model: nn.Module, rounding) -> nn.Module:
    """Symmetric per-tensor int8 fake-quant of every Linear weight, values kept in fp32."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for m in out.modules():
            if isinstance(m, nn.Linear):
                scale = m.weight.abs().max() / 127
                m.weight.copy_(rounding(m.weight / scale).clamp(-127, 127) * scale)
    return out


@pytest.mark.parametrize("rounding", ["round", "floor"])
def test_caller_fake_quant_twin_is_the_reference_side(rounding):
    torch.manual_seed(24)
    ref, x = Plain().eval(), torch.randn(9, 12)
    twin = _fake_quant(ref, torch.round)
    cand = _fake_quant(ref, getattr(torch, rounding))  # floor: a wrong rounding mode
    golden = _capture(copy.deepcopy(ref).double(), x.double())
    t, c = _capture(copy.deepcopy(twin), x), _capture(copy.deepcopy(cand), x)
    result = _run(ref, cand, (x,), twin=twin)
    assert result.settings["reference_side"] == (
        "twin (the caller's twin; the reference's own forward not run)"
    )
    rows = _outputs(result)
    for n in golden:
        _assert_row(rows[(n, 0)], _expected(golden[n], t[n], c[n]), n)
    if rounding == "round":
        assert result.passed and {r["status"] for r in rows.values()} == {"equal"}


def test_twin_is_the_reference_object_is_not_recorded_as_not_run():
    torch.manual_seed(25)
    ref, x = Plain().eval(), torch.randn(2, 12)
    calls = []
    hook = ref.register_forward_pre_hook(lambda m, a: calls.append(m is ref))
    try:
        result = _run(ref, copy.deepcopy(ref), (x,), twin=ref)
    finally:
        hook.remove()
    assert calls.count(True) == 1  # the reference's own forward did run (as the twin)
    assert "not run" not in result.settings.get("reference_side", "")


def test_a_module_shared_between_the_callers_twin_and_the_candidate_is_refused():
    torch.manual_seed(26)
    ref, x = Plain().eval(), torch.randn(2, 12)
    cand = copy.deepcopy(ref).bfloat16()
    twin = copy.deepcopy(ref).bfloat16()
    twin.b = cand.b  # the twin holds one of the candidate's modules
    calls = []
    hook = cand.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        with pytest.raises(InputError, match=r"shares module objects .*\bb\b") as err:
            _run(ref, _cast_in(cand, torch.bfloat16), (x,), twin=twin)
    finally:
        hook.remove()
    assert err.value.exit_code == 2 and calls == []  # refused before the candidate ran


# --- drives: multi-step, keywords, nested outputs --------------------------------------------


class Stepper(nn.Module):
    """Keyword arguments and a dict/tuple/list output; state carried between steps."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 16), nn.Linear(16, 3)
        self.bug_step: int | None = None

    def forward(self, x, *, scale=1.0, state=None):
        h = torch.tanh(self.a(x) * scale)
        if state is not None:
            h = h + 0.5 * state
        out = self.b(h)
        if self.bug_step is not None and scale == 0.5 * (self.bug_step + 1):
            out = out + 0.05  # a bug at one step only
        return {"out": out, "aux": (h, [h.sum(-1)])}


XS = [torch.randn(4, 6, generator=torch.Generator().manual_seed(s)) for s in range(3)]


def _drive(model, rec=None):
    dtype = next(model.parameters()).dtype
    state, outs = None, []
    for i, x in enumerate(XS):
        if rec is not None:
            rec(i)
        o = model(x.to(dtype), scale=0.5 * (i + 1), state=state)
        state = o["aux"][0]
        outs.append(o)
    return outs


@pytest.mark.parametrize("dtype", LOW, ids=["fp16", "bf16"])
def test_multi_step_drive_with_keywords_and_nested_outputs(dtype):
    torch.manual_seed(27)
    ref = Stepper().eval()
    cand = copy.deepcopy(ref).to(dtype)
    cand.bug_step = 2
    with torch.no_grad():
        golden = _drive(copy.deepcopy(ref).double())
        twin = _drive(copy.deepcopy(ref).to(dtype))
        c = _drive(copy.deepcopy(cand))
    result = run_parity(ref, cand, drive=_drive, mode="budget", environment=ENV,
                        dump_mode=DumpMode.NOT)  # fmt: skip
    assert result.summary["status"] == "completed"
    by = {(r["tag"], r["step"]): r for r in result.modules.to_pylist()}
    for step in range(3):
        leaves = {
            "checker_model_output_out": lambda o: o["out"],
            "checker_model_output_aux.0": lambda o: o["aux"][0],
            "checker_model_output_aux.1.0": lambda o: o["aux"][1][0],
        }
        for tag, leaf in leaves.items():
            want = _expected(leaf(golden[step]), leaf(twin[step]), leaf(c[step]))
            _assert_row(by[(tag, step)], want, (tag, step))
    assert by[("checker_model_output_out", 2)]["status"] == "mismatch"
    assert by[("checker_model_output_out", 1)]["status"] == "equal"
    fd = result.first_divergence
    assert fd["step"] == 2 and fd["tag"] == "checker_model_output_out"


def test_candidate_drive_differs_from_the_twin_drive():
    """The twin is driven by ``drive``; the candidate by its own ``candidate_drive``."""
    torch.manual_seed(28)
    ref = Stepper().eval()
    cand = copy.deepcopy(ref).half()
    seen = []

    def cand_drive(model, rec):
        seen.append(model is cand)
        _drive(model, rec)

    result = run_parity(ref, cand, drive=_drive, candidate_drive=cand_drive, mode="budget",
                        environment=ENV, dump_mode=DumpMode.NOT)  # fmt: skip
    assert seen == [True] and result.passed
    assert result.settings["reference_side"].startswith("twin (the reference at float16")


class Flat(nn.Module):
    """Returns its output flattened when ``flat`` (``align`` reshapes it back)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.flat = nn.Linear(5, 6), False

    def forward(self, x):
        y = torch.sigmoid(self.a(x)) * 4
        return y.reshape(-1) if self.flat else y


def test_align_reshapes_the_candidate_against_the_twin():
    torch.manual_seed(29)
    ref, x = Flat().eval(), torch.randn(3, 5)
    cand = _cast_in(copy.deepcopy(ref).half(), torch.half)
    cand.flat = True

    def align(tag, r, c):
        return (r, c.reshape(r.shape)) if r.shape != c.shape else None

    g = copy.deepcopy(ref).double()(x.double()).detach()
    t = copy.deepcopy(ref).half()(x.half()).detach()
    row = _outputs(_run(ref, cand, (x,), align=align))[("output", 0)]
    _assert_row(row, _expected(g, t, t), "output")  # the candidate is bitwise the twin
    assert row["status"] == "equal"


# --- mode="auto": budget or fall back (and then the reference's own forward runs) ------------


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return self.a(x) + 0.0 * torch.rand_like(x)  # a random op the golden would call


AUTO = {
    "budget": ({"quantization": "bf16"}, Plain, {}, "budget"),
    "cache_blocks": ({"quantization": "bf16", "cache": "on"}, Plain, {}, "allclose"),
    "random_op": ({"quantization": "bf16"}, Noisy, {}, "allclose"),
    "isolate": ({"quantization": "bf16"}, Plain, {"isolate": True}, "allclose"),
    "capture_ops": ({"quantization": "bf16"}, Plain, {"capture_ops": True}, "allclose"),
}


@pytest.mark.parametrize("case", sorted(AUTO))
def test_auto_picks_budget_or_falls_back_and_the_reference_side_follows(case):
    settings, cls, kw, want_mode = AUTO[case]
    torch.manual_seed(30)
    ref = cls().eval()
    in_features = ref.a.in_features
    x = torch.randn(3, in_features)
    cand = _cast_in(copy.deepcopy(ref).bfloat16(), torch.bfloat16)
    calls = []
    hook = ref.register_forward_pre_hook(lambda m, a: calls.append(m is ref))
    try:
        result = _run(ref, cand, (x,), mode="auto", settings=settings, **kw)
    finally:
        hook.remove()
    assert result.summary["mode"] == want_mode, result.summary["mode_reason"]
    if want_mode == "budget":
        assert calls.count(True) == 0 and "reference_side: twin" in result.summary["mode_reason"]
        assert result.settings["reference_side"].startswith("twin (the reference at bfloat16")
        return
    assert "reference_side" not in result.settings
    assert "reference_side" not in result.summary["mode_reason"]
    assert calls.count(True) >= 1  # the user's reference (fp32) is the reference side
    row = _outputs(result)[("output", 0)]
    with torch.no_grad():
        want = float(np.abs(_np(ref(x)) - _np(cand(x))).max())  # vs the fp32 reference
    assert row["max_abs_diff"] == pytest.approx(want, rel=1e-12, abs=0)
    assert row["error_ratio"] is None
    if case == "random_op":
        assert "aten.rand_like" in result.summary["mode_reason"]


def test_explicit_budget_with_a_random_op_is_refused_before_any_side_runs():
    torch.manual_seed(31)
    ref = Noisy().eval()
    cand = _cast_in(copy.deepcopy(ref).bfloat16(), torch.bfloat16)
    calls = []
    hook = cand.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        with pytest.raises(InputError, match="rand_like") as err:
            _run(ref, cand, (torch.randn(2, 4),))
    finally:
        hook.remove()
    assert err.value.exit_code == 2 and calls == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_integer_only_inputs_and_a_same_dtype_candidate_keep_the_reference(dtype):
    """No twin model: the reference itself is the twin, its forward runs, no reference_side."""
    torch.manual_seed(32)
    ref = TiedLM().eval().to(dtype)
    ids = torch.randint(0, 40, (2, 5))
    cand = copy.deepcopy(ref)
    with torch.no_grad():
        cand.ln.bias += 1e-3  # another implementation, slightly off
    golden = _capture(copy.deepcopy(ref).double(), ids)
    r, c = _capture(copy.deepcopy(ref), ids), _capture(copy.deepcopy(cand), ids)
    result = _run(ref, cand, (ids,))
    assert "reference_side" not in result.settings
    rows = _outputs(result)
    for n in golden:
        if dtype == torch.float64:  # golden == reference: e_twin 0, floor = eps64·max|g|
            gn, cn = _np(golden[n]), _np(c[n])
            e_c = float(np.abs(cn - gn).max())
            floor = 2.0**-52 * float(np.abs(gn).max())
            assert rows[(n, 0)]["error_ratio"] == pytest.approx(e_c / floor if e_c else 0.0)
        else:
            _assert_row(rows[(n, 0)], _expected(golden[n], r[n], c[n]), n)


# --- failures of the twin side -----------------------------------------------------------------


class HardFloat(nn.Module):
    """Upcasts to a hard-coded float32 before its Linear: cannot run with bf16 weights."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.b(self.a(x).float())


class HardFloatEngine(HardFloat):
    """The engine: casts back to its own weights' dtype (it runs at bf16)."""

    def forward(self, x):
        return self.b(self.a(x.to(self.a.weight.dtype)).float().to(self.b.weight.dtype))


def test_a_twin_that_raises_with_inputs_is_the_reference_sides_failure():
    """An explicit ``mode="budget"`` keeps the twin's failure (``auto`` falls back: below)."""
    mode = "budget"
    torch.manual_seed(33)
    ref, x = HardFloat().eval(), torch.randn(3, 4)
    cand = HardFloatEngine().eval()
    cand.load_state_dict(ref.state_dict())
    cand.bfloat16()
    calls = []
    hook = cand.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        result = _run(ref, cand, (x,), mode=mode, settings={"quantization": "bf16"})
    finally:
        hook.remove()
    s = result.summary
    assert s["mode"] == "budget" and s["status"] == "failed" and not result.passed
    assert s["error"]["side"] == "reference" and s["error"]["type"] == "RuntimeError"
    assert calls == []  # a raising side stops the run before the candidate
    json.loads(json.dumps(s, allow_nan=False))  # strict JSON
    statuses = {r["status"] for r in result.modules.to_pylist()}
    assert statuses <= {"missing_candidate", "missing_reference", "error"}


# --- the seed facade --------------------------------------------------------------------------


def test_check_budget_facade_same_dtype_other_implementation():
    """``TensorChecker.check_budget(golden)`` with no twin checker: the reference is the twin.
    An fp32 softmax without the max subtraction, on large logits, vs PyTorch's softmax."""
    from parity_tracker.capture.golden import golden_copy, golden_mode
    from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

    class Soft(nn.Module):
        def __init__(self, naive: bool = False) -> None:
            super().__init__()
            self.a, self.naive = nn.Linear(6, 8), naive

        def forward(self, x):
            z = self.a(x)
            if self.naive:
                e = torch.exp(z)
                return e / e.sum(-1, keepdim=True)
            return torch.softmax(z, -1)

    torch.manual_seed(34)
    ref = Soft().eval()
    cand = Soft(naive=True).eval()
    cand.load_state_dict(ref.state_dict())
    x = torch.randn(4, 6) * 12  # logits up to ~±60: exp overflows only past 88 in fp32
    with torch.no_grad():
        g = torch.softmax(copy.deepcopy(ref).double().a(x.double()), -1)
        r, c = ref(x), cand(x)
    want = _expected(g, r, c)
    tc, gtc = TensorChecker(verbose=False), TensorChecker(verbose=False)
    golden = golden_copy(ref)
    for m, chk in ((ref, tc), (cand, tc), (golden, gtc)):
        module_register_tensor_checker(m, chk)
    with torch.no_grad():
        ref(x), cand(x)
        with golden_mode():
            golden(x.double())
    res = tc.check_budget(gtc)
    cmp = res.get("checker_model").comparison
    assert cmp.status == want["status"]
    assert cmp.golden_max_abs_err == pytest.approx(want["e_c"], rel=1e-9)
    assert cmp.twin_max_abs_err == pytest.approx(want["e_t"], rel=1e-9)
    assert cmp.error_ratio == pytest.approx(want["ratio"], rel=1e-9)


# --- reproducer material, MLflow ---------------------------------------------------------------


def test_failing_budget_run_keeps_a_reproducer_without_warning(tmp_path, recwarn):
    torch.manual_seed(35)
    ref, x = Plain().eval(), torch.randn(3, 12)
    cand = _cast_in(copy.deepcopy(ref).bfloat16(), torch.bfloat16)
    with torch.no_grad():
        cand.b.bias += 0.2
    result = _run(ref, cand, (x,), dump_mode=None, dump_path=tmp_path)
    assert result.first_divergence["module"] == "b"
    assert not [w for w in recwarn if "reproducer" in str(w.message)]
    kept = list(tmp_path.rglob("repro/kept.json"))
    assert kept and json.loads(kept[0].read_text(), parse_constant=_no_constant)
    # the module reproducer is rebuilt from the reference side: the twin (bf16 weights)
    from safetensors.torch import load_file

    from parity_tracker.files import repro_lib

    (folder,) = [p.parent for p in tmp_path.rglob("repro.json")]
    state = load_file(str(folder / "state_dict.safetensors"))
    assert torch.equal(state["weight"], ref.b.weight.detach().bfloat16())
    with pytest.raises(AssertionError, match="Linear b output 0"):
        repro_lib.check(folder)  # the +0.2 bias bug vs PyTorch at bf16


def _no_constant(name: str):
    raise AssertionError(f"non-strict JSON constant {name}")


@pytest.mark.slow
def test_mlflow_logging_of_a_twin_reference_side_run(tmp_path, in_tmp_cwd, sqlite_tracking_uri):
    from parity_tracker.run.mode import config_fingerprint
    from parity_tracker.track import log_run
    from parity_tracker.track.store import get_client

    torch.manual_seed(36)
    ref, x = CastNet().eval(), torch.randn(4, 10)
    cand = _cast_in(copy.deepcopy(ref).bfloat16(), torch.bfloat16)
    cell = {"target": "castnet", "quantization": "bf16", "candidate": "eager"}
    budget = _run(ref, cand, (x,), mode="auto", settings=cell)
    plain = _run(ref, cand, (x,), mode="allclose", settings=cell)
    assert budget.summary["mode"] == "budget" and "reference_side" not in plain.settings
    run_id = log_run(budget, tracking_uri=sqlite_tracking_uri, experiment="w9brk1",
                     spool_dir=tmp_path / "spool")  # fmt: skip
    run = get_client(sqlite_tracking_uri).get_run(run_id)
    params, tags = run.data.params, run.data.tags
    assert params["reference_side"] == "twin (the reference at bfloat16; its own forward not run)"
    # the fingerprint of the cell is that of the same settings without the param (baselines)
    assert params["config_fingerprint"] == config_fingerprint(cell)
    assert params["config_fingerprint"] == plain.summary["config_fingerprint"]
    for value in [*params.values(), *tags.values()]:
        if value[:1] in "[{":
            json.loads(value, parse_constant=_no_constant)
    assert "NaN" not in json.dumps(budget.summary) and "Infinity" not in json.dumps(
        budget.summary, allow_nan=True
    )


# --- non-finite ratios, float inputs the twin rounds, auto with a twin that cannot run --------


class Blow(nn.Module):
    """Linear → ×scale → Linear; an fp16 engine that forgets to scale down overflows."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)
        self.up = 1.0

    def forward(self, x):
        return self.b(self.a(x) * self.up)


def test_fp16_overflow_only_in_the_candidate_is_an_infinite_ratio_in_strict_json():
    torch.manual_seed(37)
    ref, x = Blow().eval(), torch.randn(3, 4)
    cand = _cast_in(copy.deepcopy(ref).half(), torch.half)
    cand.up = 1e5  # the engine's bug: values past fp16's 65504
    with torch.no_grad():
        c = cand.a(x.half()) * cand.up
    assert torch.isinf(c).any()  # the candidate loses values the golden and twin keep
    result = _run(ref, cand, (x,))
    rows = _outputs(result)
    assert rows[("a", 0)]["status"] == "equal"
    fd = result.first_divergence
    assert fd["status"] == "mismatch" and rows[("b", 0)]["error_ratio"] == math.inf
    assert result.summary["error_ratio_infinite"] is True
    json.loads(json.dumps(result.summary, allow_nan=False), parse_constant=_no_constant)


class Timestep(nn.Module):
    """A diffusion-style sinusoidal embedding of a float timestep ``t`` (kept fp32 by engines)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.out = nn.Linear(16, 16), nn.Linear(16, 4)
        self.bug = 0.0

    def forward(self, x, t):
        freqs = torch.exp(-math.log(10000.0) * torch.arange(8, dtype=t.dtype) / 8)
        arg = t[:, None] * freqs[None]
        emb = torch.cat([arg.sin(), arg.cos()], -1).to(x.dtype)
        return self.out(torch.relu(self.proj(x) + emb)) + self.bug


@pytest.mark.xfail(
    strict=True,
    reason="w9brk1 bug 2 (silent pass; since issue 15, kept by cd57a7c): the twin's inputs are "
    "cast_floating(inputs, bf16), so a float timestep 999.0 becomes 1000.0 in the twin only; "
    "its sinusoidal embedding is then far off the golden (e_twin 0.219 at the output), and a "
    "candidate whose output is 0.1 off (a real bug: ratio 12.3 against PyTorch at bf16 with "
    "the caller's fp32 timestep, e_twin 0.004) is 'close' (ratio 0.48). run/budget.py "
    "_twin_inputs / capture/twin.py cast_floating",
)
def test_a_float_timestep_rounded_in_the_twin_only_hides_a_bug():
    torch.manual_seed(38)
    ref = Timestep().eval()
    x, t = torch.randn(3, 16), torch.tensor([999.0, 517.0, 3.0])
    cand = copy.deepcopy(ref).bfloat16()
    cand.bug = 0.1
    cand.register_forward_pre_hook(lambda m, a: (a[0].bfloat16(), a[1]))  # t stays fp32
    with torch.no_grad():  # PyTorch at bf16 as the user runs it: t kept in fp32
        g = copy.deepcopy(ref).double()(x.double(), t.double())
        tw = copy.deepcopy(ref).bfloat16()(x.bfloat16(), t)
        c = cand(x, t)
    want = _expected(g, tw, c)
    assert want["status"] == "mismatch"  # independent: the bug is ≫ 2x PyTorch's own error
    row = _outputs(_run(ref, cand, (x, t)))[("output", 0)]
    assert row["status"] == "mismatch", row["message"]


def test_auto_falls_back_to_allclose_when_the_twin_cannot_run():
    """w9brk1 bug 3: ``auto`` whose twin cannot run at the candidate's dtype (a hard-coded
    ``.float()`` before a Linear) compares by allclose against the user's reference (issue 15),
    the candidate run once, its max |Δ| the numpy one, the reason in ``mode_reason``."""
    torch.manual_seed(39)
    ref, x = HardFloat().eval(), torch.randn(3, 4)
    cand = HardFloatEngine().eval()
    cand.load_state_dict(ref.state_dict())
    cand.bfloat16()
    calls = []
    hook = cand.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        result = _run(ref, cand, (x,), mode="auto", settings={"quantization": "bf16"})
    finally:
        hook.remove()
    s = result.summary
    assert s["status"] == "completed" and s["mode"] == "allclose" and calls == [1]
    assert "the twin could not run (RuntimeError: " in s["mode_reason"]
    assert "compared by allclose instead" in s["mode_reason"]
    assert "reference_side" not in s["settings"]
    row = _outputs(result)[("output", 0)]
    with torch.no_grad():
        want = float(np.abs(_np(ref(x)) - _np(cand(x))).max())
    assert row["max_abs_diff"] == pytest.approx(want, rel=1e-12, abs=0)


@pytest.mark.slow
def test_cli_mode_budget_on_the_tiny_target(in_tmp_cwd, sqlite_tracking_uri, monkeypatch):
    from test_cli import run_json

    from parity_tracker.track.store import get_client

    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_tracking_uri)
    monkeypatch.delenv("PARITY_TEST_PERTURB", raising=False)
    res, out = run_json("--quantization", "bf16", "--mode", "budget", "--commit", "c1")
    assert res.exit_code == 0
    json.loads(res.stdout, parse_constant=_no_constant)
    s = out["summary"]
    assert s["mode"] == "budget" and s["passed"]
    side = "twin (the reference at bfloat16; its own forward not run)"
    assert s["settings"]["reference_side"] == side
    params = get_client(sqlite_tracking_uri).get_run(out["run_id"]).data.params
    assert params["reference_side"] == side
    _, out2 = run_json("--quantization", "bf16", "--mode", "allclose", "--commit", "c2")
    assert "reference_side" not in out2["summary"]["settings"]
    assert out2["summary"]["config_fingerprint"] == s["config_fingerprint"]


# --- an int8 candidate with the caller's twin, a spilled golden, dumps of the twin side --------


def test_int8_dynamic_candidate_with_a_callers_twin_under_auto():
    """quantize_dynamic (int8 weights, dynamic activations) with a weight-only fake-quant twin:
    auto picks budget (a twin is set), rows match the hand-built sides, weights are compared
    dequantized against the twin's fake-quantized fp32 weights."""
    torch.manual_seed(40)
    ref, x = Plain().eval(), torch.randn(6, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantize_dynamic's deprecation notice
        cand = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(ref), {nn.Linear}, dtype=torch.qint8
        )
    twin = _fake_quant(ref, torch.round)
    settings = {"quantization": "int8", "twin": "fake-quant"}
    result = _run(ref, cand, (x,), mode="auto", settings=settings, twin=twin)
    assert result.summary["mode"] == "budget"
    assert result.settings["reference_side"].startswith("twin (the caller's twin")
    golden = _capture(copy.deepcopy(ref).double(), x.double())
    t, c = _capture(copy.deepcopy(twin), x), _capture(cand, x)
    rows = _outputs(result)
    for n in golden:
        _assert_row(rows[(n, 0)], _expected(golden[n], t[n], c[n]), n)
    weights = {r["tag"]: r for r in result.modules.to_pylist() if r["kind"] == "param"}
    w_c = cand.a.weight().dequantize()
    want = float(np.abs(_np(w_c) - _np(twin.a.weight)).max())
    assert weights["checker_a.weight"]["max_abs_diff"] == pytest.approx(want, rel=1e-12, abs=0)


def test_a_golden_that_spills_gives_the_same_verdicts(monkeypatch):
    import parity_tracker.run.budget as budget

    monkeypatch.setattr(budget, "GOLDEN_RESIDENT_BYTES", 256)  # every golden capture spills
    ref, cand, inputs, golden_model, golden_in, _ = _bn(True, torch.bfloat16)
    golden = _capture(golden_model, *golden_in)
    twin = _capture(copy.deepcopy(ref).bfloat16(), inputs[0].bfloat16())
    c = _capture(cand, *inputs)
    rows = _outputs(_run(ref, cand, inputs))
    for n in golden:
        _assert_row(rows[(n, 0)], _expected(golden[n], twin[n], c[n]), n)
    assert rows[("bn", 0)]["status"] == "mismatch"


def test_dumped_reference_tensors_are_the_twins(tmp_path):
    torch.manual_seed(41)
    ref, x = Plain().eval(), torch.randn(3, 12)
    cand = _cast_in(copy.deepcopy(ref).bfloat16(), torch.bfloat16)
    with torch.no_grad():
        cand.b.bias += 0.2
    result = _run(ref, cand, (x,), dump_mode=DumpMode.ALL, dump_path=tmp_path, keep_repro=0)
    with torch.no_grad():
        twin = copy.deepcopy(ref).bfloat16()(x.bfloat16())
    (found,) = list(tmp_path.rglob("checker_model__ref.npy"))
    np.testing.assert_array_equal(np.load(found).astype(np.float64), _np(twin))
    assert result.first_divergence["module"] == "b"


class Big(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 3)

    def forward(self, x):
        return self.a(x)


class ClampLinear(nn.Linear):
    """An fp16 engine's Linear: fp32 math, clamped to fp16's range, plus a large bug."""

    bug = 1000.0

    def forward(self, x):
        y = nn.functional.linear(x.float(), self.weight.float(), self.bias.float())
        finite = y.clamp(-65504, 65504)
        return torch.where(finite.abs() < 60000, finite + self.bug, finite).half()


def test_one_overflow_in_the_twin_does_not_excuse_every_other_element():
    ref = Big().eval()
    with torch.no_grad():
        ref.a.weight.copy_(torch.tensor([[1.0, 0.3], [0.2, 1.0], [5e4, 5e4]]))
        ref.a.bias.zero_()
    x = torch.tensor([[1.0, 1.0], [0.5, -0.25]])  # golden out[0, 2] = 1e5: inf in fp16
    cand = copy.deepcopy(ref).half()
    engine = ClampLinear(2, 3).half()
    engine.load_state_dict(cand.a.state_dict())
    cand.a = engine
    cand = _cast_in(cand, torch.half)
    with torch.no_grad():
        g = _np(copy.deepcopy(ref).double()(x.double()))
        t = _np(copy.deepcopy(ref).half()(x.half()))
        c = _np(cand(x))
    kept = np.isfinite(t)
    assert (~kept).sum() == 1  # PyTorch at fp16 loses exactly one value
    # independent: on the elements PyTorch at fp16 keeps, the candidate is 1000 off
    e_c, e_t = np.abs(c - g)[kept].max(), np.abs(t - g)[kept].max()
    floor = EPS[torch.float16] * np.abs(g).max()
    assert e_c / max(e_t, floor) > 4 * K  # ≈ 10.2: 1000 over a floor of 97.7
    row = _outputs(_run(ref, cand, (x,)))[("output", 0)]
    assert row["status"] == "mismatch", row["message"]


class KW(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 10), nn.Linear(10, 2)

    def forward(self, x, scale=1.0, ids=None):
        h = torch.sigmoid(self.a(x)) * scale
        if ids is not None:
            h = h + ids.to(h.dtype)[:, None]
        return self.b(h)


@pytest.mark.parametrize("form", ["mapping", "single_tensor", "tuple_with_ints"])
def test_input_forms_reach_the_twin_cast_and_the_candidate_raw(form):
    torch.manual_seed(42)
    ref = KW().eval()
    x, ids = torch.randn(4, 6), torch.tensor([0, 3, 1, 2])
    cand = copy.deepcopy(ref).half()
    cand.register_forward_pre_hook(
        lambda m, a, k: (
            tuple(t.half() if torch.is_tensor(t) and t.is_floating_point() else t for t in a),
            {
                n: v.half() if torch.is_tensor(v) and v.is_floating_point() else v
                for n, v in k.items()
            },
        ),
        with_kwargs=True,
    )
    inputs = {
        "mapping": {"x": x, "scale": 3.0, "ids": ids},
        "single_tensor": x,
        "tuple_with_ints": (x, 3.0, ids),
    }[form]
    args, kw = (
        ((), inputs)
        if form == "mapping"
        else ((x,), {})
        if form == "single_tensor"
        else (inputs, {})
    )

    def half(v):
        return v.half() if torch.is_tensor(v) and v.is_floating_point() else v

    def wide(v):
        return v.double() if torch.is_tensor(v) and v.is_floating_point() else v

    g = _capture(
        copy.deepcopy(ref).double(), *map(wide, args), **{k: wide(v) for k, v in kw.items()}
    )
    t = _capture(copy.deepcopy(ref).half(), *map(half, args), **{k: half(v) for k, v in kw.items()})
    c = _capture(copy.deepcopy(cand), *args, **kw)
    rows = _outputs(_run(ref, cand, inputs))
    for n in g:
        _assert_row(rows[(n, 0)], _expected(g[n], t[n], c[n]), n)
        assert rows[(n, 0)]["status"] == "equal"


class CountingLinear(nn.Linear):
    """A Linear that goes wrong on its second call of a forward (a stale-state bug)."""

    calls = 0

    def forward(self, x):
        self.calls += 1
        y = super().forward(x)
        return y + 0.25 if self.calls % 2 == 0 else y


class Twice(nn.Module):
    """One Linear called twice per forward: tags ``checker_a`` and ``checker_a@1``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x):
        return self.b(torch.tanh(self.a(torch.tanh(self.a(x) * 3))))


def test_a_module_called_twice_is_judged_per_call_against_its_own_golden():
    torch.manual_seed(43)
    ref, x = Twice().eval(), torch.randn(4, 8)
    cand = copy.deepcopy(ref).bfloat16()
    bad = CountingLinear(8, 8).bfloat16()
    bad.load_state_dict(cand.a.state_dict())
    cand.a = bad
    cand = _cast_in(cand, torch.bfloat16)
    per_call: dict[str, list] = {"g": [], "t": [], "c": []}

    def calls(model, inp, key):
        h = model.a.register_forward_hook(lambda m, i, o: per_call[key].append(o.clone()))
        with torch.no_grad():
            model(inp)
        h.remove()

    calls(copy.deepcopy(ref).double(), x.double(), "g")
    calls(copy.deepcopy(ref).bfloat16(), x.bfloat16(), "t")
    calls(copy.deepcopy(cand), x, "c")  # a copy: its own call counter starts at 0
    result = _run(ref, cand, (x,))
    by = {r["tag"]: r for r in result.modules.to_pylist() if r["kind"] == "output"}
    for i, tag in enumerate(("checker_a", "checker_a@1")):
        _assert_row(by[tag], _expected(per_call["g"][i], per_call["t"][i], per_call["c"][i]), tag)
    assert by["checker_a"]["status"] == "equal" and by["checker_a@1"]["status"] == "mismatch"
    assert result.first_divergence["tag"] == "checker_a@1"


class CastsInside(nn.Module):
    """Receives the run's fp32 inputs and casts them itself (no pre-hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return self.a(x.to(self.a.weight.dtype))


def test_root_input_row_of_a_candidate_that_casts_inside_compares_cast_and_raw_inputs():
    """The twin's root input is ``x`` cast to bf16, the candidate's is ``x`` itself: that row
    now differs by bf16's rounding of ``x`` (before cd57a7c it was the module ``a``'s input)."""
    torch.manual_seed(44)
    ref, x = CastsInside().eval(), torch.randn(3, 4)
    result = _run(ref, copy.deepcopy(ref).bfloat16(), (x,))
    rows = {r["tag"]: r for r in result.modules.to_pylist() if r["kind"] == "input"}
    root = rows["checker_model_input_0"]
    assert root["max_abs_diff"] == float(np.abs(_np(x.bfloat16()) - _np(x)).max())
    assert root["status"] == "close" and root["error_ratio"] == 0.0
    assert rows["checker_a_input_0"]["status"] == "equal"


def test_an_exact_side_has_a_positive_zero_error():
    torch.manual_seed(44)
    ref, x = CastsInside().eval(), torch.randn(3, 4)
    result = _run(ref, copy.deepcopy(ref).bfloat16(), (x,))
    root = {r["tag"]: r for r in result.modules.to_pylist()}["checker_model_input_0"]
    assert math.copysign(1.0, root["golden_max_abs_err"]) == 1.0  # |x - x| max = +0.0
    assert "golden -0 " not in root["message"]


@pytest.mark.parametrize("kind", ["function", "string"])
def test_a_twin_that_is_not_a_module_is_refused_by_name_before_the_golden(kind):
    torch.manual_seed(45)
    ref, x = Plain().eval(), torch.randn(2, 12)
    other = copy.deepcopy(ref)
    twin = (lambda inp: other(inp)) if kind == "function" else "fake-quant"
    calls = []
    hook = ref.register_forward_pre_hook(lambda m, a: calls.append(a[0].dtype))  # copied
    try:
        with pytest.raises(InputError, match=r"\btwin\b") as err:
            _run(ref, copy.deepcopy(ref), (x,), twin=twin)
    finally:
        hook.remove()
    assert err.value.exit_code == 2
    assert calls == []  # no golden forward (float64) ran before the refusal


def test_a_module_shared_by_twin_and_candidate_is_named_as_the_twins_before_the_golden():
    torch.manual_seed(26)
    ref, x = Plain().eval(), torch.randn(2, 12)
    cand = copy.deepcopy(ref).bfloat16()
    twin = copy.deepcopy(ref).bfloat16()
    twin.b = cand.b
    calls = []
    hook = ref.register_forward_pre_hook(lambda m, a: calls.append(a[0].dtype))  # copied
    try:
        with pytest.raises(InputError, match=r"\btwin\b"):
            _run(ref, _cast_in(cand, torch.bfloat16), (x,), twin=twin)
    finally:
        hook.remove()
    assert calls == []  # refused before the float64 golden forward
