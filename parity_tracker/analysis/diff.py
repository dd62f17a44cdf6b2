"""Diff two stored parity runs tag by tag: regressions, fixes, worse, better, drift, new, removed.

The decision is ONE small predicate, :func:`decide`, with explicit thresholds; it is written
over numpy arrays so the same code classifies one row (:func:`classify`) or a 100,000-row join
(:func:`diff_tables`) without a per-row Python loop. :func:`diff_runs` is the whole sequence
(join, decide, expected divergences, counts) that the CLI and the nightly share. Rendering
(rich, json, markdown) lives apart, in ``analysis.render`` (the pattern of asv's
``commands/compare.py``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from parity_tracker.analysis.configs import config_differences
from parity_tracker.errors import InputError
from parity_tracker.statuses import failing_mask, is_passing, passing_mask

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
    "base_error_ratio",
    "head_error_ratio",
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
    base_ratio: np.ndarray | float = np.nan,
    head_ratio: np.ndarray | float = np.nan,
) -> np.ndarray:
    """The change of one tag between a base run and a head run; the whole decision, elementwise.

    Rules, first match wins:

    ========== ===============================================================================
    new        the tag is only in head
    removed    the tag is only in base
    regression base passing (equal/close), head failing
    fix        base failing, head passing
    worse      head max_abs_diff > ``worse_factor`` × base max_abs_diff and > ``eps``, or
               head error_ratio > ``worse_factor`` × base error_ratio and > 1 (issue 15)
    better     the same with base and head swapped
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
        base_ratio: float64 array, base ``error_ratio`` (budget runs); NaN where unknown.
        head_ratio: float64 array, head ``error_ratio``; NaN where unknown. A ratio counts
            only above 1 (PyTorch's own error at that precision): growth below it is noise.

    Returns:
        A numpy array of change labels (str), one per element.
    """

    def grew(new: Any, old: Any, floor: Any) -> np.ndarray:  # the one growth predicate
        with np.errstate(invalid="ignore"):
            return (new > worse_factor * old) & (new > floor)

    worse = grew(head_mad, base_mad, eps) | grew(head_ratio, base_ratio, 1.0)
    better = grew(base_mad, head_mad, eps) | grew(base_ratio, head_ratio, 1.0)
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


def _mad(row: Mapping[str, Any] | None, key: str = "max_abs_diff") -> float:
    value = None if row is None else row.get(key)
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
        base_ratio=np.array(_mad(base_row, "error_ratio")),
        head_ratio=np.array(_mad(head_row, "error_ratio")),
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
    "error_ratio": pa.float64(),
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
        base_ratio=_np(j["base_error_ratio"], np.nan, np.float64),
        head_ratio=_np(j["head_error_ratio"], np.nan, np.float64),
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
            "base_error_ratio": j["base_error_ratio"],
            "head_error_ratio": j["head_error_ratio"],
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


# --------------------------------------------------------------------------- two runs


@dataclass(frozen=True)
class RunDiff:
    """The diff of two runs, expectations applied: what the CLI prints and the nightly records.

    Attributes:
        table: one row per (tag, step), :data:`DIFF_COLUMNS`, with ``change`` relabelled
            ``expected`` where a live expected entry matched.
        counts: rows per change label (``count_changes``), ``expected`` included.
        expected_used: the live expected entries that matched at least one row.
        unexpected_failing: head rows that fail (not passing, not skipped; removed tags do not
            count) and are not ``expected``.
        base_id: the base run's id (MLflow run id, or None: no baseline, every tag is new).
        head_id: the head run's id, when known.
        config_differences: what differs between the two runs' configurations (settings,
            mode, tolerances: ``analysis.configs.config_differences``); empty when they share
            one, or when a side's settings are unknown (a bare table, no baseline).
    """

    table: pa.Table
    counts: dict[str, int]
    expected_used: tuple[Any, ...] = ()
    unexpected_failing: int = 0
    base_id: str | None = None
    head_id: str | None = None
    config_differences: tuple[str, ...] = ()

    @property
    def regressions(self) -> int:
        """Rows labelled ``regression`` (the CLI exits 1 when any)."""
        return self.counts.get("regression", 0)

    def rows(self, *, include_unchanged: bool = False) -> pa.Table:
        """The rows worth showing (``interesting``)."""
        return interesting(self.table, include_unchanged=include_unchanged)


def _modules_of(run: Any, store: Any) -> tuple[pa.Table | None, Any, str | None]:
    """``(modules table, the run or None, its id)`` of a run id, ``RunResult`` or table."""
    if run is None:
        return None, None, None
    if isinstance(run, str):
        if store is None:
            raise InputError(f"diff_runs got run id {run!r} without a store; pass store=RunStore")
        # tables and settings only (``RunStore.load_tables``): no RunResult, so no torch import
        run = store.load_tables(run) if hasattr(store, "load_tables") else store.load(run)
    if isinstance(run, pa.Table):
        return run, None, None
    return run.modules, run, getattr(run, "tracking_run_id", None)


def diff_runs(
    base: Any,
    head: Any,
    *,
    expected: Sequence[Any] = (),
    today: dt.date | None = None,
    target: str | None = None,
    settings: Mapping[str, Any] | None = None,
    worse_factor: float = WORSE_FACTOR,
    store: Any = None,
) -> RunDiff:
    """Diff two runs tag by tag and apply the expected divergences: the CLI's and nightly's diff.

    Args:
        base: the base run: a ``RunResult``, its ``modules`` table, an MLflow run id (read
            through ``store``), or None (no baseline: every head tag is ``new``).
        head: the head run, in the same forms (not None).
        expected: ``ExpectedEntry`` items (``expected.load_expected``); none by default.
        today: the date expected entries expire against (default: today in UTC).
        target: the target the entries are matched on (default: head's ``target`` setting).
        settings: the settings they are matched on (default: head's settings).
        worse_factor: growth factor for ``worse``/``better`` (``decide``).
        store: a ``track.query.RunStore`` to read run ids from.

    Returns:
        A ``RunDiff``.

    Raises:
        InputError: a run id without ``store``, or an unknown run id.
        InfrastructureError: the store could not be reached.
    """
    from parity_tracker.analysis.expected import apply_expected

    head_tab, head_run, head_id = _modules_of(head, store)
    base_tab, base_run, base_id = _modules_of(base, store)
    if head_tab is None:
        raise InputError("diff_runs needs a head run")
    differences = config_differences(
        getattr(base_run, "settings", None), getattr(head_run, "settings", None),
        base_tab, head_tab,
    )  # fmt: skip
    if isinstance(base, str) and base_id is None:
        base_id = base
    if isinstance(head, str) and head_id is None:
        head_id = head
    if base_tab is None:
        base_tab = head_tab.schema.empty_table()
    table = diff_tables(base_tab, head_tab, worse_factor=worse_factor)
    used: list[Any] = []
    if expected:
        sets = dict(settings if settings is not None else getattr(head_run, "settings", {}) or {})
        table, used = apply_expected(
            table,
            list(expected),
            target=str(target if target is not None else sets.get("target")),
            settings=sets,
            today=today or dt.datetime.now(dt.timezone.utc).date(),
        )
    status = table.column("head_status")
    failing = pc.and_(pc.is_valid(status), failing_mask(status))
    unexpected = pc.and_(failing, pc.not_equal(table.column("change"), "expected"))
    return RunDiff(
        table=table,
        counts=count_changes(table),
        expected_used=tuple(used),
        unexpected_failing=int(pc.sum(pc.cast(unexpected, pa.int64())).as_py() or 0),
        base_id=base_id,
        head_id=head_id,
        config_differences=tuple(differences),
    )


def __getattr__(name: str) -> Any:
    """Old names: the renderers moved to ``analysis.render``."""
    if name in ("to_rich", "to_markdown", "to_json", "markdown_table"):
        from parity_tracker.analysis import render

        return getattr(render, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
