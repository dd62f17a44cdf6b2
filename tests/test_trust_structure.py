"""Issue 13, kinds 5, 6, 8, 9: real candidate structures, each with an independent expectation.

5 packed quantized modules (weights unpacked and compared dequantized), 6 modules that take no
hooks (not captured, never absent), 8 structure differences apart from the first divergence,
9 a failure entering through a view/layout change named as a root cause.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from helpers import rows_by
from torch import nn

from parity_tracker.compare.results import structure_line
from parity_tracker.compare.verdict import first_divergence, structure_differences
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker


def _quantize_dynamic(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notices
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, torch.qint8)


def _numpy_qint8_error(w: np.ndarray, scale, zero_point) -> float:
    """max |dequant(quant(w)) - w| for affine qint8, worked out in numpy.

    Quantize: ``clip(round(w / scale) + zero_point, -128, 127)`` (round half to even, as
    ``torch.quantize_per_*``); dequantize in float32, as torch does: ``(q - zp) * scale``.
    ``scale``/``zero_point`` broadcast against ``w`` (per-channel: shaped for the channel axis).
    """
    q = np.clip(np.round(w / np.float32(scale)) + zero_point, -128, 127)
    deq = (q - zero_point).astype(np.float32) * np.asarray(scale, dtype=np.float32)
    return float(np.max(np.abs(deq.astype(np.float64) - w.astype(np.float64))))


# --------------------------------------------------------------------------- 5 packed modules


def test_dynamic_int8_linear_weights_are_unpacked_and_the_run_passes():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    cand = _quantize_dynamic(copy.deepcopy(ref))
    res = run_parity(
        ref, cand, (torch.randn(4, 16),), mode="allclose", tolerances={"*": (0.05, 0.05)},
        dump_mode=DumpMode.NOT,
    )  # fmt: skip
    rows = rows_by(res, "tag")
    assert res.passed, [(t, r["status"]) for t, r in rows.items() if r["status"] != "equal"]
    for i in (0, 2):
        w, b = rows[f"checker_{i}.weight"], rows[f"checker_{i}.bias"]
        assert (w["kind"], b["kind"]) == ("param", "param")
        assert w["status"] == "close" and b["status"] == "equal"  # fp32 bias kept as is
        packed = cand[i].weight()  # the candidate's qint8 weight
        scale, zp = packed.q_scale(), packed.q_zero_point()
        want = _numpy_qint8_error(ref[i].weight.detach().numpy(), scale, zp)
        assert w["max_abs_diff"] == pytest.approx(want, rel=1e-6)
        assert f"scale {scale}" in w["message"] and f"zero_point {zp}" in w["message"]
    # the holder of the packed params is not hooked: no "never called" rows for it
    assert not [t for t in rows if "_packed_params" in t]


def test_static_quantized_conv_weight_is_unpacked_per_channel():
    """A static int8 Conv2d (packed, per-channel scales) against its fp32 reference."""
    torch.manual_seed(1)
    ref = nn.Sequential(nn.Conv2d(2, 3, 3)).eval()
    qconv = torch.ao.nn.quantized.Conv2d(2, 3, 3)
    w = ref[0].weight.detach()
    scales = w.abs().amax(dim=(1, 2, 3)).double() / 127  # symmetric per output channel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qw = torch.quantize_per_channel(w, scales, torch.zeros(3, dtype=torch.long), 0, torch.qint8)
        qconv.set_weight_bias(qw, ref[0].bias.detach().clone())
        qconv.scale, qconv.zero_point = 0.05, 64
        x = torch.randn(1, 2, 5, 5)
        qx = torch.quantize_per_tensor(x, 0.05, 64, torch.quint8)
    cand = nn.Sequential(qconv)
    checker = TensorChecker(verbose=False)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
    ):
        ref(x)
        cand(qx)
    res = checker.check_allclose(atol=0.05, rtol=0.0)
    weight = res.get("checker_0.weight")
    want = _numpy_qint8_error(w.numpy(), scales.numpy()[:, None, None, None], 0)
    assert weight is not None and weight.status == "close"
    assert weight.comparison.max_abs_diff == pytest.approx(want, rel=1e-6)
    assert "per_channel_affine" in weight.comparison.message
    assert "axis 0" in weight.comparison.message
    assert res.get("checker_0.bias").status == "equal"


# --------------------------------------------------------------------------- 6 no hooks


class _Act(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 8), act, nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_torchscript_submodule_is_not_captured_and_never_absent():
    torch.manual_seed(0)
    ref = _Act(nn.SiLU()).eval()
    cand = copy.deepcopy(ref)
    cand.act = torch.jit.script(nn.SiLU())
    with pytest.warns(UserWarning, match="TorchScript"):
        res = run_parity(ref, cand, (torch.randn(2, 8),), dump_mode=DumpMode.NOT)
    rows = rows_by(res, "tag")
    assert res.passed
    for tag in ("checker_act", "checker_act_input_0"):
        assert rows[tag]["status"] == "skipped"
        msg = rows[tag]["message"]
        assert msg.startswith("not captured") and "TorchScript" in msg
        assert "no module named" not in msg
    # its output is read at the next captured boundary, which is equal
    assert "next captured boundary, checker_fc2_input_0" in rows["checker_act"]["message"]
    assert rows["checker_fc2_input_0"]["status"] == "equal"
    assert res.record.first_divergence is None


class _NoHooks(nn.SiLU):
    def register_forward_pre_hook(self, *a, **k):
        raise RuntimeError("hooks are not supported here")


def test_module_refusing_hooks_is_reported_with_its_reason_and_not_blamed():
    torch.manual_seed(0)
    ref = _Act(nn.SiLU()).eval()
    cand = copy.deepcopy(ref)
    cand.act = _NoHooks()
    cand.fc2.bias.data += 1.0  # a real divergence after the unhooked module
    res = run_parity(ref, cand, (torch.randn(2, 8),), dump_mode=DumpMode.NOT)
    rows = rows_by(res, "tag")
    assert rows["checker_act"]["status"] == "skipped"
    assert (
        "refused a forward hook (RuntimeError: hooks are not supported here)"
        in (rows["checker_act"]["message"])
    )
    assert res.record.first_divergence.tag == "checker_fc2"  # not act
    assert res.record.first_divergence.status == "mismatch"


# --------------------------------------------------------------------------- 8 structure

D = 8


class _FusedAttn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.out(torch.softmax(q @ k.transpose(-1, -2), -1) @ v)


class _SplitAttn(nn.Module):
    def __init__(self, fused: _FusedAttn) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(D, D) for _ in range(4))
        for i, lin in enumerate((self.q, self.k, self.v)):  # the same rows as qkv
            lin.weight.data = fused.qkv.weight.data[i * D : (i + 1) * D].clone()
            lin.bias.data = fused.qkv.bias.data[i * D : (i + 1) * D].clone()
        self.out.load_state_dict(fused.out.state_dict())

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return self.out(torch.softmax(q @ k.transpose(-1, -2), -1) @ v)


class _MLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc, self.proj = nn.Linear(D, hidden), nn.Linear(hidden, D)

    def forward(self, x):
        return self.proj(torch.relu(self.fc(x)))


class _Block(nn.Module):
    def __init__(self, attn: nn.Module, hidden: int) -> None:
        super().__init__()
        self.attn, self.mlp = attn, _MLP(hidden)

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


def test_fused_qkv_against_split_qkv_is_a_structure_difference_not_the_first_divergence(capsys):
    torch.manual_seed(0)
    ref = _Block(_FusedAttn(), 16).eval()
    cand = _Block(_SplitAttn(ref.attn), 12).eval()  # narrower mlp.fc
    res = run_parity(ref, cand, (torch.randn(2, 5, D),), mode="allclose", dump_mode=DumpMode.NOT)
    rows = rows_by(res, "tag")
    assert rows["checker_attn"]["status"] == "close" and rows["checker_attn.out"]["status"] == (
        "close"
    )
    # mlp.fc's first failing paired tag: its input is close, its output 16 vs 12 wide
    assert rows["checker_mlp.fc_input_0"]["status"] == "close"
    fd = res.record.first_divergence
    assert (fd.tag, fd.status) == ("checker_mlp.fc", "shape_mismatch")
    one_sided = {r["tag"]: r["status"] for r in res.record.structure_differences}
    # by hand: qkv's input, output, weight, bias on the reference; 3 × 4 on the candidate
    assert one_sided == {
        **{
            f"checker_attn.qkv{s}": "missing_candidate"
            for s in ("", "_input_0", ".weight", ".bias")
        },
        **{
            f"checker_attn.{n}{s}": "missing_reference"
            for n in "qkv"
            for s in ("", "_input_0", ".weight", ".bias")
        },
    }
    assert not res.passed  # a structure difference is still not parity
    assert res.record.to_dict()["structure_differences"]  # in summary.json
    # the report lists them apart; the terminal prints one line for them
    from parity_tracker.cli.terminal import print_run
    from parity_tracker.dashboards.report import render_run_report

    html = render_run_report(res)
    assert "Structure differences: 16 tag(s) on one side only" in html
    assert "<code>checker_attn.qkv</code>: reference only" in html
    capsys.readouterr()
    print_run(res, None, "sqlite:///x.db", "parity")
    out = capsys.readouterr().out
    assert "structure differences (16 tags on one side only" in out
    assert "first divergence: checker_mlp.fc " in out


def test_structure_differences_rule_and_printout_line(capsys):
    rows = [
        {"tag": "a", "status": "missing_candidate", "step": 0, "exec_order": 3, "kind": "output"},
        {"tag": "b", "status": "mismatch", "step": 0, "exec_order": 5, "kind": "output"},
        {"tag": "c", "status": "missing_reference", "step": 0, "exec_order": 1, "kind": "input"},
    ]
    assert first_divergence(rows)["tag"] == "b"
    assert [r["tag"] for r in structure_differences(rows)] == ["c", "a"]
    line = structure_line(structure_differences(rows))
    assert line == (
        "TensorChecker: structure differences (2 tags on one side only, not numeric "
        "divergences): c (candidate only), a (reference only)"
    )


def test_seed_printout_keeps_per_tag_lines_and_adds_one_structure_line(capsys):
    ref = nn.Sequential(nn.Linear(2, 2)).eval()
    cand = nn.Sequential(nn.Linear(2, 2), nn.Identity()).eval()
    cand[0].load_state_dict(ref[0].state_dict())
    checker = TensorChecker(verbose=True)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
    ):
        x = torch.ones(1, 2)
        ref(x)
        cand(x)
    capsys.readouterr()
    checker.check_equal()
    out = capsys.readouterr().out.splitlines()
    assert "TensorChecker: 2 tensors equal in checker_0" in out
    structure = [ln for ln in out if "structure differences" in ln]
    assert structure == [
        "TensorChecker: structure differences (2 tags on one side only, not numeric "
        "divergences): checker_1_input_0 (candidate only), checker_1 (candidate only)"
    ]
    assert not [ln for ln in out if "first divergence" in ln]


# --------------------------------------------------------------------------- 9 view root cause

B, T, H, DH = 2, 3, 2, 4


class _HeadMerge(nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.qkv, self.o, self.bug = nn.Linear(H * DH, 3 * H * DH), nn.Linear(H * DH, H * DH), bug

    def forward(self, x):
        q, k, v = (t.view(B, T, H, DH).transpose(1, 2) for t in self.qkv(x).split(H * DH, -1))
        a = torch.softmax(q @ k.transpose(-1, -2), -1) @ v  # (B, H, T, DH)
        merged = a.reshape(B, T, H * DH) if self.bug else a.transpose(1, 2).reshape(B, T, H * DH)
        return self.o(merged)


def test_head_merge_without_permute_is_a_case_b_root_cause_with_the_view_chain():
    torch.manual_seed(0)
    ref = _HeadMerge(bug=False).eval()
    cand = copy.deepcopy(ref)
    cand.bug = True
    x = torch.randn(B, T, H * DH)
    res = run_parity(ref, cand, (x,), capture_ops=True, dump_mode=DumpMode.NOT)
    assert not res.passed
    # by hand: the attention output is the same on both sides, only the merge differs
    with torch.no_grad():
        q, k, v = (t.view(B, T, H, DH).transpose(1, 2) for t in ref.qkv(x).split(H * DH, -1))
        a = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    assert not torch.equal(a.transpose(1, 2).reshape(B, T, -1), a.reshape(B, T, -1))
    ops = {r["tag"]: r["status"] for r in res.ops.to_pylist()}
    assert [s for t, s in ops.items() if "bmm" in t] == ["equal", "equal"]
    (cause,) = res.record.root_causes
    assert (cause["module"], cause["op"], cause["cause"]) == ("o", "addmm", "B")
    msg = cause["message"]
    assert "enters through a view/layout change" in msg
    # the reference merges (B, H, T, DH) through transpose (strides by hand) and a copy
    t_stride = (H * T * DH, DH, T * DH, 1)  # a.transpose(1, 2) of a contiguous (B, H, T, DH)
    assert f"reference view({B}, {T}, {H}, {DH}) stride {t_stride} -> clone#" in msg
    assert f"candidate view({B * T}, {H * DH}) stride ({H * DH}, 1)" in msg


def test_failing_run_with_op_capture_never_has_an_empty_root_cause_list():
    """A difference no op explains (a weight of an unused module): a fallback is named."""
    torch.manual_seed(0)

    class WithUnused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = nn.Linear(2, 2), nn.Linear(2, 2)

        def forward(self, x):
            return self.used(x)

    ref = WithUnused().eval()
    cand = copy.deepcopy(ref)
    cand.unused.weight.data += 1.0
    res = run_parity(ref, cand, (torch.randn(1, 2),), capture_ops=True, dump_mode=DumpMode.NOT)
    assert not res.passed
    (cause,) = res.record.root_causes
    assert cause["cause"] is None and cause["tag"] == "checker_unused.weight"
    assert cause["message"].startswith("no root cause proven")


def test_a_run_whose_candidate_raised_lists_no_structure_differences():
    """Tags the candidate never reached are not one-sided names: the error explains them."""

    class Boom(nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    ref = nn.Sequential(nn.Linear(2, 2), nn.ReLU()).eval()
    cand = copy.deepcopy(ref)
    cand[1] = Boom()
    res = run_parity(ref, cand, (torch.ones(1, 2),), dump_mode=DumpMode.NOT)
    assert res.record.status == "failed" and res.record.error.message == "boom"
    assert res.record.structure_differences == ()
    assert rows_by(res, "tag")["checker_model"]["status"] == "missing_candidate"


class _InputPermute(nn.Module):
    """(B, C, T) in; the reference moves channels last, the buggy candidate only reshapes."""

    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.lin, self.bug = nn.Linear(4, 5), bug

    def forward(self, x):
        b, c, t = x.shape
        h = x.reshape(b * t, c) if self.bug else x.transpose(1, 2).reshape(b * t, c)
        return self.lin(h)


class _WeightTranspose(nn.Module):
    def __init__(self, bug: bool) -> None:
        super().__init__()
        self.lin, self.bug = nn.Linear(4, 4), bug

    def forward(self, x):
        w = self.lin.weight.t() if self.bug else self.lin.weight
        return torch.nn.functional.linear(x, w, self.lin.bias)


@pytest.mark.parametrize(
    ("model", "x", "position", "ref_chain", "cand_chain"),
    [
        # a model input (2, 4, 3) read through transpose(1, 2) (strides by hand: (12, 1, 3)),
        # copied, then viewed (6, 4); the candidate views the input (6, 4) directly
        (_InputPermute, (2, 4, 3), 1,
         "reference view(2, 3, 4) stride (12, 1, 3) -> clone#0 -> view(6, 4) stride (4, 1)",
         "candidate view(6, 4) stride (4, 1)"),
        # addmm(bias, x, weight.t()): the reference reads the weight transposed (stride (1, 4))
        (_WeightTranspose, (3, 4), 2, "reference view(4, 4) stride (1, 4)",
         "candidate view(4, 4) stride (4, 1)"),
    ],
)  # fmt: skip
def test_equal_external_data_read_through_another_view_is_a_case_b_root_cause(
    model, x, position, ref_chain, cand_chain
):
    torch.manual_seed(0)
    ref = model(bug=False).eval()
    cand = copy.deepcopy(ref)
    cand.bug = True
    res = run_parity(ref, cand, (torch.randn(*x),), capture_ops=True, dump_mode=DumpMode.NOT)
    (cause,) = res.record.root_causes
    assert (cause["op"], cause["cause"], cause["status"]) == ("addmm", "B", "mismatch")
    assert f"input {position} reads the same data" in cause["message"]
    assert f"{ref_chain}; {cand_chain}" in cause["message"]
