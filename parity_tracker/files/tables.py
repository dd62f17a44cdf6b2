"""The ``modules`` and ``ops`` tables: one explicit pyarrow schema each (design.md, "Tables").

Every writer and reader of parity results goes through this module, so a column changes in one
place. The schema version is stored in the parquet file metadata under ``schema_version``;
``read_table`` migrates any earlier version forward (the pattern of asv's ``results.py``:
a versioned on-disk format with explicit migrations).
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from parity_tracker.compare.columns import (  # noqa: F401  (the schemas' owner; re-exported)
    BUDGET_COLUMNS,
    COMMON_FIELDS,
    MODULES_SCHEMA,
    OPS_SCHEMA,
    SCHEMAS,
)
from parity_tracker.files.atomic import atomic_write

SCHEMA_VERSION = 3


def rows_to_table(rows: Iterable[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """Build a table from dict rows; keys not in ``schema`` are ignored, missing ones are null.

    Args:
        rows: one mapping per row (e.g. ``{**tag_info, **comparison.to_dict()}``).
        schema: ``MODULES_SCHEMA`` or ``OPS_SCHEMA``.

    Returns:
        A ``pyarrow.Table`` with exactly ``schema``'s columns and types.

    Raises:
        pyarrow.ArrowInvalid: a value cannot be converted to its column's type.
    """
    rows = list(rows)
    if not rows:  # e.g. the ops table of a module-level run: ≈ 0.3 ms less per run
        return _layout(schema).empty
    try:  # one C++ conversion of the dicts: 0.07 ms instead of 0.45 ms for 6 rows (issue 19)
        return _struct_table(rows, schema)
    except (pa.ArrowException, TypeError, ValueError):
        pass  # anything it refuses goes column by column, which raises the usual error
    columns = {}
    for name, type_ in zip(schema.names, schema.types, strict=True):
        get = operator.methodcaller("get", name)  # the name read once, not once per row
        columns[name] = _column(list(map(get, rows)), type_)
    return pa.Table.from_pydict(columns, schema=schema)


#: Below this many rows :func:`columns_to_table` converts the rows as tuples in one struct
#: conversion (≈ 0.19 ms for 74 rows; one ``pyarrow.array`` per column costs ≈ 6 µs each,
#: ≈ 0.4 ms for the 41 columns), from it up column by column (1,002 rows: 1.5 ms instead of
#: 2.2 ms). Measured on the modules table, 2-core CPU, pyarrow 25 (issue 19).
STRUCT_ROWS = 256


def columns_to_table(
    columns: Mapping[str, Sequence[Any] | None], num_rows: int, schema: pa.Schema
) -> pa.Table:
    """Build a table from columns: the same table as :func:`rows_to_table` of the same rows.

    Args:
        columns: ``{name: values}`` with ``len(values) == num_rows``; a name not in ``schema``
            is ignored, a missing name or ``None`` is a column of nulls (e.g.
            ``compare.results.CheckResult.to_columns``).
        num_rows: the number of rows.
        schema: ``MODULES_SCHEMA`` or ``OPS_SCHEMA``.

    Returns:
        A ``pyarrow.Table`` with exactly ``schema``'s columns, types and metadata. Values are
        converted as :func:`rows_to_table`'s struct conversion converts them (``from_pandas``:
        NaN is null): below ``STRUCT_ROWS`` rows that same conversion over tuples, else one
        conversion per column (issue 19: no dict per row; 1,002 rows ≈ 1.1–1.5 ms instead of
        2.2 ms). Anything refused sends the table through :func:`rows_to_table` on the rows,
        which converts or raises as usual.

    Raises:
        ValueError: a column's length is not ``num_rows``.
        pyarrow.ArrowInvalid: a value cannot be converted to its column's type.
    """
    layout = _layout(schema)
    given = {k: v for k, v in columns.items() if v is not None and k in layout.known}
    for name, values in given.items():
        if len(values) != num_rows:
            raise ValueError(f"column {name!r} has {len(values)} values, not {num_rows}")
    if not num_rows:
        return layout.empty
    try:
        if num_rows < STRUCT_ROWS:  # one struct conversion of tuples: one call, not 41
            nulls = (None,) * num_rows
            rows = list(zip(*(given.get(name, nulls) for name in layout.names), strict=True))
            return _struct_table(rows, schema)
        arrays = [
            pa.nulls(num_rows, f.type)
            if f.name not in given
            else pa.array(given[f.name], type=f.type, from_pandas=True)
            for f in layout.fields
        ]
        return pa.Table.from_arrays(arrays, schema=schema)
    except (pa.ArrowException, TypeError, ValueError):
        pass  # the rows' path converts what it can and raises its usual error
    names = list(given)
    rows = [dict(zip(names, values, strict=True)) for values in zip(*given.values(), strict=True)]
    return rows_to_table(rows, schema)


def _struct_table(rows: list[Any], schema: pa.Schema) -> pa.Table:
    """The rows as one struct array of ``schema``'s fields, then a table.

    ``rows``: mappings, or tuples of every field's value in schema order. Same result as the
    column-by-column build: keys outside the schema are ignored, missing ones are null, NaN is
    null (``from_pandas``: only float columns can hold a NaN).
    """
    layout = _layout(schema)
    struct = pa.array(rows, type=layout.struct, from_pandas=True)
    table = pa.Table.from_struct_array(struct)
    return table.replace_schema_metadata(layout.metadata) if layout.metadata else table


class _Layout(NamedTuple):
    """What the builders read of a schema, read once (see :func:`_layout`)."""

    schema: pa.Schema
    names: tuple[str, ...]
    known: frozenset[str]
    fields: tuple[pa.Field, ...]
    struct: pa.StructType
    empty: pa.Table  # tables are immutable: one zero-row table (≈ 0.3 ms to make for 40 columns)
    metadata: dict[bytes, bytes] | None


_LAYOUTS: dict[int, _Layout] = {}


def _layout(schema: pa.Schema) -> _Layout:
    """The names, fields, struct type, empty table and metadata of ``schema``, made once.

    Kept by the schema object's identity, checked on each use (the entry holds the schema, so
    its id cannot be reused while kept): hashing a ``pyarrow.Schema`` for an ``lru_cache``
    costs ≈ 45–60 µs and ``Schema.names`` builds a new list per call (≈ 7 µs; issue 19). At
    most 16 schemas are kept.
    """
    got = _LAYOUTS.get(id(schema))
    if got is None or got.schema is not schema:
        if len(_LAYOUTS) >= 16:
            _LAYOUTS.clear()
        got = _LAYOUTS[id(schema)] = _Layout(
            schema, tuple(schema.names), frozenset(schema.names), tuple(schema),
            pa.struct(list(schema)),
            schema.empty_table(), schema.metadata,
        )  # fmt: skip
    return got


def _column(values: list[Any], type_: pa.DataType) -> pa.Array:
    """One column; NaN becomes null in float columns (never NaN as a stand-in for "n/a")."""
    return pa.array(values, type=type_, from_pandas=pa.types.is_floating(type_))


def empty_table(schema: pa.Schema) -> pa.Table:
    """A zero-row table with ``schema``."""
    return schema.empty_table()


def write_table(table: pa.Table, path: str | os.PathLike[str]) -> Path:
    """Write ``table`` as parquet (zstd) atomically: to a temporary name, then renamed.

    The file metadata carries ``schema_version`` so ``read_table`` can migrate it later.
    A crash mid-write never leaves a half-written file under ``path``.

    Returns:
        The final path.
    """
    meta = dict(table.schema.metadata or {})
    meta[b"schema_version"] = str(SCHEMA_VERSION).encode()
    table = table.replace_schema_metadata(meta)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


def schema_version_of(path: str | os.PathLike[str]) -> int:
    """The ``schema_version`` stored in a parquet file's metadata (0 when absent)."""
    meta = pq.read_schema(path).metadata or {}
    return int(meta.get(b"schema_version", b"0"))


def _migrate_v0(table: pa.Table) -> pa.Table:
    """Migrate a v0 table to v1.

    v0 files (no ``schema_version`` in the metadata) hold the seed's printout as a table, from
    before multi-step runs: no ``step`` column and ``status`` as the seed prints it
    (``equal``, ``close``, ``not equal``, ``not close``). v1 adds ``step`` (0: one forward) and
    uses the contract's statuses (``not equal`` / ``not close`` → ``mismatch``); columns v0 did
    not have (``cache_hit``, ``local_*``, ...) become null in ``conform``.
    """
    import pyarrow.compute as pc

    if "step" not in table.column_names:
        table = table.append_column("step", pa.array([0] * table.num_rows, pa.int32()))
    if "status" in table.column_names:
        status = table.column("status")
        for old in ("not equal", "not close"):
            status = pc.if_else(pc.equal(status, old), "mismatch", status)
        table = table.set_column(table.schema.get_field_index("status"), "status", status)
    return table


def _migrate_v1(table: pa.Table) -> pa.Table:
    """Migrate a v1 table to v2: v2 adds the modules table's ``ranks`` column.

    A v1 run was never sharded, so its ``ranks`` is null (``conform`` fills the missing column
    with nulls; "not sharded" is what null means). No other column changed.
    """
    return table


def _migrate_v2(table: pa.Table) -> pa.Table:
    """Migrate a v2 table to v3: the error-budget columns added, null.

    v3 adds ``golden_max_abs_err``, ``twin_max_abs_err`` and ``error_ratio`` (issue 15); no run
    before v3 was compared by budget, so they are null for every earlier row.
    """
    for name in BUDGET_COLUMNS:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, pa.float64()))
    return table


# Migrations: version -> function(table) returning the table at version + 1.
MIGRATIONS: dict[int, Any] = {0: _migrate_v0, 1: _migrate_v1, 2: _migrate_v2}


#: Version of the run record ``summary.json`` (``parity_tracker.run.summary.RunSummary``),
#: kept here beside the tables' version so every on-disk format is versioned in one place.
#: v0: the untyped dict of before issue 12 (no ``schema_version`` key); v1 adds
#: ``schema_version``, ``worst_tensor`` and makes ``worst_tensor_histogram`` a field; v2 adds
#: ``worst_error_ratio``, ``worst_error_ratio_tag`` and ``error_ratio_infinite`` (issue 15).
SUMMARY_SCHEMA_VERSION = 2


def _migrate_summary_v0(data: dict[str, Any]) -> dict[str, Any]:
    """v0 → v1: the same keys; the worst tensor unknown (None) unless a histogram named it."""
    hist = data.get("worst_tensor_histogram") or None
    data.setdefault(
        "worst_tensor", {"tag": hist.get("tag"), "step": hist.get("step")} if hist else None
    )
    data.setdefault("worst_tensor_histogram", hist)
    return data


def _migrate_summary_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 → v2: the worst error ratio fields (issue 15) added, None (no budget before v2)."""
    for key in ("worst_error_ratio", "worst_error_ratio_tag", "error_ratio_infinite"):
        data.setdefault(key, None)
    return data


#: Summary migrations: version -> function(dict) returning the dict at version + 1.
SUMMARY_MIGRATIONS: dict[int, Any] = {0: _migrate_summary_v0, 1: _migrate_summary_v1}


def migrate_summary(data: Mapping[str, Any]) -> dict[str, Any]:
    """A ``summary.json`` dict of any version, migrated to ``SUMMARY_SCHEMA_VERSION``.

    Raises:
        InputError: the dict is from a newer version than this package knows.
    """
    out = dict(data)
    version = int(out.pop("schema_version", 0) or 0)
    if version > SUMMARY_SCHEMA_VERSION:
        from parity_tracker.errors import InputError

        raise InputError(
            f"summary.json has schema_version {version}, newer than this parity_tracker "
            f"({SUMMARY_SCHEMA_VERSION}); upgrade parity-tracker to read it"
        )
    while version < SUMMARY_SCHEMA_VERSION:
        out = SUMMARY_MIGRATIONS[version](out)
        version += 1
    return out


def read_table(path: str | os.PathLike[str], kind: str = "modules") -> pa.Table:
    """Read a parity table written by any schema version and migrate it to the current one.

    Args:
        path: a parquet file written by ``write_table``.
        kind: ``"modules"`` or ``"ops"``: which schema to conform to.

    Raises:
        InputError: (a ``ValueError``) the file is from a newer schema version than this
            package knows.
    """
    table = pq.read_table(path)
    version = schema_version_of(path)
    if version > SCHEMA_VERSION:
        from parity_tracker.errors import InputError

        raise InputError(
            f"{path} has schema_version {version}, newer than this parity_tracker "
            f"({SCHEMA_VERSION}); upgrade parity-tracker to read it"
        )
    while version < SCHEMA_VERSION:
        table = MIGRATIONS[version](table)
        version += 1
    return conform(table, SCHEMAS[kind])


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Reorder/cast ``table`` to ``schema``: missing columns become null, extras are dropped.

    NaN in a float column becomes null (the contract: nulls, never NaN as a stand-in).
    """
    import pyarrow.compute as pc

    cols = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name).cast(f.type)
            if pa.types.is_floating(f.type):  # NaN written by other tools -> null
                col = pc.if_else(pc.is_nan(col), pa.scalar(None, f.type), col)
            cols.append(col)
        else:
            cols.append(pa.nulls(table.num_rows, type=f.type))
    return pa.Table.from_arrays(cols, schema=schema.remove_metadata())
