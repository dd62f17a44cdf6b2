"""run_parity: one injected divergence located; modes; failures kept; multi-step; tables built."""

from __future__ import annotations

import json
import re
import tempfile

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.errors import InputError
from parity_tracker.files.tables import MODULES_SCHEMA, OPS_SCHEMA
from parity_tracker.pipeline.case import ParityCase
from parity_tracker.run import choose_mode, config_fingerprint, run_case, run_parity
from parity_tracker.tensor_checker import DumpMode

ENV = {"git_commit": "c0ffee", "git_branch": "main", "git_dirty": False}


@pytest.fixture(autouse=True)
def _temp_folder_in_tmp_path(tmp_path, monkeypatch):
    """Default dumps and spills (``tempfile.gettempdir()``) land in this test's ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(exist_ok=True)


def _statuses(result) -> dict[str, str]:
    return {r["tag"]: r["status"] for r in result.modules.to_pylist()}


def _no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_injected_divergence_is_located(tiny_pair, tmp_path):
    reference, candidate, (x,) = tiny_pair
    result = run_parity(
        reference, candidate, (x,), settings={"target": "tiny"}, dump_path=tmp_path / "d",
        environment=ENV,
    )  # fmt: skip
    # Independent expectation (numpy float64 on the float32 values): fc2's input is
    # h = relu(fc1(x)) on the reference and float32(h * 1.001) on the candidate.
    w1, b1 = reference.fc1.weight.detach().numpy(), reference.fc1.bias.detach().numpy()
    h = np.maximum(x.numpy() @ w1.T + b1, 0).astype(np.float32)
    h_cand = (h * np.float32(1.001)).astype(np.float32)
    want_diff = np.abs(h_cand.astype(np.float64) - h.astype(np.float64))
    st = _statuses(result)
    failing = {t for t, s in st.items() if s != "equal"}
    assert failing == {"checker_fc2_input_0", "checker_fc2", "checker_model"}
    assert len(st) == 12  # 4 modules' outputs+inputs (fc1, act, fc2, model: 8) + 4 weights
    row = next(r for r in result.modules.to_pylist() if r["tag"] == "checker_fc2_input_0")
    assert row["max_abs_diff"] == pytest.approx(want_diff.max(), rel=1e-12)
    assert row["mismatch_count"] == int((want_diff > 0).sum())
    assert row["step"] == 0 and row["run_id"] == result.run_id
    fd = result.first_divergence
    assert (fd["tag"], fd["module"], fd["kind"], fd["step"]) == (
        "checker_fc2_input_0", "fc2", "input", 0,
    )  # fmt: skip
    # everything executed before fc2's input is equal
    orders = {r["tag"]: r["exec_order"] for r in result.modules.to_pylist()}
    assert all(orders[t] < fd["exec_order"] for t, s in st.items() if s == "equal"
               and not t.startswith("checker_fc2."))  # fmt: skip
    with torch.no_grad():
        out_diff = (candidate(x).double() - reference(x).double()).abs().max().item()
    s = result.summary
    assert s["output_max_abs_diff"] == pytest.approx(out_diff, rel=1e-12)
    assert s["output_equal"] is False and s["output_sqnr_db"] > 0
    assert (s["tensors_compared"], s["tensors_passing"], s["tensors_failing"]) == (12, 9, 3)
    assert s["counts"]["mismatch"] == 3 and s["counts"]["equal"] == 9
    assert s["status"] == "completed" and s["error"] is None and not result.passed
    assert (s["mode"], result.settings["mode"]) == ("equal", "equal")
    assert s["environment"] == ENV and s["config_fingerprint"] == config_fingerprint(
        {"target": "tiny"}
    )
    assert result.modules.schema.equals(MODULES_SCHEMA)
    assert result.ops.num_rows == 0 and result.ops.schema.equals(OPS_SCHEMA)
    json.dumps(s, allow_nan=False)  # strict JSON
    # dumps: NOT_EQUAL by default, artifact-relative paths under tensors/
    dumped = {r["tag"]: r["dump_path"] for r in result.modules.to_pylist() if r["dump_path"]}
    assert set(dumped) == failing
    for p in dumped.values():
        assert p.startswith("tensors/") and (result.dump_dir / p.removeprefix("tensors/")).is_file()
    assert (result.dump_dir / "index.json").is_file()
    assert _no_hooks(reference) and _no_hooks(candidate)
    modules_df, ops_df = result.to_pandas()
    assert len(modules_df) == 12 and len(ops_df) == 0


def test_identical_pair_passes_with_null_sqnr(tiny_equal_pair):
    reference, candidate, inputs = tiny_equal_pair
    result = run_parity(reference, candidate, inputs, settings={}, environment=ENV)
    assert result.passed and result.first_divergence is None
    assert set(_statuses(result).values()) == {"equal"}
    s = result.summary
    assert s["output_equal"] is True and s["output_max_abs_diff"] == 0.0
    assert s["output_sqnr_db"] is None  # infinite SQNR is not JSON: None + output_equal
    assert result.dump_dir is None


@pytest.mark.parametrize(
    ("settings", "mode", "why"),
    [
        ({}, "equal", "no quantization"),
        ({"quantization": "none", "cache": "off", "distributed": "none"}, "equal", "no "),
        ({"quantization": "int8"}, "allclose", "integer quantization needs a twin"),
        ({"quantization": "int8", "twin": "fake-quant"}, "budget", "quantization=int8"),
        ({"quantization": "bf16"}, "budget", "error budget"),
        ({"quantization": "bf16", "cache": "kv"}, "allclose", "cache=kv"),
        ({"cache": "first_block"}, "allclose", "cache=first_block"),
        ({"distributed": "tp2"}, "allclose", "not supported for sharded runs yet"),
        ({"random": True}, "allclose", "random=True"),
        ({"random": False}, "equal", "no "),
        ({"implementation": "onnxruntime"}, "budget", "implementation=onnxruntime"),
        ({"implementation": "same"}, "equal", "no "),
    ],
)
def test_auto_mode_follows_seed_section_2(settings, mode, why):
    chosen, reason = choose_mode(settings)
    assert chosen == mode and why in reason


def test_explicit_mode_wins_and_bad_mode_is_input_error(tiny_pair):
    assert choose_mode({"quantization": "int8"}, "equal") == (
        "equal", "mode=equal requested explicitly",
    )  # fmt: skip
    with pytest.raises(InputError, match="mode must be"):
        choose_mode({}, "bitwise")
    reference, candidate, inputs = tiny_pair
    r = run_parity(reference, candidate, inputs, settings={"cache": "kv"}, environment=ENV,
                   dump_mode=DumpMode.NOT)  # fmt: skip
    assert r.summary["mode"] == "allclose" and "cache=kv" in r.summary["mode_reason"]
    # a 1e-3 relative change fails float32 allclose defaults (rtol 1.3e-6, atol 1e-5)
    assert _statuses(r)["checker_fc2_input_0"] == "mismatch"
    assert _statuses(r)["checker_fc1"] == "equal"


def test_fingerprint_ignores_environment_and_mode():
    base = {"target": "t", "candidate": "c", "quantization": "none", "device": "cpu"}
    fp = config_fingerprint(base)
    assert re.fullmatch(r"[0-9a-f]{16}", fp)
    assert config_fingerprint({**base, "git_commit": "x", "mode": "equal"}) == fp
    assert config_fingerprint(dict(reversed(list(base.items())))) == fp
    assert config_fingerprint({**base, "quantization": "int8"}) != fp
    assert config_fingerprint({**base, "dtype": "bfloat16"}) != fp


class _Raises(nn.Module):
    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    def forward(self, x):
        raise self.exc


def test_candidate_forward_raising_keeps_what_was_compared(tiny_pair):
    reference, candidate, inputs = tiny_pair
    fc2 = candidate.fc2
    candidate.fc2 = _Raises(NotImplementedError("kernel addmm_int4 not implemented"))
    candidate.fc2.weight, candidate.fc2.bias = fc2.weight, fc2.bias
    result = run_parity(reference, candidate, inputs, settings={}, environment=ENV)
    s = result.summary
    assert s["status"] == "failed" and not result.passed
    assert s["error"]["type"] == "NotImplementedError"
    assert s["error"]["message"] == "kernel addmm_int4 not implemented"
    assert s["error"]["side"] == "candidate" and "addmm_int4" in s["error"]["traceback"]
    st = _statuses(result)
    for tag in ("checker_fc1", "checker_fc1_input_0", "checker_act", "checker_act_input_0"):
        assert st[tag] == "equal"  # compared before the exception: kept
    assert st["checker_fc2_input_0"] == "mismatch"  # fc2's input was captured, then it raised
    for tag in ("checker_fc2", "checker_model"):
        assert st[tag] == "missing_candidate"
        msg = next(r["message"] for r in result.modules.to_pylist() if r["tag"] == tag)
        assert "NotImplementedError: kernel addmm_int4 not implemented" in msg
    assert _no_hooks(reference) and _no_hooks(candidate)


def test_keyboard_interrupt_returns_killed_result(tiny_pair):
    reference, candidate, inputs = tiny_pair
    candidate.act = _Raises(KeyboardInterrupt())
    result = run_parity(reference, candidate, inputs, settings={}, environment=ENV)
    assert result.summary["status"] == "killed"
    assert result.error["type"] == "KeyboardInterrupt"
    assert _statuses(result)["checker_fc1"] == "equal"
    assert _no_hooks(reference) and _no_hooks(candidate)


def test_reference_forward_raising_is_failed_too(tiny_pair):
    reference, candidate, _ = tiny_pair
    result = run_parity(reference, candidate, (torch.zeros(5, 7),), settings={}, environment=ENV)
    assert result.summary["status"] == "failed"
    assert result.error["side"] == "reference" and result.error["type"] == "RuntimeError"


class _Stepper(nn.Module):
    """y = lin(x); the candidate variant adds 1e-3 on step 2 only (a stale-cache bug)."""

    def __init__(self, bug_step: int | None = None) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.bug_step = bug_step
        self.step = 0

    def forward(self, x):
        y = self.lin(x)
        return y + 1e-3 if self.step == self.bug_step else y


def _drive(model, rec):
    x = torch.ones(2, 3)
    for k in range(3):
        with rec(k):
            model.step = k
            x = model(x)
            rec.register("latent", x)


def test_multi_step_drive_records_steps():
    torch.manual_seed(0)
    reference = _Stepper()
    candidate = _Stepper(bug_step=2)
    candidate.load_state_dict(reference.state_dict())
    result = run_parity(reference, candidate, drive=_drive, settings={}, environment=ENV)
    rows = result.modules.to_pylist()
    assert sorted({r["step"] for r in rows}) == [0, 1, 2]
    by = {(r["tag"], r["step"]): r["status"] for r in rows}
    for k in (0, 1):
        assert by[("checker_lin", k)] == "equal" and by[("latent", k)] == "equal"
    assert by[("checker_model", 2)] == "mismatch" and by[("latent", 2)] == "mismatch"
    assert by[("checker_lin", 2)] == "equal"
    assert next(r["kind"] for r in rows if r["tag"] == "latent") == "manual"
    fd = result.first_divergence
    assert (fd["tag"], fd["step"]) == ("checker_model", 2)
    assert result.summary["steps"] == 3


def test_foreign_candidate_takes_part_through_register():
    torch.manual_seed(0)
    reference = nn.Linear(3, 2)
    w, b = reference.weight.detach().numpy(), reference.bias.detach().numpy()
    x = torch.randn(4, 3)

    def ref_drive(model, rec):
        rec.register("logits", model(x))

    def foreign_drive(session, rec):  # e.g. an onnxruntime session: numpy in, numpy out
        rec.register("logits", session(x.numpy()))

    result = run_parity(
        reference, lambda a: (a.astype(np.float64) @ w.T + b).astype(np.float32),
        drive=ref_drive, candidate_drive=foreign_drive, settings={"implementation": "numpy"},
        environment=ENV,
    )  # fmt: skip
    logits = next(r for r in result.modules.to_pylist() if r["tag"] == "logits")
    assert result.summary["mode"] == "budget"  # another implementation: error budget (issue 15)
    assert logits["status"] in ("close", "equal") and logits["error_ratio"] <= 2.0
    # hooked reference tags have no candidate side
    assert _statuses(result)["checker_model"] == "missing_candidate"
    with pytest.raises(InputError, match="candidate_drive"):
        run_parity(reference, object(), (x,), settings={})


def test_isolate_separates_local_from_inherited_error(tiny_pair):
    reference, candidate, inputs = tiny_pair
    result = run_parity(reference, candidate, inputs, settings={}, isolate=True,
                        dump_mode=DumpMode.NOT, environment=ENV)  # fmt: skip
    local = {r["tag"]: r["local_status"] for r in result.modules.to_pylist()}
    assert local["checker_fc2"] == "equal"  # fc2 itself is right: it inherited the error
    assert local["checker_model"] == "mismatch"  # the scaling lives in model.forward
    assert local["checker_fc1"] is None  # not failing: not isolated


def test_capture_ops_finds_the_injected_op(tiny_pair):
    reference, candidate, inputs = tiny_pair
    result = run_parity(reference, candidate, inputs, settings={}, capture_ops=True,
                        dump_mode=DumpMode.NOT, environment=ENV)  # fmt: skip
    assert result.ops.num_rows > 0 and result.ops.schema.equals(OPS_SCHEMA)
    first = result.summary["root_causes"][0]
    assert first["op"] == "mul" and first["module"] == "model"
    # the checker's own snapshots/compares are not recorded as ops
    assert not {"clone", "sum"} & set(result.ops.column("op").to_pylist())


def test_run_case_and_training_flags_restored(tiny_equal_pair):
    reference, candidate, inputs = tiny_equal_pair
    reference.add_module("drop", nn.Dropout(0.5))  # unused by forward; train flag restored
    reference.train()
    candidate.eval()
    case = ParityCase(reference, candidate, inputs=inputs, settings={"target": "tiny"})
    result = run_case(case, environment=ENV)
    assert result.passed and result.settings["target"] == "tiny"
    assert reference.training and reference.drop.training and not candidate.training


class _Cached(nn.Module):
    """block runs at step 0 and is reused from a cache at step 1 (First-Block-Cache style)."""

    def __init__(self, use_cache: bool) -> None:
        super().__init__()
        self.block = nn.Linear(3, 3)
        self.use_cache, self.cached = use_cache, None

    def forward(self, x, rec=None):
        if self.use_cache and self.cached is not None:
            rec.mark_cache_hit("block")
            return self.cached
        self.cached = self.block(x)
        return self.cached


def test_cache_hits_are_skipped_not_missing():
    torch.manual_seed(0)
    reference, candidate = _Cached(False), _Cached(True)
    candidate.load_state_dict(reference.state_dict())

    def drive(model, rec):
        for k in range(2):
            rec(k)
            model(torch.ones(1, 3), rec)

    result = run_parity(reference, candidate, drive=drive, settings={"cache": "first_block"},
                        environment=ENV)  # fmt: skip
    rows = {(r["tag"], r["step"]): r for r in result.modules.to_pylist()}
    assert result.summary["mode"] == "allclose"
    hit = rows[("checker_block", 1)]
    assert hit["status"] == "skipped" and hit["cache_hit"] is True
    assert rows[("checker_block", 0)]["cache_hit"] is False
    assert rows[("checker_block", 0)]["status"] == "equal"
    assert rows[("checker_model", 1)]["status"] == "equal"  # the cached output is still right
    assert result.summary["tensors_skipped"] >= 1 and result.passed


def test_weight_difference_is_reported_apart(tiny_equal_pair):
    reference, candidate, inputs = tiny_equal_pair
    with torch.no_grad():
        candidate.fc1.bias[0] += 0.5
    result = run_parity(reference, candidate, inputs, settings={}, environment=ENV,
                        dump_mode=DumpMode.NOT)  # fmt: skip
    assert _statuses(result)["checker_fc1.bias"] == "mismatch"
    assert result.summary["weights_failing"] == 1
    assert result.first_divergence["tag"] == "checker_fc1"  # the module the weight broke
    assert result.summary["tensors_failing"] >= 2 and not result.passed


def _rows_table(rows):
    from parity_tracker.files.tables import MODULES_SCHEMA, rows_to_table

    base = {"kind": "output", "step": 0, "mode": "allclose"}
    return rows_to_table([{**base, **r} for r in rows], MODULES_SCHEMA)


def test_first_divergence_skips_cache_hits_and_counts_them():
    from parity_tracker.files.tables import OPS_SCHEMA, rows_to_table
    from parity_tracker.run import build_summary, first_divergence

    table = _rows_table(
        [
            {"tag": "checker_a", "module": "a", "exec_order": 0, "status": "equal"},
            {"tag": "checker_b", "module": "b", "exec_order": 1, "status": "mismatch",
             "cache_hit": True},
            {"tag": "checker_c", "module": "c", "exec_order": 2, "status": "mismatch",
             "cache_hit": False},
        ]
    )  # fmt: skip
    assert first_divergence(table)["tag"] == "checker_c"
    summary = build_summary(
        table, rows_to_table([], OPS_SCHEMA), run_id="r", status="completed", mode="allclose",
        mode_reason="cache", requested_mode="auto", settings={}, environment={},
    )  # fmt: skip
    assert summary["cache_hits_failing"] == 1
    assert summary["tensors_failing"] == 2


def test_output_metrics_use_the_root_name():
    from parity_tracker.run import output_metrics

    table = _rows_table(
        [
            # a Hugging Face *ForCausalLM: the backbone child is called "model", the root "root"
            {"tag": "checker_model", "module": "model", "exec_order": 0, "status": "mismatch",
             "max_abs_diff": 0.5, "sqnr_db": 10.0},
            {"tag": "checker_root_output_logits", "module": "root", "exec_order": 1,
             "status": "mismatch", "max_abs_diff": 0.25, "sqnr_db": 20.0},
        ]
    )  # fmt: skip
    assert output_metrics(table, "root")["output_max_abs_diff"] == 0.25
    assert output_metrics(table, "root")["output_sqnr_db"] == 20.0
    assert output_metrics(table)["output_max_abs_diff"] == 0.5
