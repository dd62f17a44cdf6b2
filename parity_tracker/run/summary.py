"""The run record: ``RunSummary``, typed, frozen and versioned, and how it is derived.

``summary.json`` is ``RunSummary.to_json()``: strict JSON (no NaN/Infinity), the same key names
as the untyped dict it replaces (so old readers keep working), plus ``schema_version``
(``files.tables.SUMMARY_SCHEMA_VERSION``, migrations beside the tables'). ``from_json`` migrates
an older file forward. Later stages never edit a record: ``replace(...)`` returns a new one.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from parity_tracker.compare import verdict
from parity_tracker.files import jsonio
from parity_tracker.files.tables import SUMMARY_SCHEMA_VERSION, migrate_summary
from parity_tracker.run.mode import config_fingerprint
from parity_tracker.statuses import (
    NEUTRAL,
    PASSING,
    STATUSES,
    WEIGHT_KINDS,  # noqa: F401  (re-exported: an old ``parity_tracker.run`` name)
    failing_mask,
    weight_mask,
)

#: Execution statuses of a run (``summary["status"]``) and the MLflow run status each maps to.
RUN_STATUSES = {"completed": "FINISHED", "failed": "FAILED", "killed": "KILLED"}


# ---------------------------------------------------------------------------------------------
# the record


class _Record:
    """``to_dict`` / ``from_dict`` for the small frozen records below (unknown keys ignored)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None):
        if data is None:
            return None
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class FirstDivergence(_Record):
    """The first failing row of a table (``first_divergence``): where parity first breaks.

    Attributes:
        tag: the row's tag; module: its module display name (None for a manual tag);
        kind: param | buffer | input | output | op | manual; step, exec_order: its place in
        execution order; status: its failing status; max_abs_diff: max |candidate −
        reference| (None when not computable); message: the comparison's message;
        ranks: a sharded run's ranks whose part differs (the modules row's ``ranks``; None
        when not sharded or no rank can be named, ``parity_tracker.distributed``).
    """

    tag: str
    module: str | None = None
    kind: str | None = None
    step: int | None = None
    exec_order: int | None = None
    status: str | None = None
    max_abs_diff: float | None = None
    message: str | None = None
    ranks: list[int] | None = None


@dataclass(frozen=True)
class WorstTensor(_Record):
    """The worst failing tensor of a run (the one whose difference histogram is shown).

    Attributes:
        tag, module, step, status: the row's; max_abs_diff: max |candidate − reference|;
        sqnr_db: signal-to-quantization-noise ratio in dB (None when not computable).
    """

    tag: str
    module: str | None = None
    step: int | None = None
    status: str | None = None
    max_abs_diff: float | None = None
    sqnr_db: float | None = None


@dataclass(frozen=True)
class RunError(_Record):
    """A forward that raised.

    Attributes: type (exception class name), message, traceback (formatted), side
    (``reference`` or ``candidate``), rank (a sharded run: the rank that raised first,
    ``parity_tracker.distributed``; None otherwise).
    """

    type: str
    message: str
    traceback: str | None = None
    side: str | None = None
    rank: int | None = None


_NESTED = {"first_divergence": FirstDivergence, "first_divergent_op": FirstDivergence,
           "worst_tensor": WorstTensor, "error": RunError}  # fmt: skip


@dataclass(frozen=True)
class RunSummary(Mapping[str, Any]):
    """The record of one parity run (``summary.json``), frozen; read it as fields.

    It is also a read-only ``Mapping`` over ``to_dict()`` (``summary["mode"]``,
    ``summary.get("error")``), so readers of the old untyped dict keep working.

    Attributes:
        run_id: the parity run id (32 hex digits).
        status: ``completed`` | ``failed`` (a forward raised) | ``killed`` (interrupted).
        passed: the run completed, at least one tensor was compared, and no modules or ops row
            has a failing status (anything but equal, close, skipped).
        mode, mode_reason, requested_mode: the comparison mode used, why, and what was asked.
        settings, environment: the run's settings and recorded environment (``ENV_KEYS``).
        config_fingerprint: ``mode.config_fingerprint(settings)`` (16 hex digits).
        counts, ops_counts: rows per status of the modules / ops table, every status present.
        tensors_compared, tensors_passing, tensors_failing, tensors_skipped: modules rows.
        ops_compared, ops_failing: ops rows.
        weights_failing: failing param/buffer rows (reported apart from modules).
        cache_hits_failing: failing rows marked ``cache_hit`` (not divergences).
        first_divergence, first_divergent_op: the first failing PAIRED modules / ops row, or
            None (``compare.verdict.first_divergence``).
        structure_differences: the modules rows whose tag exists on one side only (``tag``,
            ``module``, ``kind``, ``step``, ``status``: ``missing_candidate`` = reference only),
            in execution order (``compare.verdict.structure_differences``); never a divergence.
            Empty for a run that did not complete (its unreached tags are not structure).
        root_causes: root-cause op rows (tag, module, op, op_index, step, exec_order, status,
            cause, message).
        output_max_abs_diff, output_sqnr_db, output_equal: the root output's metrics (None when
            no root output was compared; an infinite SQNR is None with ``output_equal`` True).
        worst_tensor: the worst failing tensor, or None when none failed.
        worst_tensor_histogram: its |candidate − reference| histogram (``run.histogram``), or
            None when no tensor failed or its two sides were not both tensors of one shape.
        worst_error_ratio, worst_error_ratio_tag, error_ratio_infinite: budget runs' largest
            ``error_ratio`` and its tag (``ratio_metrics``; infinite: None with the flag True).
        error: the exception of a failed/killed run, else None.
        steps: distinct steps compared. durations_s: seconds per phase (reference,
            candidate, compare, isolate, golden, twin). start_time_ms: ms since the epoch.
        extra: keys of a stored summary this version does not know, kept (never dropped).
        schema_version: ``SUMMARY_SCHEMA_VERSION``.
    """

    run_id: str
    status: str
    passed: bool
    mode: str
    mode_reason: str = ""
    requested_mode: str = "auto"
    settings: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    config_fingerprint: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    ops_counts: dict[str, int] = field(default_factory=dict)
    tensors_compared: int = 0
    tensors_passing: int = 0
    tensors_failing: int = 0
    tensors_skipped: int = 0
    ops_compared: int = 0
    ops_failing: int = 0
    weights_failing: int = 0
    cache_hits_failing: int = 0
    first_divergence: FirstDivergence | None = None
    first_divergent_op: FirstDivergence | None = None
    structure_differences: tuple[dict[str, Any], ...] = ()
    root_causes: tuple[dict[str, Any], ...] = ()
    output_max_abs_diff: float | None = None
    output_sqnr_db: float | None = None
    output_equal: bool | None = None
    worst_tensor: WorstTensor | None = None
    worst_tensor_histogram: dict[str, Any] | None = None
    worst_error_ratio: float | None = None
    worst_error_ratio_tag: str | None = None
    error_ratio_infinite: bool | None = None
    error: RunError | None = None
    steps: int = 0
    durations_s: dict[str, float] = field(default_factory=dict)
    start_time_ms: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SUMMARY_SCHEMA_VERSION

    # -- conversion
    def to_dict(self) -> dict[str, Any]:
        """The ``summary.json`` dict: fields by name, nested records as dicts, ``extra`` merged.

        Returns a fresh dict (deep copy): editing it never changes the record.
        """
        out = json.loads(self._json)
        return out

    def to_json(self, *, indent: int | None = 2) -> str:
        """Strict JSON (sorted keys).

        Raises:
            ValueError: a NaN or infinity somewhere in the record (strict JSON has neither).
        """
        return jsonio.dumps(json.loads(self._json), indent=indent, sort_keys=True)

    @cached_property
    def _json(self) -> str:
        data = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"
        }
        for key, value in data.items():
            if isinstance(value, _Record):
                data[key] = value.to_dict()
        data["root_causes"] = [dict(r) for r in self.root_causes]
        data["structure_differences"] = [dict(r) for r in self.structure_differences]
        data = {**self.extra, **data}
        return jsonio.dumps(data, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSummary:
        """A record from a ``summary.json`` dict of any schema version (migrated forward).

        Unknown keys are kept in ``extra``. Raises ``InputError`` for a newer schema version
        and ``TypeError`` when a required key (run_id, status, passed, mode) is missing.
        """
        data = migrate_summary(data)
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {
            k: v for k, v in data.items() if k in names and k not in ("extra", "schema_version")
        }
        for key, typ in _NESTED.items():
            if key in kwargs:
                kwargs[key] = typ.from_dict(kwargs[key])
        kwargs["root_causes"] = tuple(dict(r) for r in kwargs.get("root_causes") or ())
        kwargs["structure_differences"] = tuple(
            dict(r) for r in kwargs.get("structure_differences") or ()
        )
        extra = {
            **dict(data.get("extra") or {}),
            **{k: v for k, v in data.items() if k not in names},
        }
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_json(cls, text: str) -> RunSummary:
        """``from_dict(json.loads(text))``."""
        return cls.from_dict(json.loads(text))

    def replace(self, **changes: Any) -> RunSummary:
        """A new record with ``changes`` (``dataclasses.replace``); this one is unchanged."""
        return dataclasses.replace(self, **changes)

    # -- read-only Mapping over to_dict(), for readers of the old dict
    @cached_property
    def _view(self) -> dict[str, Any]:
        return self.to_dict()

    def __getitem__(self, key: str) -> Any:
        return self._view[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._view)

    def __len__(self) -> int:
        return len(self._view)

    __hash__ = None  # type: ignore[assignment]  # holds dicts: not hashable

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RunSummary):
            return self._json == other._json
        return NotImplemented


# ---------------------------------------------------------------------------------------------
# summary


def _finite(x: Any) -> float | None:
    """``float(x)`` when finite, else None (summary.json must stay strict JSON)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


#: the exact types :func:`_json_clean` keeps as they are, tested first (issue 19: most of a
#: summary's ≈ 65 values; ``isinstance`` against the ``Mapping`` ABC costs ≈ 0.5 µs a value)
_KEPT = frozenset((str, int, bool, type(None)))


def _json_clean(obj: Any) -> Any:
    """Round-trip through strict JSON so a stored and a loaded summary compare equal."""
    kind = type(obj)
    if kind in _KEPT:
        return obj
    if kind is dict:
        return {str(k): _json_clean(v) for k, v in obj.items()}
    if isinstance(obj, float):
        return _finite(obj)
    if isinstance(obj, Mapping):
        return {str(k): _json_clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_clean(v) for v in obj]
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    return str(obj)


def status_counts(table: pa.Table) -> dict[str, int]:
    """Rows per status, every status of the contract present (zero when absent)."""
    counts = dict.fromkeys(STATUSES, 0)
    if table.num_rows:
        for item in pc.value_counts(table.column("status")).to_pylist():
            counts[item["values"]] = counts.get(item["values"], 0) + int(item["counts"])
    return counts


def _failing_rows(table: pa.Table, columns: list[str]) -> list[dict[str, Any]]:
    """The failing rows (``statuses.failing_mask``) of ``columns``, in table order."""
    if not table.num_rows:
        return []
    return table.select(columns).filter(failing_mask(table.column("status"))).to_pylist()


def _count(mask: Any) -> int:
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


_FD_KEYS = ["tag", "module", "kind", "step", "exec_order", "status", "max_abs_diff", "message"]


def first_divergence(table: pa.Table) -> dict[str, Any] | None:
    """The first divergence of a modules/ops table (``compare.verdict.first_divergence``).

    Failing rows in execution order (step, exec_order, table order), weights and ``cache_hit``
    rows left out (they are counted in ``weights_failing`` / ``cache_hits_failing``).

    Returns:
        ``{tag, module, kind, step, exec_order, status, max_abs_diff, message}`` (plus
        ``ranks`` for a modules table), or None.
    """
    ranks = ["ranks"] if "ranks" in table.column_names else []  # modules table: sharded runs
    rows = _failing_rows(table, [*_FD_KEYS, "cache_hit", *ranks])
    row = verdict.first_divergence(rows)
    return None if row is None else {k: row[k] for k in [*_FD_KEYS, *ranks]}


_SD_KEYS = ["tag", "module", "kind", "step", "status"]


def structure_differences(table: pa.Table) -> list[dict[str, Any]]:
    """The one-sided rows of a modules table (``compare.verdict.structure_differences``).

    Returns:
        ``[{tag, module, kind, step, status}, ...]`` in execution order.
    """
    rows = _failing_rows(table, [*_SD_KEYS, "exec_order"])
    return [{k: r[k] for k in _SD_KEYS} for r in verdict.structure_differences(rows)]


def worst_tensor(table: pa.Table | list[dict[str, Any]]) -> dict[str, Any] | None:
    """The worst failing tensor (``compare.verdict.worst_tensor``).

    The one whose histogram the run records and the report draws.

    Returns:
        ``{tag, module, step, status, max_abs_diff, sqnr_db}`` of that row, or None when no
        row fails.
    """
    cols = ["tag", "module", "step", "status", "max_abs_diff", "sqnr_db"]
    if isinstance(table, pa.Table):
        table = _failing_rows(table, cols)
    row = verdict.worst_tensor(table)
    return None if row is None else {k: row.get(k) for k in cols}


def output_metrics(table: pa.Table, root: str = "model") -> dict[str, Any]:
    """Output-level metrics from the root model's output rows (``module == root``).

    ``root`` is the root's tag name: ``"model"``, or ``"root"`` when the model has a child
    named ``model`` (``parity_tracker.capture.root_name``; Hugging Face ``*ForCausalLM``).

    Over every root output row (all steps, all structured-output leaves):
    ``output_max_abs_diff`` is the largest max_abs_diff, ``output_sqnr_db`` the smallest
    sqnr_db (the worst), ``output_equal`` whether all are ``equal``. Values are None when no
    root output was compared (e.g. a candidate that is not an nn.Module) or not computable;
    an infinite SQNR (identical outputs) is stored as None with ``output_equal`` True.
    """
    cols = table.select(["module", "kind", "status", "max_abs_diff", "sqnr_db"])
    if cols.num_rows:  # the root's output rows only (a null module or kind is neither)
        keep = pc.and_(
            pc.equal(cols.column("module"), root), pc.equal(cols.column("kind"), "output")
        )
        cols = cols.filter(keep)
    if not cols.num_rows:
        return {"output_max_abs_diff": None, "output_sqnr_db": None, "output_equal": None}
    # by column: a table's to_pylist costs ≈ 14 µs even for one row (issue 19)
    diffs = [d for d in cols.column("max_abs_diff").to_pylist() if d is not None]
    sqnrs = [q for q in cols.column("sqnr_db").to_pylist() if q is not None]
    judged = [s for s in cols.column("status").to_pylist() if s not in NEUTRAL]
    return {
        "output_max_abs_diff": _finite(max(diffs)) if diffs else None,
        "output_sqnr_db": _finite(min(sqnrs)) if sqnrs else None,
        # leaves not compared (non-tensor outputs, issue 13) neither make nor break equality
        "output_equal": all(s == "equal" for s in judged) if judged else None,
    }


def _has_column(table: pa.Table, name: str) -> bool:
    """``name in table.column_names``, by one schema look-up when it names one column.

    ``column_names`` builds the list of every name (≈ 17 µs for a modules table, issue 19);
    a name that is absent or repeated is answered by that list, as before.
    """
    return table.schema.get_field_index(name) >= 0 or name in table.column_names


def ratio_metrics(table: pa.Table) -> dict[str, Any]:
    """The worst ``error_ratio`` of a budget run (``compare.verdict.worst_error_ratio``).

    Strict JSON has no infinity: an infinite worst ratio is stored as ``worst_error_ratio``
    None with ``error_ratio_infinite`` True (as an infinite SQNR is None + ``output_equal``).
    All three are None when no row has a ratio (a run in another mode).
    """
    if not _has_column(table, "error_ratio") or table.column("error_ratio").null_count == len(
        table
    ):  # no row has a ratio (NaN is stored as null): a run in another mode
        return {"worst_error_ratio": None, "worst_error_ratio_tag": None,
                "error_ratio_infinite": None}  # fmt: skip
    row = verdict.worst_error_ratio(table.select(["tag", "error_ratio"]).to_pylist())
    if row is None:
        return {"worst_error_ratio": None, "worst_error_ratio_tag": None,
                "error_ratio_infinite": None}  # fmt: skip
    ratio = row["error_ratio"]
    return {
        "worst_error_ratio": _finite(ratio),
        "worst_error_ratio_tag": row["tag"],
        "error_ratio_infinite": math.isinf(ratio),
    }


def build_summary(
    modules: pa.Table,
    ops: pa.Table,
    *,
    run_id: str,
    status: str,
    mode: str,
    mode_reason: str,
    requested_mode: str,
    settings: Mapping[str, Any],
    environment: Mapping[str, Any],
    error: Mapping[str, Any] | None = None,
    root_causes: list[dict[str, Any]] | None = None,
    durations_s: Mapping[str, float] | None = None,
    start_time_ms: int | None = None,
    root: str = "model",
    worst_tensor_histogram: Mapping[str, Any] | None = None,
) -> RunSummary:
    """The run record derived from the run's tables (non-finite floats become None).

    ``worst_tensor`` is ``worst_tensor(modules)``; ``worst_tensor_histogram`` is passed by the
    run stage, which still holds the tensors (``run.histogram``).

    ``passed`` is True only when the run completed, at least one tensor was compared, and no
    modules or ops row has a failing status (anything but equal, close, skipped). In ``equal``
    mode the comparison core never returns ``close``, so passing there means bitwise equal.
    """
    counts, ops_counts = status_counts(modules), status_counts(ops)
    passing = sum(counts[s] for s in PASSING)
    skipped = sum(counts[s] for s in NEUTRAL)
    n_failing = modules.num_rows - passing - skipped
    ops_failing = ops.num_rows - sum(ops_counts[s] for s in PASSING | NEUTRAL)
    steps = pc.unique(modules.column("step")).drop_null()  # distinct steps (len only)
    # n_failing counts the rows failing_mask marks (neither passing nor neutral): with none,
    # every failing-row figure below is empty and its table scans are skipped (issue 19)
    if n_failing:
        failing = failing_mask(modules.column("status"))
        weights = weight_mask(modules.column("kind"))
        cache_hit = pc.fill_null(modules.column("cache_hit"), False)
    summary = {
        "run_id": run_id,
        "status": status,
        "passed": status == "completed" and n_failing == 0 and ops_failing == 0 and passing > 0,
        "counts": counts,
        "ops_counts": ops_counts,
        "tensors_compared": modules.num_rows,
        "tensors_passing": passing,
        "tensors_failing": n_failing,
        "tensors_skipped": skipped,
        "ops_compared": ops.num_rows,
        "ops_failing": ops_failing,
        "weights_failing": _count(pc.and_(failing, weights)) if n_failing else 0,
        "first_divergence": first_divergence(modules) if n_failing else None,
        "first_divergent_op": first_divergence(ops) if ops_failing else None,
        # a forward that raised leaves tags unreached, not one-sided: the error says so
        "structure_differences": structure_differences(modules)
        if status == "completed" and n_failing
        else [],
        "root_causes": list(root_causes or []),
        "cache_hits_failing": _count(pc.and_(pc.and_(failing, pc.invert(weights)), cache_hit))
        if n_failing
        else 0,
        **output_metrics(modules, root),
        "mode": mode,
        "mode_reason": mode_reason,
        "requested_mode": requested_mode,
        "settings": dict(settings),
        "environment": dict(environment),
        "config_fingerprint": config_fingerprint(settings),
        "error": dict(error) if error else None,
        "steps": len(steps),
        "durations_s": dict(durations_s or {}),
        "start_time_ms": start_time_ms,
        "worst_tensor": worst_tensor(modules) if n_failing else None,
        **ratio_metrics(modules),
        "worst_tensor_histogram": dict(worst_tensor_histogram) if worst_tensor_histogram else None,
    }
    return RunSummary.from_dict(_json_clean(summary))
