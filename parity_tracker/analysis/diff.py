"""Diff two stored parity runs tag by tag: regressions, fixes, worse, better, drift, new, removed.

The decision is ONE small predicate, :func:`decide`, with explicit thresholds; it is written
over numpy arrays so the same code classifies one row (:func:`classify`) or a 100,000-row join
(:func:`diff_tables`) without a per-row Python loop. Rendering (rich, json, markdown) is kept
apart from the decision, in the pattern of asv's ``commands/compare.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from parity_tracker.statuses import is_passing, passing_mask

#: Every change label, in the order of the predicate (first matching rule wins).
CHANGES = ("new", "removed", "regression", "fix", "worse", "better", "drift", "unchanged")
#: Labels that mean "parity got worse" (``--fail-on regression`` in the nightly).
BAD_CHANGES = frozenset({"regression"})

#: Machine epsilon per dtype name: ``torch.finfo(dtype).eps`` (float8 from the OCP FP8 spec:
#: e4m3 has 3 mantissa bits → 2**-3, e5m2 has 2 → 2**-2). Integer and bool dtypes: 0.
DTYPE_EPS: dict[str, float] = {
    "float64": 2.0**-52,
    "complex128": 2.0**-52,
    "float32": 2.0**-23,
    "complex64": 2.0**-23,
    "float16": 2.0**-10,
    "bfloat16": 2.0**-7,
    "float8_e4m3fn": 2.0**-3,
    "float8_e4m3fnuz": 2.0**-3,
    "float8_e5m2": 2.0**-2,
    "float8_e5m2fnuz": 2.0**-2,
}

#: Default factor by which max_abs_diff must grow (or shrink) to count as worse (better).
WORSE_FACTOR = 2.0

#: Columns of the tables returned by :func:`diff_tables`.
DIFF_COLUMNS = (
    "tag",
    "step",
    "module",
    "kind",
    "exec_order",
    "change",
    "base_status",
    "head_status",
    "base_max_abs_diff",
    "head_max_abs_diff",
    "base_cand_hash",
    "head_cand_hash",
    "cand_dtype",
)


def dtype_eps(dtype: Any) -> float:
    """Machine epsilon of a dtype name such as ``"bfloat16"`` or ``"torch.float16"``.

    Returns 0.0 for integer, bool and unknown dtypes, where any difference counts.
    """
    if dtype is None:
        return 0.0
    return DTYPE_EPS.get(str(dtype).removeprefix("torch."), 0.0)


def decide(
    *,
    base_present: np.ndarray,
    head_present: np.ndarray,
    base_pass: np.ndarray,
    head_pass: np.ndarray,
    base_mad: np.ndarray,
    head_mad: np.ndarray,
    eps: np.ndarray,
    hash_changed: np.ndarray,
    worse_factor: float = WORSE_FACTOR,
) -> np.ndarray:
    """The change of one tag between a base run and a head run; the whole decision, elementwise.

    Rules, first match wins:

    ========== ===============================================================================
    new        the tag is only in head
    removed    the tag is only in base
    regression base passing (equal/close), head failing
    fix        base failing, head passing
    worse      head max_abs_diff > ``worse_factor`` × base max_abs_diff and > ``eps``
    better     base max_abs_diff > ``worse_factor`` × head max_abs_diff and > ``eps``
    drift      the candidate's content hash changed (numerics moved, the pass/fail class held)
    unchanged  none of the above
    ========== ===============================================================================

    Args:
        base_present: bool array, the tag exists in the base run.
        head_present: bool array, the tag exists in the head run.
        base_pass: bool array, the base status is passing (equal or close).
        head_pass: bool array, the head status is passing.
        base_mad: float64 array, base max_abs_diff; NaN where unknown (never worse/better).
        head_mad: float64 array, head max_abs_diff; NaN where unknown.
        eps: float64 array, the absolute floor (the candidate dtype's machine epsilon) a
            max_abs_diff must exceed to count as worse/better, so 0 → 1e-9 in float32 is not.
        hash_changed: bool array, both candidate hashes known and different.
        worse_factor: the growth factor (default 2, the issue's threshold).

    Returns:
        A numpy array of change labels (str), one per element.
    """
    with np.errstate(invalid="ignore"):
        worse = (head_mad > worse_factor * base_mad) & (head_mad > eps)
        better = (base_mad > worse_factor * head_mad) & (base_mad > eps)
    rules = [
        (~base_present, "new"),
        (~head_present, "removed"),
        (base_pass & ~head_pass, "regression"),
        (~base_pass & head_pass, "fix"),
        (worse, "worse"),
        (better, "better"),
        (hash_changed, "drift"),
    ]
    return np.select([c for c, _ in rules], [label for _, label in rules], default="unchanged")


def _mad(row: Mapping[str, Any] | None) -> float:
    value = None if row is None else row.get("max_abs_diff")
    return np.nan if value is None else float(value)


def classify(
    base_row: Mapping[str, Any] | None,
    head_row: Mapping[str, Any] | None,
    *,
    worse_factor: float = WORSE_FACTOR,
    eps: float | None = None,
) -> str:
    """Classify one tag's change between two ``modules`` rows (see :func:`decide` for the rules).

    Args:
        base_row: the base run's row (``status``, ``max_abs_diff``, ``cand_hash``,
            ``cand_dtype``), or ``None`` when the tag is absent from base.
        head_row: the head run's row, or ``None`` when absent from head.
        worse_factor: growth factor for ``worse``/``better`` (default 2).
        eps: absolute floor for ``worse``/``better``; default the machine epsilon of the
            candidate dtype (head's, else base's) from :data:`DTYPE_EPS`.

    Returns:
        One of :data:`CHANGES`.
    """
    either = head_row if head_row is not None else base_row or {}
    floor = dtype_eps(either.get("cand_dtype")) if eps is None else eps
    bh = None if base_row is None else base_row.get("cand_hash")
    hh = None if head_row is None else head_row.get("cand_hash")
    label = decide(
        base_present=np.array(base_row is not None),
        head_present=np.array(head_row is not None),
        base_pass=np.array(base_row is not None and is_passing(base_row.get("status"))),
        head_pass=np.array(head_row is not None and is_passing(head_row.get("status"))),
        base_mad=np.array(_mad(base_row)),
        head_mad=np.array(_mad(head_row)),
        eps=np.array(floor),
        hash_changed=np.array(bh is not None and hh is not None and bh != hh),
        worse_factor=worse_factor,
    )
    return str(label)


_KEEP = {
    "tag": pa.string(),
    "step": pa.int32(),
    "module": pa.string(),
    "kind": pa.string(),
    "exec_order": pa.int32(),
    "status": pa.string(),
    "max_abs_diff": pa.float64(),
    "cand_hash": pa.string(),
    "cand_dtype": pa.string(),
}


def _side(table: pa.Table, prefix: str) -> pa.Table:
    """The join columns of one run, step nulls as 0, the rest prefixed, with a presence flag."""
    cols = {}
    for name, typ in _KEEP.items():
        has = name in table.column_names
        col = table.column(name).cast(typ) if has else pa.nulls(table.num_rows, typ)
        if name == "step":
            col = pc.fill_null(col, 0)
        key = name if name in ("tag", "step") else f"{prefix}{name}"
        cols[key] = col
    cols[f"{prefix}present"] = pa.array(np.ones(table.num_rows, dtype=bool))
    return pa.table(cols)


def _np(col: pa.ChunkedArray, fill: Any, dtype: Any) -> np.ndarray:
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), dtype=dtype)


def _eps_per_row(dtype: pa.ChunkedArray) -> np.ndarray:
    """:func:`dtype_eps` of each row, computed once per distinct dtype (dictionary encoding)."""
    encoded = pc.fill_null(dtype, "").combine_chunks().dictionary_encode()
    per_value = np.array([dtype_eps(d) for d in encoded.dictionary.to_pylist()] or [0.0])
    return per_value[encoded.indices.to_numpy(zero_copy_only=False)]


def diff_tables(
    base_modules: pa.Table,
    head_modules: pa.Table,
    *,
    worse_factor: float = WORSE_FACTOR,
    eps: float | None = None,
) -> pa.Table:
    """Join two ``modules`` tables on (tag, step) and classify every tag with :func:`decide`.

    Vectorised: one pyarrow hash join and numpy masks; 100,000 rows take well under a second.

    Args:
        base_modules: the base (older) run's ``modules`` table (``tables.MODULES_SCHEMA``).
        head_modules: the head (newer) run's ``modules`` table.
        worse_factor: growth factor for ``worse``/``better`` (default 2).
        eps: absolute floor for ``worse``/``better``; default per row from the candidate dtype.

    Returns:
        A table with :data:`DIFF_COLUMNS`, sorted by head execution order (base's for removed
        tags), then step and tag. ``module``, ``kind``, ``exec_order`` and ``cand_dtype`` come
        from head where present, else base.
    """
    joined = _side(base_modules, "base_").join(
        _side(head_modules, "head_"), keys=["tag", "step"], join_type="full outer"
    )
    j = {name: joined.column(name) for name in joined.column_names}
    bh, hh = j["base_cand_hash"], j["head_cand_hash"]
    hash_changed = _np(pc.not_equal(bh, hh), False, bool)  # null (a hash unknown) → False
    dtype = pc.coalesce(j["head_cand_dtype"], j["base_cand_dtype"])
    eps_arr = _eps_per_row(dtype) if eps is None else np.full(joined.num_rows, float(eps))
    change = decide(
        base_present=_np(j["base_present"], False, bool),
        head_present=_np(j["head_present"], False, bool),
        base_pass=_np(passing_mask(j["base_status"]), False, bool),
        head_pass=_np(passing_mask(j["head_status"]), False, bool),
        base_mad=_np(j["base_max_abs_diff"].cast(pa.float64()), np.nan, np.float64),
        head_mad=_np(j["head_max_abs_diff"].cast(pa.float64()), np.nan, np.float64),
        eps=eps_arr,
        hash_changed=hash_changed,
        worse_factor=worse_factor,
    )
    names = ("module", "kind", "exec_order")
    pick = {n: pc.coalesce(j[f"head_{n}"], j[f"base_{n}"]) for n in names}
    out = pa.table(
        {
            "tag": j["tag"],
            "step": j["step"],
            **pick,
            "change": pa.array(change.astype(str), type=pa.string()),
            "base_status": j["base_status"].cast(pa.string()),
            "head_status": j["head_status"].cast(pa.string()),
            "base_max_abs_diff": j["base_max_abs_diff"].cast(pa.float64()),
            "head_max_abs_diff": j["head_max_abs_diff"].cast(pa.float64()),
            "base_cand_hash": bh.cast(pa.string()),
            "head_cand_hash": hh.cast(pa.string()),
            "cand_dtype": dtype,
        }
    )
    return out.sort_by([("exec_order", "ascending"), ("step", "ascending"), ("tag", "ascending")])


def count_changes(diff: pa.Table) -> dict[str, int]:
    """Rows per change label, every label of :data:`CHANGES` present (zeros included)."""
    counts = dict.fromkeys(CHANGES, 0)  # plus any label added later, e.g. ``expected``
    if diff.num_rows:
        vc = pc.value_counts(diff.column("change").combine_chunks())
        for item in vc.to_pylist():
            counts[item["values"]] = item["counts"]
    return counts


def interesting(diff: pa.Table, *, include_unchanged: bool = False) -> pa.Table:
    """The rows worth showing: every row whose change is not ``unchanged`` (unless asked)."""
    if include_unchanged:
        return diff
    return diff.filter(pc.not_equal(diff.column("change"), "unchanged"))


# --------------------------------------------------------------------------- rendering


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


_SHOWN = ("change", "tag", "step", "base_status", "head_status", "base_max_abs_diff",
          "head_max_abs_diff")  # fmt: skip
_STYLE = {"regression": "bold red", "worse": "red", "expected": "yellow", "fix": "green",
          "better": "green", "drift": "magenta", "new": "cyan", "removed": "cyan"}  # fmt: skip


def to_rich(diff: pa.Table, *, title: str = "diff", limit: int = 50) -> Any:
    """A ``rich.table.Table`` of the non-unchanged rows (at most ``limit``), styled by change."""
    from rich.table import Table

    table = Table(title=title)
    for col in _SHOWN:
        table.add_column(col, justify="right" if "diff" in col or col == "step" else "left")
    for row in interesting(diff).slice(0, limit).to_pylist():
        table.add_row(*(_fmt(row.get(c)) for c in _SHOWN), style=_STYLE.get(row["change"], ""))
    return table


def to_markdown(diff: pa.Table, *, limit: int = 50) -> str:
    """A GitHub-flavoured markdown table of the non-unchanged rows (at most ``limit``)."""
    rows = interesting(diff)
    lines = ["| " + " | ".join(_SHOWN) + " |", "|" + "---|" * len(_SHOWN)]
    for row in rows.slice(0, limit).to_pylist():
        cells = (_fmt(row.get(c)).replace("|", "\\|") for c in _SHOWN)
        lines.append("| " + " | ".join(cells) + " |")
    if rows.num_rows > limit:
        lines.append(f"\n… and {rows.num_rows - limit} more")
    return "\n".join(lines)


def to_json(diff: pa.Table, **extra: Any) -> str:
    """JSON: ``{"counts": {...}, "rows": [non-unchanged rows], **extra}``."""
    payload = {"counts": count_changes(diff), "rows": interesting(diff).to_pylist(), **extra}
    return json.dumps(payload, default=str)
