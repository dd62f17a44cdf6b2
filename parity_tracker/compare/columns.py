"""The columns of a comparison row: the ``modules`` and ``ops`` table schemas (pyarrow).

One owner of the record format every comparison produces (:class:`~parity_tracker.compare.
results.TagResult.to_row`, the op rows of :mod:`parity_tracker.localize`); the parquet files,
their ``SCHEMA_VERSION`` and migrations are :mod:`parity_tracker.files.tables`'s, which
re-exports these names. Columns are documented in docs/design.md ("Tables"); adding one means a
new ``SCHEMA_VERSION`` and a migration there.
"""

from __future__ import annotations

import pyarrow as pa

_I32, _I64, _F64, _STR, _BOOL = pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.bool_()
_SHAPE = pa.list_(pa.int64())

#: Columns shared by both tables, in order.
COMMON_FIELDS: tuple[pa.Field, ...] = (
    pa.field("run_id", _STR),
    pa.field("tag", _STR, nullable=False),
    pa.field("module", _STR),
    pa.field("kind", _STR),  # param | buffer | input | output | op | manual
    pa.field("slot", _STR),
    pa.field("call_index", _I32),
    pa.field("exec_order", _I32),
    pa.field("step", _I32),
    pa.field("status", _STR, nullable=False),
    pa.field("mode", _STR),
    pa.field("numel", _I64),
    pa.field("ref_shape", _SHAPE),
    pa.field("cand_shape", _SHAPE),
    pa.field("ref_dtype", _STR),
    pa.field("cand_dtype", _STR),
    pa.field("ref_device", _STR),
    pa.field("cand_device", _STR),
    pa.field("mismatch_count", _I64),
    pa.field("max_abs_diff", _F64),
    pa.field("max_abs_diff_index", _SHAPE),
    pa.field("max_rel_diff", _F64),
    pa.field("mean_abs_diff", _F64),
    pa.field("cosine", _F64),
    pa.field("sqnr_db", _F64),
    pa.field("max_ulp", _F64),
    pa.field("ref_nan", _I64),
    pa.field("cand_nan", _I64),
    pa.field("ref_inf", _I64),
    pa.field("cand_inf", _I64),
    pa.field("ref_hash", _STR),
    pa.field("cand_hash", _STR),
    pa.field("rtol", _F64),
    pa.field("atol", _F64),
    pa.field("dump_path", _STR),
    pa.field("message", _STR),
    pa.field("cache_hit", _BOOL),
    pa.field("local_status", _STR),
    pa.field("local_max_abs_diff", _F64),
    # error budget (issue 15, mode "budget"; null in other modes): e_cand, e_twin and
    # e_cand / max(e_twin, floor), which may be +inf (parity_tracker.compare.budget)
    pa.field("golden_max_abs_err", _F64),
    pa.field("twin_max_abs_err", _F64),
    pa.field("error_ratio", _F64),
)

#: The error-budget columns (issue 15), in table order: the candidate's error against the float64
#: golden, PyTorch's own (the twin's), and their ratio. Null in other modes; a budget run's CLI
#: worst-tensors table and report module table show them (``mode`` ``budget`` only).
BUDGET_COLUMNS = ("golden_max_abs_err", "twin_max_abs_err", "error_ratio")

MODULES_SCHEMA = pa.schema(
    [
        *COMMON_FIELDS,
        # v2, sharded runs (parity_tracker.distributed): the ranks whose part differs, [] when
        # all agree, null when not sharded or no rank can be named (a partial sum)
        pa.field("ranks", pa.list_(_I32)),
    ]
)

OPS_SCHEMA = pa.schema(
    [
        *COMMON_FIELDS,
        pa.field("op", _STR),
        pa.field("op_index", _I32),
        pa.field("inputs_status", _STR),  # passing | failing | unknown
        pa.field("root_cause", _BOOL),  # failing op whose inputs all pass
        pa.field("cause", _STR),  # seed case: A | B | C (null unless root_cause)
    ]
)

SCHEMAS: dict[str, pa.Schema] = {"modules": MODULES_SCHEMA, "ops": OPS_SCHEMA}
