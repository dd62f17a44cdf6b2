"""The modules table built by column (issue 19): the same table, rows and parquet as by rows.

``CheckResult.to_columns`` + ``files.tables.columns_to_table`` replace one dict per row and
pyarrow's struct conversion in a run; ``run.rows.ModuleRows`` makes the dict rows only for the
steps that read them. Expected values are written out by hand below (the NaN → null rule, the
``exec_order`` -1 → null rule, the artifact path, the unreached note), and each table is also
compared with the row path's table (``rows_to_table`` of ``to_rows``).
"""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parity_tracker.compare.core import Comparison
from parity_tracker.compare.pairing import first_divergence, structure_differences, verdict_rows
from parity_tracker.compare.results import CheckResult, TagResult
from parity_tracker.files import tables
from parity_tracker.files.tables import MODULES_SCHEMA, columns_to_table, rows_to_table
from parity_tracker.run.rows import ModuleRows


def _result(tag, comp, *, kind="output", exec_order=0, step=0, cache_hit=None, paths=()):
    return TagResult(
        tag=tag, module=tag.removeprefix("checker_"), kind=kind, slot="output", call_index=0,
        exec_order=exec_order, step=step, cache_hit=cache_hit, comparison=comp,
        dump_paths=paths,
    )  # fmt: skip


def _varied() -> CheckResult:
    equal = Comparison(
        status="equal", mode="equal", numel=6, ref_shape=(2, 3), cand_shape=(2, 3),
        ref_dtype="float32", cand_dtype="float32", ref_device="cpu", cand_device="cpu",
        mismatch_count=0, max_abs_diff=0.0, sqnr_db=math.inf, ref_hash="aa", cand_hash="aa",
    )  # fmt: skip
    nan = Comparison(
        status="mismatch", mode="equal", numel=4, ref_shape=(4,), cand_shape=(4,),
        mismatch_count=1, max_abs_diff=math.nan, max_abs_diff_index=(3,), cosine=0.5,
        ref_nan=0, cand_nan=1, message="one NaN",
    )  # fmt: skip
    budget = Comparison(
        status="close", mode="budget", golden_max_abs_err=0.25, twin_max_abs_err=0.125,
        error_ratio=2.0, rtol=1e-5, atol=1e-8,
    )  # fmt: skip
    missing = Comparison(status="missing_candidate", mode="equal", message="absent")
    results = [
        _result("checker_a", equal, cache_hit=False),
        _result("checker_b", nan, exec_order=3, step=1, paths=("check-0001/b__ref.npy", "x")),
        _result("checker_c", budget, kind="param", exec_order=-1, cache_hit=True),
        _result("checker_d", missing, exec_order=2),
    ]
    return CheckResult(results=results, weights=[], first_divergence=None, passed=False)


def test_columns_hold_the_rows_values():
    check = _varied()
    cols = check.to_columns()
    assert list(cols) == MODULES_SCHEMA.names
    assert cols["run_id"] is None and cols["local_status"] is None
    assert list(cols["tag"]) == ["checker_a", "checker_b", "checker_c", "checker_d"]
    assert list(cols["exec_order"]) == [0, 3, None, 2]  # -1: never captured -> null
    assert list(cols["dump_path"]) == [None, "check-0001/b__ref.npy", None, None]
    assert list(cols["cache_hit"]) == [False, None, True, None]
    assert list(cols["error_ratio"]) == [None, None, 2.0, None]
    assert list(cols["ref_shape"]) == [(2, 3), (4,), None, None]
    rows = check.to_rows()
    for name, values in cols.items():
        assert [r[name] for r in rows] == list(values or [None] * 4)


@pytest.mark.parametrize("struct_rows", [0, 10**6])  # column by column; one struct of tuples
def test_table_by_column_equals_table_by_row(tmp_path, monkeypatch, struct_rows):
    monkeypatch.setattr(tables, "STRUCT_ROWS", struct_rows)
    check = _varied()
    by_col = columns_to_table(check.to_columns(), 4, MODULES_SCHEMA)
    by_row = rows_to_table(check.to_rows(), MODULES_SCHEMA)
    assert by_col.schema.equals(MODULES_SCHEMA, check_metadata=True)
    assert by_col.equals(by_row, check_metadata=True)
    # NaN is null, +inf stays, a tuple is a list
    assert by_col.column("max_abs_diff").to_pylist() == [0.0, None, None, None]
    assert by_col.column("sqnr_db").to_pylist() == [math.inf, None, None, None]
    assert by_col.column("max_abs_diff_index").to_pylist() == [None, [3], None, None]
    pq.write_table(by_col, tmp_path / "c.parquet")
    pq.write_table(by_row, tmp_path / "r.parquet")
    assert pq.read_table(tmp_path / "c.parquet").equals(pq.read_table(tmp_path / "r.parquet"))


@pytest.mark.parametrize("struct_rows", [0, 10**6])
def test_table_by_column_edges(monkeypatch, struct_rows):
    monkeypatch.setattr(tables, "STRUCT_ROWS", struct_rows)
    assert columns_to_table({}, 0, MODULES_SCHEMA).equals(MODULES_SCHEMA.empty_table())
    with pytest.raises(ValueError, match="'tag' has 1 values, not 2"):
        columns_to_table({"tag": ["x"]}, 2, MODULES_SCHEMA)
    # a value the column refuses: the rows' path raises its usual error
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, TypeError)):
        columns_to_table({"tag": ["x"], "status": ["equal"], "numel": ["six"]}, 1, MODULES_SCHEMA)
    # unknown names ignored, missing ones null
    t = columns_to_table({"tag": ["x"], "status": ["equal"], "bogus": [1]}, 1, MODULES_SCHEMA)
    assert t.column("numel").to_pylist() == [None] and t.column("tag").to_pylist() == ["x"]


def test_other_record_types_take_the_rows_path():
    class Mine(Comparison):
        pass

    check = _varied()
    check.results.append(_result("checker_e", Mine(status="equal", mode="equal", numel=2)))
    cols = check.to_columns()
    assert list(cols["numel"]) == [6, 4, None, None, 2]
    assert list(cols["run_id"]) == [None] * 5


def test_module_rows_name_artifacts_and_unreached_tags():
    error = {"side": "candidate", "type": "RuntimeError", "message": "boom"}
    rows = ModuleRows(_varied(), "r1", error)
    table = rows.table()  # by column
    note = "(the candidate's forward raised RuntimeError: boom before reaching it)"
    assert table.column("run_id").to_pylist() == ["r1"] * 4
    assert table.column("dump_path").to_pylist() == [None, "tensors/b__ref.npy", None, None]
    assert table.column("message").to_pylist() == ["", "one NaN", "", f"absent {note}"]
    dicts = rows.rows()
    assert [r["message"] for r in dicts] == ["", "one NaN", "", f"absent {note}"]
    assert list(dicts[0]) == MODULES_SCHEMA.names
    assert rows.table().equals(table, check_metadata=True)  # now by row: the same table


def test_verdict_rows_of_the_failing_results_give_the_same_answers():
    fail = Comparison(status="mismatch", mode="equal")
    one_sided = Comparison(status="missing_reference", mode="equal")
    ok = Comparison(status="equal", mode="equal")
    results = [
        _result("checker_w", fail, kind="param", exec_order=0),  # a weight: never the first
        _result("checker_p", ok, exec_order=1),
        _result("checker_late", fail, exec_order=9),
        _result("checker_s", one_sided, exec_order=5),
        _result("checker_early", fail, exec_order=4),
        _result("checker_hit", fail, exec_order=2, cache_hit=True),
    ]
    failing = [0, 2, 3, 4, 5]
    assert first_divergence(results, verdict_rows(results, failing)).tag == "checker_early"
    assert first_divergence(results).tag == "checker_early"
    assert [r.tag for r in structure_differences(results, verdict_rows(results, failing))] == [
        "checker_s"
    ]
    assert first_divergence(results, verdict_rows(results, [])) is None


def test_many_rows_by_column():
    check = _varied()
    check.results[:] = check.results * 100  # 400 rows: above STRUCT_ROWS, column by column
    assert len(check.results) > tables.STRUCT_ROWS
    table = columns_to_table(check.to_columns(), 400, MODULES_SCHEMA)
    assert table.equals(rows_to_table(check.to_rows(), MODULES_SCHEMA), check_metadata=True)
    assert table.column("exec_order").to_pylist() == [0, 3, None, 2] * 100
    assert table.column("max_abs_diff").null_count == 300  # NaN and None are null
