"""Budget mode end to end (issue 15): run_parity, TensorChecker.check_budget, auto, refusals.

Expected verdicts are the hand-injected bugs' modules; ratios are checked against numpy float64
in tests/test_budget.py (the formula), here against the tables' own columns' definitions.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from parity_tracker.capture.golden import golden_copy, golden_mode
from parity_tracker.capture.twin import make_twin
from parity_tracker.errors import InputError
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker
from tests.test_budget import Attn, NaiveSoftmax, Net, engine

ENV = {"commit": "test"}


def _cast_inputs(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """The candidate casts its floating inputs as an engine would (a root pre-hook)."""
    model.register_forward_pre_hook(
        lambda _m, args: tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    )
    return model


def _run(reference, candidate, x, **kw):
    kw.setdefault("mode", "budget")
    return run_parity(reference, candidate, (x,), environment=ENV, dump_mode=DumpMode.NOT, **kw)


@pytest.fixture(scope="module")
def net_and_input():
    torch.manual_seed(0)
    return Net().eval(), torch.randn(2, 3, 16, 16)


def _rows(result) -> dict[str, dict]:
    return {r["tag"]: r for r in result.modules.to_pylist()}


def test_bf16_cast_model_passes_and_fills_the_budget_columns(net_and_input):
    reference, x = net_and_input
    cand = _cast_inputs(copy.deepcopy(reference).bfloat16(), torch.bfloat16)
    result = _run(reference, cand, x)
    rows = _rows(result)
    assert result.summary["mode"] == "budget" and result.passed
    out = rows["checker_model"]
    # the twin is the reference side (run.budget, 2026-12-01): a pure cast is bitwise PyTorch
    # at bf16, so ``equal`` (was ``close`` against the fp32 reference's forward)
    assert out["mode"] == "budget" and out["status"] == "equal"
    # the columns follow their definition: ratio = e_cand / max(e_twin, floor) <= k = 2
    assert out["golden_max_abs_err"] > 0 and out["twin_max_abs_err"] > 0
    assert out["error_ratio"] <= 2.0
    # the denominator is max(e_twin, floor) >= e_twin
    assert out["error_ratio"] <= out["golden_max_abs_err"] / out["twin_max_abs_err"] * (1 + 1e-12)
    assert all(r["error_ratio"] is not None for r in rows.values() if r["kind"] == "output")


def test_injected_bug_fails_at_that_module_below_the_old_tolerance(net_and_input):
    reference, x = net_and_input
    cand = _cast_inputs(engine(reference, norm2_eps=5e-3), torch.bfloat16)
    result = _run(reference, cand, x, settings={"quantization": "bf16"}, mode="auto")
    assert result.summary["mode"] == "budget"
    assert result.first_divergence["tag"] == "checker_norm2"
    rows = _rows(result)
    assert rows["checker_norm2"]["max_abs_diff"] < 0.25  # under the old nightly tolerance
    assert rows["checker_norm2"]["error_ratio"] > 2
    # before the bug, the engine is bitwise PyTorch at bf16, the reference side (the twin):
    # ``equal`` (was ``close`` against the fp32 reference's forward)
    assert all(rows[t]["status"] == "equal" for t in ("checker_conv1", "checker_norm1"))
    same = _run(reference, _cast_inputs(engine(reference), torch.bfloat16), x)
    assert same.passed and same.first_divergence is None


@pytest.mark.parametrize(("scale", "bad"), [(1.0, False), (100.0, True)])
def test_fp32_softmax_without_max_fails_on_large_logits_only(scale, bad):
    torch.manual_seed(4)
    reference = Attn(nn.Softmax(-1)).eval()
    candidate = copy.deepcopy(reference)
    candidate.softmax = NaiveSoftmax()
    result = _run(reference, candidate, torch.randn(8, 16) * scale,
                  settings={"implementation": "naive"}, mode="auto")  # fmt: skip
    assert result.summary["mode"] == "budget"
    fd = result.first_divergence
    assert (fd["tag"] if fd else None) == ("checker_softmax" if bad else None)


class Dropping(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return F.dropout(self.fc(x), 0.5, training=True)


def test_random_ops_refuse_explicit_budget_and_auto_falls_back():
    model, x = Dropping(), torch.randn(3, 4)
    cand = _cast_inputs(copy.deepcopy(model).bfloat16(), torch.bfloat16)
    with pytest.raises(InputError, match=r"random op aten\.bernoulli") as err:
        _run(model, cand, x)
    assert err.value.exit_code == 2
    auto = _run(model, cand, x, mode="auto", settings={"quantization": "bf16"})
    assert auto.summary["mode"] == "allclose"
    assert "random op aten.bernoulli" in auto.summary["mode_reason"]


def test_int8_without_twin_refuses_budget_and_auto_stays_allclose():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    cand = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, torch.qint8)
    x = torch.randn(4, 8)
    with pytest.raises(InputError, match="quantized"):
        _run(model, cand, x)
    auto = _run(model, cand, x, mode="auto", settings={"quantization": "int8"})
    assert auto.summary["mode"] == "allclose"
    with pytest.raises(InputError, match="not supported in budget mode"):
        _run(model, copy.deepcopy(model), x, capture_ops=True)


def test_caller_twin_and_per_tag_budgets():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).eval()
    cand = _cast_inputs(copy.deepcopy(model).half(), torch.half)
    with torch.no_grad():
        cand[2].bias += 3e-3  # ~3 fp16 ULPs at |y| ~ 1: over k=2, under k=50
    x = torch.randn(16, 8)
    strict = _run(model, cand, x)
    assert strict.first_divergence["tag"] == "checker_2"
    loose = _run(model, cand, x, budgets={"checker_2*": 50.0, "checker_model": 50.0})
    assert _rows(loose)["checker_2"]["status"] == "close"
    # a caller's twin equal to the candidate gives ratio 1 wherever the golden is not exact;
    # the twin is the reference side, so the pair is ``equal`` (was ``close`` vs the fp32 one)
    twin = _cast_inputs(copy.deepcopy(cand), torch.half)
    own = _rows(_run(model, cand, x, twin=twin))["checker_2"]
    assert own["error_ratio"] == pytest.approx(1.0) and own["status"] == "equal"


def test_check_budget_facade_with_three_checkers():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    eng = make_twin(model, torch.bfloat16)
    eng = copy.deepcopy(eng)
    with torch.no_grad():
        eng[2].bias += 0.05
    tc = TensorChecker(verbose=False)
    golden_tc, twin_tc = TensorChecker(verbose=False), TensorChecker(verbose=False)
    golden, twin = golden_copy(model), make_twin(model, torch.bfloat16)
    x = torch.randn(4, 16)
    with torch.no_grad():  # expected, before any hook: numpy float64 golden of the model
        w1, b1, w2, b2 = (p.double().numpy() for p in model.parameters())
        h = x.double().numpy() @ w1.T + b1
        h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
        e_c = np.abs(eng(x.bfloat16()).double().numpy() - (h @ w2.T + b2)).max()
    for m, c in ((model, tc), (eng, tc), (golden, golden_tc), (twin, twin_tc)):
        module_register_tensor_checker(m, c)
    with torch.no_grad():
        model(x), eng(x.bfloat16()), twin(x.bfloat16())
        with golden_mode():
            golden(x.double())
    result = tc.check_budget(golden_tc, twin_tc)
    assert result.first_divergence.tag == "checker_2"
    row = result.get("checker_2").comparison
    assert row.golden_max_abs_err == pytest.approx(e_c, rel=1e-9)
    assert row.error_ratio > 2 and math.isfinite(row.error_ratio)
    assert tc.check_budget(golden_tc, twin_tc, k=1000).passed  # repeatable, k applies


def test_a_twin_checker_reducing_to_error_scans_gives_the_same_budget():
    """``TensorChecker(reduce_to=twin_reducer(golden_log))``: the twin's tensors are kept only
    as their error against the golden. The twin's max error at the output is the numpy one,
    and every row equals that of a twin checker that keeps its tensors."""
    from parity_tracker.capture.sides import twin_reducer

    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    eng = copy.deepcopy(make_twin(model, torch.bfloat16))
    with torch.no_grad():
        eng[2].bias += 0.05
    golden, twin, x = golden_copy(model), make_twin(model, torch.bfloat16), torch.randn(4, 16)
    golden_tc = TensorChecker(verbose=False)
    kept_tc, tc_a, tc_b = (TensorChecker(verbose=False) for _ in range(3))
    reduced_tc = TensorChecker(verbose=False, reduce_to=twin_reducer(golden_tc._log))
    with torch.no_grad():  # expected, before any hook: |twin - numpy float64 golden| at the end
        w1, b1, w2, b2 = (p.double().numpy() for p in model.parameters())
        h = x.double().numpy() @ w1.T + b1
        h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
        e_twin = np.abs(twin(x.bfloat16()).double().numpy() - (h @ w2.T + b2)).max()
    for m, c in ((model, tc_a), (eng, tc_a), (model, tc_b), (eng, tc_b), (golden, golden_tc)):
        module_register_tensor_checker(m, c)
    module_register_tensor_checker(twin, kept_tc)
    with torch.no_grad():
        with golden_mode():  # first: the reducer reads the golden's captures
            golden(x.double())
        model(x), eng(x.bfloat16()), model(x), eng(x.bfloat16()), twin(x.bfloat16())
    twin2 = make_twin(model, torch.bfloat16)  # the same twin, hooked on the reducing checker
    module_register_tensor_checker(twin2, reduced_tc)
    with torch.no_grad():
        twin2(x.bfloat16())
    with pytest.raises(InputError, match="only feeds a budget"):
        reduced_tc.check("equal")
    kept = tc_a.check_budget(golden_tc, kept_tc)
    reduced = tc_b.check_budget(golden_tc, reduced_tc)
    assert reduced.get("checker_2").comparison.twin_max_abs_err == pytest.approx(e_twin, rel=1e-9)
    fields = ("status", "golden_max_abs_err", "twin_max_abs_err", "error_ratio")
    rows = [{r.tag: tuple(getattr(r.comparison, f) for f in fields) for r in res.results}
            for res in (kept, reduced)]  # fmt: skip
    assert rows[0] == rows[1] and len(rows[0]) >= 4


def test_diff_worse_also_triggers_on_the_ratio():
    from parity_tracker.analysis.diff import decide

    def one(base_ratio, head_ratio, base_mad=0.1, head_mad=0.1):
        args = dict(base_present=np.array([True]), head_present=np.array([True]),
                    base_pass=np.array([True]), head_pass=np.array([True]),
                    base_mad=np.array([base_mad]), head_mad=np.array([head_mad]),
                    eps=np.array([1e-3]), hash_changed=np.array([False]))  # fmt: skip
        return str(decide(**args, base_ratio=np.array([base_ratio]),
                          head_ratio=np.array([head_ratio]))[0])  # fmt: skip

    assert one(0.9, 1.7) == "unchanged"  # not more than 2x
    assert one(0.8, 1.7) == "worse"  # > 2x and above PyTorch's own error (1)
    assert one(0.2, 0.9) == "unchanged"  # growth below PyTorch's own error is noise
    assert one(1.0, math.inf) == "worse" and one(3.0, 1.0) == "better"
    assert one(np.nan, 5.0) == "unchanged"  # no base ratio: the mad rule alone
    assert one(np.nan, np.nan, 0.1, 0.3) == "worse"


def test_summary_and_diff_json_map_an_infinite_ratio_strictly():
    import json

    from parity_tracker.analysis.diff import diff_tables
    from parity_tracker.analysis.render import to_json
    from parity_tracker.files.tables import MODULES_SCHEMA, rows_to_table
    from parity_tracker.run.summary import ratio_metrics

    rows = [{"tag": "a", "status": "close", "error_ratio": 1.5},
            {"tag": "b", "status": "mismatch", "error_ratio": math.inf},
            {"tag": "c", "status": "equal", "error_ratio": None}]  # fmt: skip
    table = rows_to_table(rows, MODULES_SCHEMA)
    assert ratio_metrics(table) == {"worst_error_ratio": None, "worst_error_ratio_tag": "b",
                                    "error_ratio_infinite": True}  # fmt: skip
    assert ratio_metrics(rows_to_table(rows[:1], MODULES_SCHEMA))["worst_error_ratio"] == 1.5
    base = rows_to_table([{**r, "error_ratio": 1.0} for r in rows], MODULES_SCHEMA)
    text = to_json(diff_tables(base, table))
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    b = next(r for r in data["rows"] if r["tag"] == "b")
    assert b["head_error_ratio"] == "inf"  # files.jsonio: the one non-finite JSON rule


def test_report_draws_both_errors_and_states_the_budget(net_and_input):
    from dashboards.report import render_run_report

    reference, x = net_and_input
    bad = _run(reference, _cast_inputs(engine(reference, norm2_eps=5e-3), torch.bfloat16), x)
    page = render_run_report(bad)
    ratio = _rows(bad)["checker_norm2"]["error_ratio"]
    assert bad.summary["worst_error_ratio_tag"] in page
    assert "worst error_ratio" in page and "PyTorch at this precision (twin) vs golden" in page
    assert "candidate leaves PyTorch&#39;s error: checker_norm2" in page or (
        "candidate leaves PyTorch's error: checker_norm2" in page
    )
    assert bad.summary["worst_error_ratio"] >= ratio > 2
    good = _run(reference, _cast_inputs(copy.deepcopy(reference).bfloat16(), torch.bfloat16), x)
    page = render_run_report(good)  # the ratio's denominator is max(twin error, floor)
    base = "within 2× max(PyTorch's own error, floor eps·max|golden|)"
    assert base in page or base.replace("'", "&#39;") in page


def test_summary_v1_migrates_with_null_ratio_fields():
    from parity_tracker.files.tables import SUMMARY_SCHEMA_VERSION, migrate_summary

    old = {"schema_version": 1, "run_id": "r", "worst_tensor": None}
    new = migrate_summary(old)
    assert SUMMARY_SCHEMA_VERSION == 2
    assert new["worst_error_ratio"] is None and new["worst_error_ratio_tag"] is None
    assert new["error_ratio_infinite"] is None and new["run_id"] == "r"


def test_drive_with_float32_inputs_into_a_conv_runs_the_golden():
    """A drive's own float32 tensors meet the golden's float64 conv weights (conv2d checks
    dtypes before any dispatch mode): golden_copy promotes each module's inputs."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3)).eval()
    x = torch.randn(2, 1, 8, 8)

    def drive(m, rec):
        rec(0)
        m(x)

    result = run_parity(model, copy.deepcopy(model), drive=drive, mode="budget",
                        environment=ENV, dump_mode=DumpMode.NOT)  # fmt: skip
    assert result.summary["mode"] == "budget" and result.passed
    assert {r["status"] for r in result.modules.to_pylist()} == {"equal"}


def _budget_rows(copy_first: bool) -> tuple[bool, dict[str, float], list[str]]:
    """The README's facade budget check, copies made before or after registering (issue w5 #1)."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    calls: list[str] = []
    model[1].register_forward_hook(lambda m, a, o: calls.append("user"))  # the user's own hook
    eng = copy.deepcopy(make_twin(model, torch.bfloat16))
    tc = TensorChecker(verbose=False)
    golden_tc, twin_tc = TensorChecker(verbose=False), TensorChecker(verbose=False)
    if copy_first:
        golden, twin = golden_copy(model), make_twin(model, torch.bfloat16)
    module_register_tensor_checker(model, tc)
    module_register_tensor_checker(eng, tc)
    if not copy_first:  # the README, read in order: the seed section registered first
        golden, twin = golden_copy(model), make_twin(model, torch.bfloat16)
    module_register_tensor_checker(golden, golden_tc)
    module_register_tensor_checker(twin, twin_tc)
    x = torch.randn(4, 16)
    with torch.no_grad():
        model(x), eng(x.bfloat16()), twin(x.bfloat16())
        with golden_mode():
            golden(x.double())
    result = tc.check_budget(golden_tc, twin_tc)
    ratios = {r["tag"]: r["error_ratio"] for r in result.to_rows()}
    return result.passed, ratios, calls


def test_copies_made_after_registering_do_not_record_into_the_checker():
    """Main: the copies kept the checker's hooks, so the golden/twin forwards recorded into
    ``tc`` too (tags on one side only: passed False). The expected ratios are those of the
    copies made before any checker hook existed; the user's hook runs in all four models."""
    passed_before, ratios_before, calls_before = _budget_rows(copy_first=True)
    passed_after, ratios_after, calls_after = _budget_rows(copy_first=False)
    assert passed_before and passed_after
    assert ratios_after == ratios_before and len(ratios_before) >= 4
    assert calls_before == calls_after == ["user"] * 4
