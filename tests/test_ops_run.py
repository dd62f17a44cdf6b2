"""Issue 5 "done when": ``run_parity(capture_ops=True)`` names the first root-cause op and its
case for each test of §5, and ``isolate=True`` separates local from propagated error."""

from __future__ import annotations

import tempfile

import pytest
import torch
import torch.nn as nn
from test_localize import _Chain
from test_ops import Outer, RowSum, RowSumTransposed, _block_pair

from parity_tracker.run import run_parity


@pytest.fixture(autouse=True)
def _temp_folder_in_tmp_path(tmp_path, monkeypatch):
    """Default dumps and spills (``tempfile.gettempdir()``) land in this test's ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(exist_ok=True)


def _first(result):
    return result.summary["root_causes"][0]


def test_run_names_gelu_root_cause_case_a():
    ref, cand, x = _block_pair(approximate="tanh")
    result = run_parity(ref, cand, (x,), mode="equal", capture_ops=True)
    first = _first(result)
    assert (first["tag"], first["op"], first["cause"]) == ("mlp.act@0::gelu#0", "gelu", "A")
    ops = {r["tag"]: r for r in result.ops.to_pylist()}
    assert ops["mlp.act@0::gelu#0"]["inputs_status"] == "passing"
    # The checker's own copies (hooks) are not recorded as ops.
    assert not any(t.startswith("mlp.act@0::clone") for t in ops)


def test_run_names_layer_norm_root_cause():
    ref, cand, x = _block_pair(eps=1e-1)
    first = _first(run_parity(ref, cand, (x,), mode="equal", capture_ops=True))
    assert (first["tag"], first["op"], first["cause"]) == (
        "ln1@0::native_layer_norm#0",
        "native_layer_norm",
        "A",
    )


def test_run_transposed_view_case_b_or_equal():
    torch.manual_seed(64)
    w, x = torch.randn(64, 1000), torch.randn(64)
    result = run_parity(RowSum(w), RowSumTransposed(w), (x,), mode="equal", capture_ops=True)
    if torch.equal(w.sum(-1), w.t().contiguous().t().sum(-1)):
        assert result.summary["root_causes"] == []
    else:
        first = _first(result)
        assert (first["tag"], first["cause"]) == ("model@0::sum#0", "B")
        assert "input 0 stride (1000, 1) vs (1, 64)" in first["message"]


def test_run_one_extra_op_one_missing_reference_row():
    result = run_parity(Outer(), Outer(extra=True), (torch.randn(5, 7),), capture_ops=True)
    statuses = [r["status"] for r in result.ops.to_pylist()]
    assert statuses.count("missing_reference") == 1
    assert set(statuses) == {"equal", "missing_reference"}
    assert (_first(result)["tag"], _first(result)["cause"]) == ("inner@0::abs#0", "C")


def test_run_isolate_two_layer_chain():
    torch.manual_seed(0)
    ref, cand = _Chain(), _Chain()
    cand.load_state_dict(ref.state_dict())
    with torch.no_grad():
        cand.layer0.bias += 0.5
    x = torch.randn(5, 4)
    result = run_parity(ref, cand, (x,), mode="equal", isolate=True)
    rows = {r["tag"]: r for r in result.modules.to_pylist() if r["kind"] == "output"}
    layer1 = rows["checker_layer1"]
    assert layer1["status"] == "mismatch" and layer1["max_abs_diff"] > 0  # propagated
    assert (layer1["local_status"], layer1["local_max_abs_diff"]) == ("equal", 0.0)  # local
    layer0 = rows["checker_layer0"]
    assert layer0["local_status"] == "mismatch"
    assert layer0["local_max_abs_diff"] == pytest.approx(0.5, abs=1e-6)


def test_run_capture_ops_on_nn_transformer_encoder_layer():
    """torch's own layer (fast path off: the fused kernel would be one op)."""
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        torch.manual_seed(0)
        ref = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, activation="gelu")
        cand = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, activation="relu")
        cand.load_state_dict(ref.state_dict())
        x = torch.randn(2, 5, 32)
        result = run_parity(ref, cand, (x,), mode="equal", capture_ops=True)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    causes = {(r["tag"], r["cause"]) for r in result.summary["root_causes"]}
    assert causes == {("model@0::gelu#0", "C"), ("model@0::relu#0", "C")}
