"""The table contract: golden schema, migrations, zstd, no unsigned, nulls, atomic writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parity_tracker.errors import InputError
from parity_tracker.files import tables
from parity_tracker.files.tables import (
    MODULES_SCHEMA,
    OPS_SCHEMA,
    read_table,
    rows_to_table,
    write_table,
)

GOLDEN = Path(__file__).parent / "golden"


def test_schemas_match_golden_file():
    """A column added, removed, renamed, retyped or reordered must be a deliberate change:
    bump SCHEMA_VERSION, add a migration, and update tests/golden/tables_schema.json."""
    golden = json.loads((GOLDEN / "tables_schema.json").read_text())
    assert golden["schema_version"] == tables.SCHEMA_VERSION
    for name, schema in tables.SCHEMAS.items():
        now = [[f.name, str(f.type), f.nullable] for f in schema]
        assert now == golden[name], f"{name} schema changed; see this test's docstring"


def test_contract_columns_have_contract_types():
    want = {
        "run_id": "string", "tag": "string", "module": "string", "kind": "string",
        "slot": "string", "call_index": "int32", "exec_order": "int32", "status": "string",
        "mode": "string", "numel": "int64", "ref_shape": "list<item: int64>",
        "cand_shape": "list<item: int64>", "ref_dtype": "string", "cand_dtype": "string",
        "mismatch_count": "int64", "max_abs_diff": "double",
        "max_abs_diff_index": "list<item: int64>", "max_rel_diff": "double",
        "mean_abs_diff": "double", "cosine": "double", "sqnr_db": "double", "max_ulp": "double",
        "ref_nan": "int64", "cand_nan": "int64", "ref_inf": "int64", "cand_inf": "int64",
        "ref_hash": "string", "cand_hash": "string", "rtol": "double", "atol": "double",
        "dump_path": "string", "message": "string", "step": "int32", "cache_hit": "bool",
        "local_status": "string", "local_max_abs_diff": "double",
    }  # fmt: skip
    for schema in (MODULES_SCHEMA, OPS_SCHEMA):
        for name, typ in want.items():
            assert str(schema.field(name).type) == typ, name
    for name, typ in {"op": "string", "op_index": "int32", "inputs_status": "string"}.items():
        assert str(OPS_SCHEMA.field(name).type) == typ


def test_no_unsigned_integers():
    for schema in tables.SCHEMAS.values():
        for f in schema:
            t = f.type.value_type if pa.types.is_list(f.type) else f.type
            assert not pa.types.is_unsigned_integer(t), f.name


def test_nan_becomes_null_and_missing_keys_are_null():
    t = rows_to_table(
        [{"tag": "a", "status": "equal", "max_abs_diff": float("nan"), "ref_shape": (2, 3)}],
        MODULES_SCHEMA,
    )
    row = t.to_pylist()[0]
    assert row["max_abs_diff"] is None
    assert row["cosine"] is None and row["step"] is None
    assert row["ref_shape"] == [2, 3]
    assert t.column("max_abs_diff").null_count == 1


def test_write_is_zstd_versioned_and_round_trips(tmp_path):
    rows = [
        {"tag": "checker_fc1", "status": "mismatch", "max_abs_diff": 0.25, "step": 2,
         "ref_shape": [4], "cache_hit": None},
        {"tag": "checker_fc2", "status": "equal", "max_abs_diff": 0.0, "step": 0,
         "ref_shape": [], "cache_hit": True},
    ]  # fmt: skip
    t = rows_to_table(rows, MODULES_SCHEMA)
    path = write_table(t, tmp_path / "sub" / "modules.parquet")
    meta = pq.ParquetFile(path).metadata
    assert pq.read_schema(path).metadata[b"schema_version"] == str(tables.SCHEMA_VERSION).encode()
    codecs = {meta.row_group(0).column(i).compression for i in range(meta.num_columns)}
    assert codecs == {"ZSTD"}
    back = read_table(path, "modules")
    assert back.equals(t)
    assert back.to_pylist()[0]["max_abs_diff"] == 0.25
    assert [p.name for p in path.parent.iterdir()] == ["modules.parquet"]  # no temp left


def test_write_crash_leaves_previous_file_whole(tmp_path, monkeypatch):
    path = write_table(rows_to_table([{"tag": "a", "status": "equal"}], MODULES_SCHEMA),
                       tmp_path / "m.parquet")  # fmt: skip
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(tables.pq, "write_table", boom)
    with pytest.raises(OSError, match="disk full"):
        write_table(rows_to_table([{"tag": "b", "status": "mismatch"}], MODULES_SCHEMA), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.parquet"]


def test_v0_file_is_migrated():
    """tests/golden/modules_v0.parquet: no schema_version, no step, the seed's status words."""
    path = GOLDEN / "modules_v0.parquet"
    assert tables.schema_version_of(path) == 0
    t = read_table(path, "modules")
    assert t.schema.equals(MODULES_SCHEMA.remove_metadata())
    rows = t.to_pylist()
    assert [r["tag"] for r in rows] == [
        "checker_conv_in",
        "checker_conv_in_input_0",
        "checker_downsample.1",
    ]
    assert [r["status"] for r in rows] == ["equal", "equal", "mismatch"]
    assert [r["step"] for r in rows] == [0, 0, 0]
    assert [r["exec_order"] for r in rows] == [1, 0, 2]
    assert rows[2]["max_abs_diff"] is None  # a NaN stand-in in the old file becomes null
    assert all(r["cache_hit"] is None and r["local_status"] is None for r in rows)
    assert rows[0]["ref_shape"] == [2, 4]


def test_v1_file_gets_null_ranks(tmp_path):
    """v1 had no ``ranks`` (sharded runs, v2): a v1 run was not sharded, so ranks is null."""
    t = pa.table({"tag": ["a", "b"], "status": ["equal", "mismatch"], "step": [0, 1]})
    pq.write_table(t.replace_schema_metadata({b"schema_version": b"1"}), tmp_path / "v1.parquet")
    back = read_table(tmp_path / "v1.parquet", "modules")
    assert back.column("ranks").to_pylist() == [None, None]
    assert back.column("status").to_pylist() == ["equal", "mismatch"]
    assert back.column("step").to_pylist() == [0, 1]


def test_newer_version_is_refused_with_the_fix(tmp_path):
    t = rows_to_table([{"tag": "a", "status": "equal"}], MODULES_SCHEMA)
    t = t.replace_schema_metadata({b"schema_version": b"99"})
    pq.write_table(t, tmp_path / "new.parquet")
    with pytest.raises(InputError, match="upgrade parity-tracker"):
        read_table(tmp_path / "new.parquet")


def test_nan_in_foreign_file_is_read_as_null(tmp_path):
    t = pa.table({"tag": ["a", "b"], "status": ["mismatch", "equal"], "cosine": [math.nan, 1.0]})
    t = t.replace_schema_metadata({b"schema_version": b"1"})
    pq.write_table(t, tmp_path / "f.parquet")
    back = read_table(tmp_path / "f.parquet", "ops")
    assert back.column("cosine").to_pylist() == [None, 1.0]
    assert back.column_names == OPS_SCHEMA.names


def test_v1_file_gains_the_budget_columns_as_null():
    """tests/golden/modules_v1.parquet (v1 → v2 → v3): no error-budget columns before v3."""
    path = GOLDEN / "modules_v1.parquet"
    assert tables.schema_version_of(path) == 1
    assert "error_ratio" not in pq.read_schema(path).names
    t = read_table(path, "modules")
    assert t.schema.equals(MODULES_SCHEMA.remove_metadata())
    rows = t.to_pylist()
    assert [(r["tag"], r["status"], r["max_abs_diff"]) for r in rows] == [
        ("checker_fc1", "close", 0.25),
        ("checker_fc2", "mismatch", 0.5),
    ]
    budget = ("golden_max_abs_err", "twin_max_abs_err", "error_ratio")
    assert all(r[c] is None for r in rows for c in budget)


def test_v2_file_gains_the_budget_columns_as_null(tmp_path):
    budget = ("golden_max_abs_err", "twin_max_abs_err", "error_ratio")
    v2 = pa.schema([f for f in MODULES_SCHEMA if f.name not in budget])
    t = rows_to_table([{"tag": "a", "status": "close", "ranks": [1]}], v2)
    pq.write_table(t.replace_schema_metadata({b"schema_version": b"2"}), tmp_path / "v2.parquet")
    (row,) = read_table(tmp_path / "v2.parquet", "modules").to_pylist()
    assert row["ranks"] == [1] and all(row[c] is None for c in budget)


def test_infinite_error_ratio_round_trips(tmp_path):
    rows = [{"tag": "a", "status": "mismatch", "mode": "budget", "error_ratio": math.inf,
             "golden_max_abs_err": 0.5, "twin_max_abs_err": 0.0}]  # fmt: skip
    path = write_table(rows_to_table(rows, MODULES_SCHEMA), tmp_path / "m.parquet")
    back = read_table(path).to_pylist()[0]
    assert back["error_ratio"] == math.inf and back["twin_max_abs_err"] == 0.0
