"""The regression predicate (hand-worked rows) and the vectorised join agreeing with it."""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa
import pytest

from parity_tracker.analysis.diff import (
    CHANGES,
    classify,
    count_changes,
    diff_tables,
    dtype_eps,
    to_json,
    to_markdown,
    to_rich,
)
from parity_tracker.files.tables import MODULES_SCHEMA, rows_to_table


def row(status="equal", mad=0.0, h="a", dtype="float32"):
    return {"status": status, "max_abs_diff": mad, "cand_hash": h, "cand_dtype": dtype}


# Each case: (base, head, expected label, why) — worked out by hand from the rules.
CASES = [
    (None, row(), "new", "only in head"),
    (row(), None, "removed", "only in base"),
    (row("equal"), row("mismatch", 1.0, "b"), "regression", "passing -> failing"),
    (row("close", 1e-6), row("shape_mismatch", None, "b"), "regression", "close -> shape"),
    (row("equal"), row("error", None, None), "regression", "equal -> error"),
    (row("mismatch", 1.0), row("equal", 0.0, "b"), "fix", "failing -> passing"),
    (row("missing_candidate", None, None), row("close", 1e-7), "fix", "missing -> close"),
    # both failing: 0.1 -> 0.3 grew by 3 > 2 and 0.3 > eps(float32) -> worse
    (row("mismatch", 0.1), row("mismatch", 0.3, "b"), "worse", "grew 3x"),
    # 0.1 -> 0.2 is exactly 2x: not > 2x; hashes differ -> drift
    (row("mismatch", 0.1), row("mismatch", 0.2, "b"), "drift", "exactly 2x is not worse"),
    # both passing (allclose): 1e-6 -> 5e-6 grew 5x and 5e-6 > 2**-23 (1.19e-7) -> worse
    (row("close", 1e-6), row("close", 5e-6, "b"), "worse", "passing but 5x worse"),
    # 0 -> 1e-8 in float32 is below eps 1.19e-7 -> not worse; hash moved -> drift
    (row("equal", 0.0), row("close", 1e-8, "b"), "drift", "below float32 eps"),
    # same growth in float64: 1e-8 > 2**-52 -> worse
    (row("equal", 0.0, dtype="float64"), row("close", 1e-8, "b", "float64"), "worse", "f64"),
    # bf16 eps 2**-7 = 0.0078125: 0.001 -> 0.005 is below it -> drift, not worse
    (row("close", 1e-3, dtype="bfloat16"), row("close", 5e-3, "b", "bfloat16"), "drift", "bf16"),
    (row("mismatch", 0.4), row("mismatch", 0.1, "b"), "better", "shrank 4x"),
    (row("equal", 0.0, "a"), row("equal", 0.0, "b"), "drift", "hash moved, status held"),
    (row("equal", 0.0, "a"), row("equal", 0.0, "a"), "unchanged", "identical"),
    (row("equal", 0.0, None), row("equal", 0.0, "b"), "unchanged", "hash unknown on one side"),
    (row("mismatch", None), row("mismatch", 3.0), "unchanged", "unknown base error"),
    # integer dtype: eps 0, so any growth from 0 counts
    (row("mismatch", 0.0, dtype="int64"), row("mismatch", 1.0, "a", "int64"), "worse", "int"),
]


@pytest.mark.parametrize(("base", "head", "expected", "why"), CASES, ids=[c[3] for c in CASES])
def test_classify_hand_worked(base, head, expected, why):
    assert classify(base, head) == expected


def test_classify_thresholds_are_parameters():
    base, head = row("mismatch", 0.1), row("mismatch", 0.25, "a")
    assert classify(base, head) == "worse"  # 2.5x > 2
    assert classify(base, head, worse_factor=3.0) == "unchanged"
    assert classify(row("equal", 0.0), row("close", 1e-8, "a")) == "unchanged"
    assert classify(row("equal", 0.0), row("close", 1e-8, "a"), eps=0.0) == "worse"


def test_dtype_eps_matches_torch_finfo():
    import torch

    for name in ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"):
        assert dtype_eps(name) == torch.finfo(getattr(torch, name)).eps
        assert dtype_eps(f"torch.{name}") == torch.finfo(getattr(torch, name)).eps
    assert dtype_eps("int8") == 0.0
    assert dtype_eps(None) == 0.0


def _table(rows):
    return rows_to_table(rows, MODULES_SCHEMA)


def test_diff_tables_agrees_with_classify_on_every_case():
    base_rows, head_rows, expected = [], [], {}
    for i, (base, head, label, _) in enumerate(CASES):
        tag = f"t{i}"
        if base is not None:
            base_rows.append({"tag": tag, "step": 0, "exec_order": i, **base})
        if head is not None:
            head_rows.append({"tag": tag, "step": 0, "exec_order": i, **head})
        expected[tag] = label
    out = diff_tables(_table(base_rows), _table(head_rows))
    got = dict(zip(out.column("tag").to_pylist(), out.column("change").to_pylist(), strict=True))
    assert got == expected
    assert out.column("tag").to_pylist() == [f"t{i}" for i in range(len(CASES))]


def test_diff_tables_joins_on_tag_and_step():
    base = _table([{"tag": "x", "step": s, "status": "equal", "cand_hash": "h"} for s in (0, 1)])
    head = _table(
        [
            {"tag": "x", "step": 0, "status": "equal", "cand_hash": "h"},
            {"tag": "x", "step": 1, "status": "mismatch", "cand_hash": "z", "max_abs_diff": 1.0},
            {"tag": "x", "step": 2, "status": "equal", "cand_hash": "h"},
        ]
    )
    out = diff_tables(base, head)
    got = {(r["tag"], r["step"]): r["change"] for r in out.to_pylist()}
    assert got == {("x", 0): "unchanged", ("x", 1): "regression", ("x", 2): "new"}
    counts = count_changes(out)
    assert counts["regression"] == 1 and counts["new"] == 1 and counts["unchanged"] == 1
    assert set(CHANGES) <= set(counts)


def test_renderers_show_only_changes():
    base = _table([{"tag": "a", "status": "equal"}, {"tag": "b", "status": "equal"}])
    head = _table(
        [{"tag": "a", "status": "mismatch", "max_abs_diff": 0.5}, {"tag": "b", "status": "equal"}]
    )
    out = diff_tables(base, head)
    md = to_markdown(out)
    assert "| regression | a |" in md and "| b |" not in md
    payload = json.loads(to_json(out, base="r1"))
    assert payload["counts"]["regression"] == 1 and payload["base"] == "r1"
    assert [r["tag"] for r in payload["rows"]] == ["a"]
    assert to_rich(out).row_count == 1


def test_diff_of_100k_rows():
    n = 100_000
    rng = np.random.default_rng(0)

    def run(scale, flip):
        status = np.where(rng.random(n) < flip, "mismatch", "equal")
        return pa.table(
            {
                "tag": pa.array([f"checker_layer{i}" for i in range(n)]),
                "step": pa.array(np.zeros(n, dtype=np.int32)),
                "exec_order": pa.array(np.arange(n, dtype=np.int32)),
                "status": pa.array(status),
                "max_abs_diff": pa.array(rng.random(n) * scale),
                "cand_hash": pa.array([f"h{i % 11}" for i in range(n)]),
                "cand_dtype": pa.array(["float32"] * n),
            }
        )

    base, head = run(1.0, 0.05), run(3.0, 0.10)
    diff_tables(base.slice(0, 10), head.slice(0, 10))  # warm the join engine's import
    start = time.perf_counter()
    out = diff_tables(base, head)
    elapsed = time.perf_counter() - start
    assert out.num_rows == n
    # independent check of the regression count with numpy
    b_pass = np.asarray(base.column("status").to_pylist()) == "equal"
    h_pass = np.asarray(head.column("status").to_pylist()) == "equal"
    assert count_changes(out)["regression"] == int((b_pass & ~h_pass).sum())
    # the time is a benchmark figure (benchmarks/), printed here, never a timed assertion
    print(f"100,000-row diff: {elapsed:.3f} s")


# --------------------------------------------------------------------------- diff_runs


def _modules(rows):
    base = {"kind": "output", "step": 0, "cand_dtype": "float32"}
    return rows_to_table([{**base, **r} for r in rows], MODULES_SCHEMA)


def test_diff_runs_applies_expected_and_counts_unexpected_failing():
    import datetime as dt

    from parity_tracker.analysis.diff import diff_runs
    from parity_tracker.analysis.expected import ExpectedEntry

    base = _modules([
        {"tag": "a", "exec_order": 0, "status": "equal", "max_abs_diff": 0.0},
        {"tag": "b", "exec_order": 1, "status": "equal", "max_abs_diff": 0.0},
        {"tag": "c", "exec_order": 2, "status": "mismatch", "max_abs_diff": 1.0},
        {"tag": "gone", "exec_order": 3, "status": "mismatch", "max_abs_diff": 1.0},
    ])  # fmt: skip
    head = _modules([
        {"tag": "a", "exec_order": 0, "status": "mismatch", "max_abs_diff": 1.0},
        {"tag": "b", "exec_order": 1, "status": "mismatch", "max_abs_diff": 1.0},
        {"tag": "c", "exec_order": 2, "status": "mismatch", "max_abs_diff": 1.0},
        {"tag": "s", "exec_order": 4, "status": "skipped"},
    ])  # fmt: skip
    entry = ExpectedEntry(target="t", tag="b", reason="known", until=dt.date(2099, 1, 1))
    d = diff_runs(base, head, expected=[entry], target="t", settings={},
                  today=dt.date(2026, 1, 1))  # fmt: skip
    tags, changes = d.table.column("tag").to_pylist(), d.table.column("change").to_pylist()
    change = dict(zip(tags, changes, strict=True))
    assert change == {"a": "regression", "b": "expected", "c": "unchanged", "gone": "removed",
                      "s": "new"}  # fmt: skip
    # failing in head and not expected: a and c (b is expected, s skipped, gone removed)
    assert d.unexpected_failing == 2
    assert d.regressions == 1 and d.counts["expected"] == 1
    assert [e.tag for e in d.expected_used] == ["b"]


def test_diff_runs_without_baseline_is_all_new():
    from parity_tracker.analysis.diff import diff_runs

    head = _modules([{"tag": "a", "exec_order": 0, "status": "mismatch", "max_abs_diff": 1.0}])
    d = diff_runs(None, head)
    assert d.table.column("change").to_pylist() == ["new"] and d.unexpected_failing == 1


def test_diff_runs_needs_a_store_for_run_ids():
    from parity_tracker.analysis.diff import diff_runs
    from parity_tracker.errors import InputError

    with pytest.raises(InputError, match="store"):
        diff_runs("abc", "def")


def test_markdown_table_escapes_pipes():
    from parity_tracker.analysis.render import markdown_table

    assert markdown_table(["a", "b"], [["x|y", None], [0.5, 3]]) == (
        "| a | b |\n|---|---|\n| x\\|y | - |\n| 0.5 | 3 |"
    )
