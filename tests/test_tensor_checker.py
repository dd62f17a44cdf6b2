"""The seed-compatible TensorChecker API (issue 3, sections 1 and 4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from parity_tracker.errors import InputError
from parity_tracker.examples import seed_demo
from parity_tracker.files.tables import MODULES_SCHEMA, rows_to_table
from parity_tracker.tensor_checker import (
    CheckResult,
    DumpMode,
    TensorChecker,
    module_register_tensor_checker,
    tensor_checker,
)

SEED_LINES = [
    "TensorChecker: 2 tensors equal in checker_conv_in",
    "TensorChecker: 2 tensors equal in checker_conv_in_input_0",
    "TensorChecker: 2 tensors not equal in checker_downsample.1",
    "TensorChecker: 2 tensors equal in checker_conv_out",
]


def subsequence(needles, haystack):
    it = iter(haystack)
    return all(any(n == h for h in it) for n in needles)


# ------------------------------------------------------------------ the seed example
def test_seed_example_prints_the_seed_lines_in_order(capsys):
    result = seed_demo.run(TensorChecker())
    lines = capsys.readouterr().out.splitlines()
    assert subsequence(SEED_LINES, lines), lines
    assert result.first_divergence is not None
    assert result.first_divergence.tag == "checker_downsample.1"
    assert not result.passed
    assert all(w.status == "equal" for w in result.weights)
    assert "weights differ" not in "\n".join(lines)
    assert lines[-1] == "TensorChecker: first divergence: checker_downsample.1 (not equal)"


def test_seed_demo_main_uses_the_shared_instance(capsys):
    assert seed_demo.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert subsequence(SEED_LINES, out)
    assert tensor_checker._groups == {}  # the demo clears the shared instance
    assert tensor_checker._handles == []


def test_seed_procedure_with_one_import_change(capsys):
    """Seed section 4, steps 1 and 2, verbatim apart from the import line."""
    from parity_tracker.tensor_checker import module_register_tensor_checker, tensor_checker

    class MyModule(nn.Module):
        def __init__(self, engine):
            super().__init__()
            self.norm = nn.LayerNorm(4)
            self.engine = engine

        def forward(self, x):
            x1 = torch.nn.functional.silu(x)
            tensor_checker.register_tensor("my_module.silu_input", x)
            tensor_checker.register_tensor("my_module.x1", x1)
            x2 = x1 * (0.5 if not self.engine else 0.5000001)
            tensor_checker.register_tensor("my_module.x2", x2)
            x3 = self.norm(x2)
            tensor_checker.register_tensor("my_module.x3", x3)
            return x3

    torch_model, dtorch_model = MyModule(False).eval(), MyModule(True).eval()
    h1 = module_register_tensor_checker(torch_model, tensor_checker)
    h2 = module_register_tensor_checker(dtorch_model, tensor_checker)
    try:
        x = torch.randn(2, 4)
        with torch.no_grad():
            torch_model(x)
            dtorch_model(x)
        result = tensor_checker.check_equal()
    finally:
        h1.remove()
        h2.remove()
        tensor_checker.clear()
    out = capsys.readouterr().out.splitlines()
    assert "TensorChecker: 2 tensors equal in my_module.x1" in out
    assert "TensorChecker: 2 tensors not equal in my_module.x2" in out
    x2 = result["my_module.x2"]
    assert x2.kind == "manual" and x2.module == "model"
    # the first failing op in execution order: x2 (registered inside the forward, before x3)
    assert result.first_divergence.tag == "my_module.x2"


# ------------------------------------------------------------------ manual registration
def test_manual_groups_first_is_reference_and_printout(capsys):
    checker = TensorChecker()
    a = torch.arange(6.0).reshape(2, 3)
    checker.register_tensor("t_equal", a)
    checker.register_tensor("t_equal", a.clone())
    checker.register_tensor("t_three", a)
    checker.register_tensor("t_three", a.clone())
    checker.register_tensor("t_three", a + 1)  # the third differs from the first
    checker.register_tensor("t_alone", a)
    checker.register_tensor("t_shape", a)
    checker.register_tensor("t_shape", a.reshape(3, 2))
    result = checker.check_equal()
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == [
        "TensorChecker: 2 tensors equal in t_equal",
        "TensorChecker: 3 tensors not equal in t_three",
        "TensorChecker: 1 tensor missing_candidate in t_alone: "
        "no candidate tensor registered for t_alone",
        out[3],
    ]
    assert out[3].startswith("TensorChecker: 2 tensors shape_mismatch in t_shape: ")
    assert [r.status for r in result.results] == [
        "equal",
        "mismatch",
        "missing_candidate",
        "shape_mismatch",
    ]
    assert result["t_three"].comparison.mismatch_count == 6
    assert result["t_alone"].comparison.ref_shape == (2, 3)


def test_allclose_printout_close_and_not_close(capsys):
    checker = TensorChecker()
    a = torch.ones(4)
    checker.register_tensor("near", a)
    checker.register_tensor("near", a + 1e-7)
    checker.register_tensor("far", a)
    checker.register_tensor("far", a + 1e-2)
    result = checker.check_allclose(rtol=1e-3, atol=1e-3)
    assert capsys.readouterr().out.splitlines()[:2] == [
        "TensorChecker: 2 tensors close in near",
        "TensorChecker: 2 tensors not close in far",
    ]
    assert result["far"].comparison.max_abs_diff == pytest.approx(1e-2, rel=1e-4)


class DLPackOnly:
    """An engine's tensor that only speaks DLPack."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, stream=None, **kwargs):
        return self._t.__dlpack__()

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


class ArrayOnly:
    def __init__(self, a):
        self._a = a

    def __array__(self, dtype=None, copy=None):
        return self._a


def test_numpy_dlpack_and_array_protocol_inputs():
    checker = TensorChecker(verbose=False)
    t = torch.linspace(0, 1, 5)
    checker.register_tensor("np", t)
    checker.register_tensor("np", t.numpy().copy())
    checker.register_tensor("dl", t)
    checker.register_tensor("dl", DLPackOnly(t.clone()))
    checker.register_tensor("arr", t)
    checker.register_tensor("arr", ArrayOnly(t.numpy()[::-1][::-1]))
    checker.register_tensor("ro", t)
    ro = t.numpy().copy()
    ro.flags.writeable = False
    checker.register_tensor("ro", ro)
    result = checker.check_equal()
    assert {r.tag: r.status for r in result.results} == dict.fromkeys(
        ["np", "dl", "arr", "ro"], "equal"
    )


def test_register_rejects_non_tensors_with_a_fix():
    checker = TensorChecker(verbose=False)
    with pytest.raises(InputError, match=r"register_tensor\('x', \.\.\.\) got a list"):
        checker.register_tensor("x", [1, 2])
    with pytest.raises(InputError, match="no torch equivalent"):
        checker.register_tensor("y", np.array(["a"], dtype=object))


def test_registration_copies_so_later_inplace_changes_do_not_matter():
    checker = TensorChecker(verbose=False)
    t = torch.zeros(3)
    checker.register_tensor("x", t)
    t.add_(1)  # would make a naive (non-copying) checker report equal
    checker.register_tensor("x", t)
    assert checker.check_equal()["x"].status == "mismatch"


def test_clear_forgets_everything():
    checker = TensorChecker(verbose=False)
    checker.register_tensor("x", torch.zeros(1))
    checker.step = 3
    checker.clear()
    assert checker.check_equal().results == []
    assert checker.step == 0


# ----------------------------------------------------------------- weights pre-flight
def test_weight_loading_error_is_reported_apart(capsys):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
    cand = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
    cand.load_state_dict(ref.state_dict())
    with torch.no_grad():
        cand[2].bias[0] += 1  # a weight-loading error
    checker = TensorChecker()
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
    ):
        ref(torch.randn(3))
        cand(torch.randn(3) * 0 + ref[0].weight[0])  # unrelated input: irrelevant here
    result = checker.check_equal()
    assert [w.tag for w in result.weights if w.failed] == ["checker_2.bias"]
    assert {w.kind for w in result.weights} == {"param"}
    out = capsys.readouterr().out
    assert "TensorChecker: weights differ: checker_2.bias (not equal)" in out
    assert result.first_divergence.kind != "param"


# -------------------------------------------------------------- results and table rows
def test_rows_match_the_modules_schema():
    result = seed_demo.run(TensorChecker(verbose=False))
    rows = result.to_rows()
    assert all(list(row) == MODULES_SCHEMA.names for row in rows)
    table = rows_to_table(rows, MODULES_SCHEMA)
    assert table.num_rows == len(result.results)
    first = result.first_divergence.to_row()
    assert first["tag"] == "checker_downsample.1"
    assert first["module"] == "downsample.1"
    assert first["kind"] == "output" and first["slot"] == "output"
    assert first["call_index"] == 0 and first["step"] == 0
    assert first["cache_hit"] is None and first["dump_path"] is None
    orders = [r.exec_order for r in result.results]
    assert len(set(orders)) == len(orders)  # one position per capture


def test_exec_order_follows_execution_not_printing():
    result = seed_demo.run(TensorChecker(verbose=False))
    order = {r.tag: r.exec_order for r in result.results}
    # inputs are captured before the forward, outputs after; children before parents
    assert order["checker_model_input_0"] < order["checker_conv_in_input_0"]
    assert order["checker_conv_in_input_0"] < order["checker_conv_in"]
    assert order["checker_downsample.1"] < order["checker_downsample"]
    assert order["checker_downsample"] < order["checker_conv_out"]


# ------------------------------------------------------------------ eager == deferred
@pytest.mark.parametrize("mode", ["equal", "allclose"])
def test_eager_and_deferred_give_identical_results(mode):
    from tests.test_capture import ConvRelu, Twice, same_weights

    def run(eager):
        checker = TensorChecker(verbose=False, eager_mode=eager)
        torch.manual_seed(0)
        r1, c1 = seed_demo.build()[:2]
        x = torch.randn(1, 3, 16, 16)
        r2 = ConvRelu().eval()
        c2 = same_weights(r2, ConvRelu(candidate=True)).eval()
        hooks = [
            module_register_tensor_checker(r1, checker),
            module_register_tensor_checker(c1, checker),
        ]
        with torch.no_grad():
            r1(x)
            c1(x)
        for h in hooks:
            h.remove()
        for ref, cand, inp in ((r2, c2, x), (Twice(3).eval(), Twice(2).eval(), x)):
            hooks = [
                module_register_tensor_checker(ref, checker),
                module_register_tensor_checker(cand, checker),
            ]
            with torch.no_grad():
                ref(inp)
                cand(inp)
            for h in hooks:
                h.remove()
        checker.register_tensor("manual", x)
        checker.register_tensor("manual", x + 1)
        return checker.check(mode).to_rows(), checker

    deferred, _ = run(None)
    eager, checker = run(mode)
    assert eager == deferred
    assert any(r["status"] not in ("equal", "close") for r in eager)
    # every pair compared eagerly let both tensors go
    paired = [g for g in checker._groups.values() if g.pairs]
    assert paired and all(not isinstance(c.value, torch.Tensor) for g in paired for c in g.captures)


def test_eager_never_clones_the_candidate(monkeypatch):
    from parity_tracker.capture import Snapshotter

    calls = []
    original = Snapshotter.take

    def counting(self, t):
        calls.append(t)
        return original(self, t)

    monkeypatch.setattr(Snapshotter, "take", counting)
    seed_demo.run(TensorChecker(verbose=False, eager_mode="equal"))
    eager_calls = len(calls)
    calls.clear()
    seed_demo.run(TensorChecker(verbose=False))
    deferred_calls = len(calls)
    # deferred: both sides snapshot their inputs/outputs/buffers; eager: the reference only
    assert eager_calls * 2 == deferred_calls


def test_eager_rejects_a_different_mode_or_tolerance():
    checker = TensorChecker(verbose=False, eager_mode="equal")
    with pytest.raises(InputError, match="eagerly in 'equal' mode"):
        checker.check("allclose")
    checker = TensorChecker(verbose=False, eager_mode="allclose", rtol=1e-3)
    with pytest.raises(InputError, match=r"rtol=0\.1 differs"):
        checker.check("allclose", rtol=0.1)
    with pytest.raises(InputError, match="eager_mode must be"):
        TensorChecker(eager_mode="auto")
    with pytest.raises(InputError, match="check mode must be"):
        TensorChecker().check("auto")


def test_eager_group_of_three_reports_released_reference():
    checker = TensorChecker(verbose=False, eager_mode="equal")
    t = torch.ones(2)
    checker.register_tensor("x", t)
    checker.register_tensor("x", t)
    checker.register_tensor("x", t)
    r = checker.check("equal")["x"]
    assert r.status == "error" and "eager_mode=None" in r.comparison.message


# --------------------------------------------------------------- align and tolerances
def test_align_is_applied_before_each_comparison():
    seen = []

    def align(tag, reference, candidate):
        seen.append(tag)
        if tag == "kv":
            return reference[..., -1:, :], candidate
        return None

    checker = TensorChecker(verbose=False, align=align)
    full = torch.randn(1, 5, 4)
    checker.register_tensor("kv", full)
    checker.register_tensor("kv", full[:, -1:, :].clone())
    checker.register_tensor("other", full)
    checker.register_tensor("other", full.clone())
    result = checker.check_equal()
    assert result["kv"].status == "equal"
    assert seen == ["kv", "other"]


def test_align_failure_is_an_error_status_not_a_crash():
    def align(tag, reference, candidate):
        raise ValueError("bad layout")

    checker = TensorChecker(verbose=False, align=align)
    checker.register_tensor("x", torch.ones(1))
    checker.register_tensor("x", torch.ones(1))
    r = checker.check_equal()["x"]
    assert r.status == "error" and "ValueError: bad layout" in r.comparison.message


def test_per_tag_tolerances_override_the_defaults():
    checker = TensorChecker(verbose=False, tolerances={"loose.*": (0.0, 0.1)})
    base = torch.zeros(3)
    for tag in ("loose.a", "strict.a"):
        checker.register_tensor(tag, base)
        checker.register_tensor(tag, base + 0.05)
    result = checker.check_allclose(rtol=0.0, atol=1e-3)
    assert result["loose.a"].status == "close"
    assert result["loose.a"].comparison.atol == 0.1
    assert result["strict.a"].status == "mismatch"


# -------------------------------------------------------------- multi-step and cache
class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Linear(4, 4)
        self.head = nn.Tanh()

    def forward(self, x, skip_block=False):
        h = x if skip_block else self.block(x)
        return self.head(h)


def test_steps_and_cache_hits():
    torch.manual_seed(0)
    ref = Denoiser().eval()
    cand = Denoiser().eval()
    cand.load_state_dict(ref.state_dict())
    checker = TensorChecker(verbose=False)
    h = [module_register_tensor_checker(m, checker) for m in (ref, cand)]
    x = torch.randn(4)
    with torch.no_grad():
        for step in range(2):
            checker.step = step
            ref(x)
            if step == 1:
                checker.mark_cache_hit("block", side=1)
            cand(x, skip_block=step == 1)
    for handle in h:
        handle.remove()
    result = checker.check_equal()
    got = {(r.tag, r.step): (r.status, r.cache_hit) for r in result.results}
    assert got[("checker_block", 0)] == ("equal", False)
    assert got[("checker_block", 1)] == ("skipped", True)
    assert got[("checker_block_input_0", 1)] == ("skipped", True)
    assert got[("checker_head_input_0", 1)] == ("mismatch", False)
    assert got[("checker_block.weight", 0)] == ("equal", False)
    assert ("checker_block.weight", 1) not in got  # weights: once per side
    assert result.first_divergence.tag == "checker_head_input_0"
    assert result.first_divergence.step == 1


def test_step_suffix_in_printout(capsys):
    checker = TensorChecker()
    checker.step = 2
    checker.register_tensor("x", torch.ones(1))
    checker.register_tensor("x", torch.ones(1))
    checker.check_equal()
    assert capsys.readouterr().out.strip() == "TensorChecker: 2 tensors equal in x at step 2"


# --------------------------------------------------------------------- sides
def test_sides_are_reused_after_handles_are_removed():
    checker = TensorChecker(verbose=False)
    a, b = nn.ReLU(), nn.ReLU()
    h1 = module_register_tensor_checker(a, checker)
    h2 = module_register_tensor_checker(b, checker)
    assert (h1.side, h2.side) == (0, 1)
    h1.remove()
    with module_register_tensor_checker(nn.Tanh(), checker) as h3:
        assert h3.side == 0
    h2.remove()
    with pytest.raises(InputError, match=r"needs a torch\.nn\.Module"):
        module_register_tensor_checker(object(), checker)


def test_explicit_side_and_candidate_first():
    """Sides decide the roles, not the order of the forwards."""
    checker = TensorChecker(verbose=False)
    ref, cand = nn.Tanh().eval(), nn.Tanh().eval()
    with (
        module_register_tensor_checker(cand, checker, side=1),
        module_register_tensor_checker(ref, checker, side=0),
    ):
        cand(torch.ones(2) * 2)  # the candidate runs first
        ref(torch.ones(2))
    r = checker.check_equal()["checker_model"]
    assert r.status == "mismatch"
    assert r.comparison.ref_shape == (2,)
    assert r.comparison.max_abs_diff == pytest.approx(float(np.tanh(2.0) - np.tanh(1.0)))


def test_check_result_helpers():
    result = CheckResult(results=[], weights=[], first_divergence=None, passed=True)
    assert result.to_rows() == [] and result.get("x") is None
    with pytest.raises(KeyError):
        result["x"]
    assert DumpMode("not_equal") is DumpMode.NOT_EQUAL


# ------------------------------------------------------------- property: eager == deferred
_VALUES = {
    "base": lambda: torch.arange(6.0).reshape(2, 3),
    "tweak": lambda: torch.arange(6.0).reshape(2, 3) + torch.tensor([0.0, 0.0, 1e-6]),
    "far": lambda: torch.arange(6.0).reshape(2, 3) * 2,
    "shape": lambda: torch.arange(6.0).reshape(3, 2),
    "int": lambda: torch.arange(6).reshape(2, 3),
    "nan": lambda: torch.tensor([[0.0, float("nan"), 2.0], [3.0, 4.0, 5.0]]),
}


@settings(max_examples=25, deadline=None)
@given(
    regs=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d"]),
            st.sampled_from([0, 1]),
            st.sampled_from(sorted(_VALUES)),
        ),
        max_size=10,
        unique_by=lambda r: (r[0], r[1]),
    ),
    mode=st.sampled_from(["equal", "allclose"]),
)
def test_eager_equals_deferred_for_any_registration_order(regs, mode):
    rows = []
    for eager in (None, mode):
        checker = TensorChecker(verbose=False, eager_mode=eager)
        for tag, side, value in regs:
            checker.register_tensor(tag, _VALUES[value](), side=side)
        rows.append(checker.check(mode).to_rows())
    assert rows[0] == rows[1]
    # and the verdicts are the ones computed by hand
    by_tag = {}
    for tag, side, value in regs:
        by_tag.setdefault(tag, {})[side] = value
    got = {r["tag"]: r["status"] for r in rows[0]}
    for tag, sides in by_tag.items():
        if set(sides) != {0, 1}:
            assert got[tag] == ("missing_candidate" if 0 in sides else "missing_reference")
            continue
        pair = {sides[0], sides[1]}
        if "shape" in pair and len(pair) == 2:
            assert got[tag] == "shape_mismatch"
        elif len(pair) == 1:
            assert got[tag] == "equal"
        elif pair in ({"base", "tweak"}, {"base", "int"}) and mode == "allclose":
            # float32 defaults (rtol 1.3e-6, atol 1e-5) cover 1e-6; int against float with
            # equal values is close, the dtype difference named in the message
            assert got[tag] == "close"
        else:
            assert got[tag] == "mismatch"


@pytest.mark.parametrize(("marked_side", "status"), [(0, "missing_candidate"), (1, "skipped")])
def test_cache_hit_counts_only_for_the_side_that_skipped(marked_side, status):
    ref, cand = Denoiser().eval(), Denoiser().eval()
    cand.load_state_dict(ref.state_dict())
    checker = TensorChecker(verbose=False)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(torch.ones(4))
        cand(torch.ones(4), skip_block=True)
        checker.mark_cache_hit("block", side=marked_side)
    r = checker.check_equal()["checker_block"]
    assert (r.status, r.cache_hit) == (status, True)


def test_half_given_tolerance_takes_the_torch_allclose_default():
    checker = TensorChecker(verbose=False)
    checker.register_tensor("x", torch.tensor([1.0]))
    checker.register_tensor("x", torch.tensor([1.0 + 5e-4]))
    r = checker.check_allclose(rtol=1e-3)["x"]  # atol = 1e-8 (torch.allclose's default)
    assert r.status == "close"
    assert (r.comparison.rtol, r.comparison.atol) == (1e-3, 1e-8)
    assert checker.check_allclose(atol=1e-4)["x"].status == "mismatch"  # rtol = 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("eager", [None, "equal"])
def test_cuda_capture_compare_and_dump(tmp_path, eager):
    checker = TensorChecker(verbose=False, eager_mode=eager, dump_mode=DumpMode.ALL)
    ref, cand, x = seed_demo.build()
    ref, cand, x = ref.cuda().to(torch.bfloat16), cand.cuda().to(torch.bfloat16), x.cuda()
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(x.to(torch.bfloat16))
        cand(x.to(torch.bfloat16))
    result = checker.check_equal(dump_mode=DumpMode.ALL, dump_path=tmp_path)
    r = result["checker_conv_in"]
    assert r.status == "equal" and r.comparison.ref_device.startswith("cuda")
    import json

    entry = json.loads((tmp_path / "check-0001" / "index.json").read_text())["files"][0]
    assert entry["device"].startswith("cuda") and entry["dtype"] == "bfloat16"
    assert entry["stored_dtype"] == "float32"


def test_repeated_checks_with_other_tolerances_are_recomputed():
    checker = TensorChecker(verbose=False)
    checker.register_tensor("x", torch.tensor([1.0]))
    checker.register_tensor("x", torch.tensor([1.0 + 5e-4]))
    verdicts = [
        checker.check_allclose(rtol=r, atol=a)["x"].status
        for r, a in [(1e-3, 0.0), (0.0, 1e-4), (1e-3, 0.0), (0.0, 1e-4)] * 3
    ]
    assert verdicts == ["close", "mismatch"] * 6
