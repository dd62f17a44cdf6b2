"""statuses, compare.verdict and capture.tags: the one owner of each rule (issue 12)."""

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from parity_tracker.capture.tags import (
    named_modules,
    op_tag,
    output_tag,
    param_tag,
    parse_tag,
    root_name,
)
from parity_tracker.compare.verdict import first_divergence, worst_tensor, worst_tensors
from parity_tracker.statuses import (
    FAILING,
    NEUTRAL,
    PASSING,
    STATUSES,
    STRUCTURAL,
    failing_mask,
    is_failing,
    is_passing,
    passing_mask,
)


def test_vocabulary_partitions_the_statuses():
    assert {"equal", "close"} == PASSING and {"skipped"} == NEUTRAL
    assert {
        "mismatch",
        "shape_mismatch",
        "missing_reference",
        "missing_candidate",
        "error",
    } == FAILING
    assert STRUCTURAL <= FAILING
    assert set(STATUSES) == PASSING | NEUTRAL | FAILING
    assert is_passing("close") and not is_passing("skipped")
    assert is_failing(None) and is_failing("bogus") and not is_failing("skipped")


def test_masks_agree_for_numpy_and_arrow():
    col = ["equal", "mismatch", "skipped", None, "close", "error"]
    want_fail = [False, True, False, True, False, True]
    want_pass = [True, False, False, False, True, False]
    assert list(failing_mask(np.array(col, dtype=object))) == want_fail
    assert failing_mask(pa.array(col)).to_pylist() == want_fail
    assert passing_mask(pa.chunked_array([col])).to_pylist() == want_pass


def _row(tag, status, step=0, order=0, kind="output", **kw):
    row = {"tag": tag, "status": status, "step": step, "exec_order": order, "kind": kind}
    return {**row, "cache_hit": False, "sqnr_db": None, "max_abs_diff": None, **kw}


def test_first_divergence_orders_by_step_then_exec_order_and_skips_weights_and_cache_hits():
    rows = [
        _row("late_step", "mismatch", step=1, order=0),
        _row("w", "mismatch", step=0, order=0, kind="param"),
        _row("hit", "mismatch", step=0, order=1, cache_hit=True),
        _row("ok", "equal", step=0, order=2),
        _row("skip", "skipped", step=0, order=3),
        _row("unplaced", "error", step=0, order=None),
        _row("first", "mismatch", step=0, order=5),
    ]
    assert first_divergence(rows)["tag"] == "first"
    assert first_divergence(rows[:6])["tag"] == "unplaced"
    assert first_divergence(pa.Table.from_pylist(rows))["tag"] == "first"
    assert first_divergence(rows[1:5]) is None


def test_worst_tensor_is_lowest_sqnr_then_largest_diff():
    rows = [
        _row("shape", "shape_mismatch"),
        _row("a", "mismatch", sqnr_db=30.0, max_abs_diff=0.1),
        _row("b", "mismatch", sqnr_db=10.0, max_abs_diff=0.01),
        _row("c", "mismatch", sqnr_db=10.0, max_abs_diff=0.5),
        _row("d", "mismatch", sqnr_db=None, max_abs_diff=9.0),
        _row("e", "close", sqnr_db=1.0, max_abs_diff=9.0),
    ]
    assert worst_tensor(rows)["tag"] == "c"
    assert [r["tag"] for r in worst_tensors(rows)] == ["c", "b", "a", "d", "shape"]
    assert worst_tensor(rows[:1])["tag"] == "shape"
    assert worst_tensor(rows[5:]) is None


class _Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)


class _Lm(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = _Inner()


def test_root_name_yields_to_a_child_named_model():
    lm = _Lm()
    assert root_name(lm) == "root" and root_name(_Inner()) == "model"
    named = named_modules(lm)
    assert named["root"] is lm and named["model"] is lm.model
    assert named_modules(torch.nn.Linear(1, 1)).keys() == {"model"}


def test_parse_tag_inverts_the_formatters():
    p = parse_tag(op_tag("blocks.0", 2, "addmm", 3, output=1))
    assert (p.kind, p.module, p.call, p.op, p.k, p.output) == ("op", "blocks.0", 2, "addmm", 3, 1)
    p = parse_tag("model@0::gelu#0")
    assert (p.module, p.call, p.op, p.k, p.output, p.slot) == ("model", 0, "gelu", 0, 0, "output")
    p = parse_tag(output_tag("enc@1", "logits.0"))
    assert (p.kind, p.module, p.call, p.slot) == ("checker", "enc", 1, "output.logits.0")
    p = parse_tag("checker_enc_input_x.a")
    assert (p.module, p.call, p.slot) == ("enc", 0, "input.x.a")
    p = parse_tag(param_tag("fc.weight"))
    assert (p.kind, p.module, p.name) == ("checker", None, "fc.weight")
    assert parse_tag("my_tensor").kind == "other"
