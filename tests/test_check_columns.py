"""A check's modules table built from its resolved groups (issue 19, ``LazyCheckResult``).

``compare.assemble.check_result`` keeps a check's results by column and a run builds its
``modules`` table from them, making a ``TagResult`` record only for the failing rows or when
``results`` is read. The table must be the one the records give, value for value, dtype for
dtype, null for null: here it is built both ways for one mixed check (equal, close, mismatch,
NaN/inf, skipped never-called module, one-sided tag, dumped tags, cache marks, budget columns
null) and compared with ``pyarrow.Table.equals``; one row is checked field by field against
values worked out by hand.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from parity_tracker.compare.results import CheckResult, LazyCheckResult
from parity_tracker.files.tables import MODULES_SCHEMA, columns_to_table, rows_to_table
from parity_tracker.run.rows import ModuleRows
from parity_tracker.tensor_checker import DumpMode, TensorChecker, module_register_tensor_checker


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 3)
        self.b = torch.nn.Linear(3, 3)
        self.unused = torch.nn.Linear(3, 3)  # never called: one skipped row

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _mixed(tmp_path) -> CheckResult:
    torch.manual_seed(0)
    ref, cand = _Net(), _Net()
    cand.load_state_dict(ref.state_dict())
    with torch.no_grad():
        cand.b.bias += 1.0  # b's output (and the root's) mismatch
    checker = TensorChecker(verbose=False)
    module_register_tensor_checker(ref, checker)
    module_register_tensor_checker(cand, checker)
    x = torch.ones(2, 3)
    with torch.no_grad():
        ref(x)
        cand(x)
    f32 = np.float32
    reg = checker.register_tensor
    reg("close", np.array([1.0, 2.0], f32), side=0)
    reg("close", np.array([1.0, 2.0 + 2.0**-10], f32), side=1)
    reg("nonfinite", np.array([np.nan, np.inf, 1.0], f32), side=0)
    reg("nonfinite", np.array([np.nan, np.inf, 1.0], f32), side=1)
    reg("nan_vs_one", np.array([np.nan, 1.0], f32), side=0)
    reg("nan_vs_one", np.array([1.0, 1.0], f32), side=1)
    reg("ref_only", np.zeros(2, f32), side=0)
    checker.mark_cache_hit("a")  # cache marks: a's rows True, the others False (not None)
    return checker.check_allclose(
        rtol=1e-3, atol=0.0, dump_mode=DumpMode.NOT_EQUAL, dump_path=tmp_path
    )


def test_table_from_columns_equals_the_records_table(tmp_path):
    check = _mixed(tmp_path)
    assert isinstance(check, LazyCheckResult) and "results" not in vars(check)
    cols = check.to_columns()
    n = len(cols["tag"])
    by_columns = columns_to_table(cols, n, MODULES_SCHEMA)
    rows_table = ModuleRows(check, "r" * 32, None).table()
    assert "results" not in vars(check)  # neither the table nor the rows made the records
    # the records' way: one TagResult per row, each made a dict row (TagResult.to_row)
    by_records = rows_to_table([r.to_row() for r in check.results], MODULES_SCHEMA)
    assert len(check.results) == n
    assert by_columns.equals(by_records, check_metadata=True)
    plain = CheckResult(**{f.name: getattr(check, f.name) for f in dataclasses.fields(check)})
    assert columns_to_table(plain.to_columns(), n, MODULES_SCHEMA).equals(by_records)
    # the run's table differs only by run_id and the artifact paths of the dumps
    expect = by_records.set_column(0, "run_id", rows_table.column("run_id"))
    i = MODULES_SCHEMA.get_field_index("dump_path")
    expect = expect.set_column(i, "dump_path", rows_table.column("dump_path"))
    assert rows_table.equals(expect)
    statuses = set(by_records.column("status").to_pylist())
    assert {"equal", "close", "mismatch", "skipped", "missing_candidate"} <= statuses
    assert by_records.column("dump_path").null_count < n  # some rows were dumped
    assert set(by_records.column("cache_hit").to_pylist()) == {True, False}
    for name in ("golden_max_abs_err", "twin_max_abs_err", "error_ratio", "ranks", "run_id"):
        assert by_records.column(name).null_count == n, name


def test_records_when_read_are_the_failing_ones_already_chosen(tmp_path):
    check = _mixed(tmp_path)
    fd = check.first_divergence
    assert fd is not None and fd.status == "mismatch"
    assert any(r is fd for r in check.results)  # the same object, made once
    assert [r.tag for r in check.structure_differences] == ["ref_only"]
    assert check.passed is False
    assert check.weights == [r for r in check.results if r.kind in ("param", "buffer")]


def test_one_row_worked_by_hand(tmp_path):
    check = _mixed(tmp_path)
    table = columns_to_table(check.to_columns(), len(check.to_columns()["tag"]), MODULES_SCHEMA)
    rows = [r for r in table.to_pylist() if r["tag"] == "close"]
    assert len(rows) == 1
    row = rows[0]
    diff = float(np.float32(2.0 + 2.0**-10)) - 2.0  # 2**-10, exact in float32
    assert diff == 2.0**-10
    # |2 + 2^-10 - 2| = 2^-10 <= atol + rtol * 2 = 2e-3: close, not equal, no mismatch
    assert row["status"] == "close" and row["mode"] == "allclose"
    assert row["kind"] == "manual" and row["slot"] == "manual" and row["module"] is None
    assert row["call_index"] == 0 and row["step"] == 0
    assert row["cache_hit"] is False  # a manual tag has no module: no cache skipped it
    assert row["numel"] == 2 and row["ref_shape"] == [2] and row["cand_shape"] == [2]
    assert row["ref_dtype"] == row["cand_dtype"] == "float32"
    assert row["mismatch_count"] == 0
    assert row["max_abs_diff"] == pytest.approx(diff, abs=0)
    assert row["max_abs_diff_index"] == [1]
    assert row["rtol"] == 1e-3 and row["atol"] == 0.0
    assert row["ref_nan"] == row["cand_nan"] == 0
    assert row["dump_path"] is None and row["run_id"] is None and row["ranks"] is None
    assert row["error_ratio"] is None and row["golden_max_abs_err"] is None
    nan_row = next(r for r in table.to_pylist() if r["tag"] == "nan_vs_one")
    assert nan_row["status"] == "mismatch" and nan_row["ref_nan"] == 1
    assert nan_row["cand_nan"] == 0 and nan_row["dump_path"] is not None
