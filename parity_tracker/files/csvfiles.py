"""Small CSV views of the tables, for MLflow's artifact viewer (which shows CSV, not parquet).

``failing_rows`` picks the failing rows (``statuses.failing_mask``: every divergence, structure
differences such as ``missing_reference`` / ``missing_candidate`` / ``shape_mismatch``
included) of the modules and ops tables, capped at :data:`FAILING_CSV_MAX_ROWS`;
``write_csv`` writes a table as CSV atomically (list columns such as shapes as ``[2, 3]``).
The parquet tables stay the full record; a CSV is a preview.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from parity_tracker.files.atomic import atomic_write_text
from parity_tracker.files.tables import OPS_SCHEMA
from parity_tracker.statuses import failing_mask

#: Rows kept in ``failing.csv`` (modules rows first, then ops rows, each in table order).
FAILING_CSV_MAX_ROWS = 200
#: Columns of ``failing.csv``: ``table`` (modules | ops), then these of the row, the telling
#: ones first (the artifact viewer shows the left columns); ``op``/``op_index`` empty for
#: modules rows.
FAILING_COLUMNS = (
    "tag", "status", "max_abs_diff", "max_rel_diff", "sqnr_db", "cosine", "mismatch_count",
    "numel", "module", "kind", "step", "exec_order", "op", "op_index", "ref_shape", "cand_shape",
    "ref_dtype", "cand_dtype", "message",
)  # fmt: skip


def _failing(table: pa.Table, name: str) -> pa.Table:
    if table.num_rows == 0:
        rows = table.slice(0, 0)
    else:
        rows = table.filter(failing_mask(table.column("status")))
    cols: dict[str, pa.Array] = {"table": pa.array([name] * rows.num_rows, pa.string())}
    for col in FAILING_COLUMNS:
        if col in rows.column_names:
            cols[col] = rows.column(col)
        else:  # op / op_index on a modules table: empty, typed as in the ops table
            cols[col] = pa.nulls(rows.num_rows, OPS_SCHEMA.field(col).type)
    return pa.table(cols)


def failing_rows(
    modules: pa.Table, ops: pa.Table, cap: int = FAILING_CSV_MAX_ROWS
) -> tuple[pa.Table, int]:
    """The failing rows of both tables, at most ``cap`` of them, and how many there are in all.

    Args:
        modules: the run's modules table (``tables.MODULES_SCHEMA``).
        ops: the run's ops table (``tables.OPS_SCHEMA``; may be empty).
        cap: the most rows returned (default :data:`FAILING_CSV_MAX_ROWS`).

    Returns:
        ``(table, total)``: ``table`` has the column ``table`` then :data:`FAILING_COLUMNS`,
        modules rows first, each table's rows in their own order; ``total`` counts every
        failing row before the cap.
    """
    both = pa.concat_tables(
        [_failing(modules, "modules"), _failing(ops, "ops")], promote_options="permissive"
    )
    return both.slice(0, max(cap, 0)), both.num_rows


def _flat(column: pa.ChunkedArray) -> pa.Array:
    """A CSV-writable column: lists (shapes) as ``[2, 3]`` strings, others unchanged."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return pa.array(
            [None if v is None else "[" + ", ".join(map(str, v)) + "]" for v in column.to_pylist()],
            pa.string(),
        )
    if pa.types.is_null(column.type):
        return pc.cast(column, pa.string())
    return column


def write_csv(table: pa.Table, path: str | os.PathLike[str]) -> Path:
    """Write ``table`` as CSV (header row, RFC 4180 quoting) atomically; returns the path."""
    flat = pa.table({name: _flat(table.column(name)) for name in table.column_names})
    buf = io.BytesIO()
    pacsv.write_csv(flat, buf)
    path = Path(path)
    atomic_write_text(path, buf.getvalue().decode("utf-8"))
    return path
