"""The run record: ``RunResult`` and the summary derived from a run's tables."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from parity_tracker.compare import PASSING, STATUSES
from parity_tracker.run.mode import config_fingerprint

#: Statuses that count as neither passing nor failing (the pair could not be judged).
NEUTRAL = frozenset({"skipped"})
#: Row kinds that are weights: reported apart from module divergences.
WEIGHT_KINDS = ("buffer", "param")
#: Execution statuses of a run (``summary["status"]``) and the MLflow run status each maps to.
RUN_STATUSES = {"completed": "FINISHED", "failed": "FAILED", "killed": "KILLED"}


# ---------------------------------------------------------------------------------------------
# the result record


@dataclass(eq=False)
class RunResult:
    """The record of one parity run, ready to be written to disk or MLflow.

    Attributes:
        run_id: the parity run id (32 hex digits), also in every table row's ``run_id`` and the
            MLflow tag ``parity.run_id``. Not the MLflow run id (see ``tracking_run_id``).
        modules: one row per compared tag and step (``tables.MODULES_SCHEMA``).
        ops: one row per compared op output (``tables.OPS_SCHEMA``); empty unless ops captured.
        summary: JSON-clean dict (no NaN/inf: non-finite floats become None): ``status``
            (completed | failed | killed), ``passed``, ``counts`` / ``ops_counts`` (rows per
            status, every status present), ``tensors_compared/passing/failing/skipped``,
            ``weights_failing`` (failing param/buffer rows),
            ``first_divergence`` (tag, module, kind, step, exec_order, status, max_abs_diff) or
            None, ``root_causes``, ``output_max_abs_diff``, ``output_sqnr_db``, ``output_equal``,
            ``mode``, ``mode_reason``, ``requested_mode``, ``settings``, ``environment``,
            ``config_fingerprint``, ``error`` ({type, message, traceback, side} or None),
            ``steps``, ``durations_s`` (reference, candidate, compare, isolate) and
            ``start_time_ms`` (ms since the epoch).
        settings: the settings as logged (MLflow params), including the chosen ``mode``.
        dump_dir: local folder of dumped tensors (``.npy`` + index), None when nothing dumped or
            when loaded from the store (the tensors stay in the store under ``tensors/``).
        tracking_run_id: the MLflow run id once logged or loaded, else None.
    """

    run_id: str
    modules: pa.Table
    ops: pa.Table
    summary: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    dump_dir: Path | None = None
    tracking_run_id: str | None = None

    @property
    def first_divergence(self) -> dict[str, Any] | None:
        """The first non-passing tag in execution order (step, then exec_order), or None."""
        return self.summary.get("first_divergence")

    @property
    def error(self) -> dict[str, Any] | None:
        """``{type, message, traceback, side}`` when a forward raised, else None."""
        return self.summary.get("error")

    @property
    def environment(self) -> dict[str, Any]:
        """The recorded environment (``env.ENV_KEYS``)."""
        return self.summary.get("environment", {})

    @property
    def status(self) -> str:
        """``completed``, ``failed`` (a forward raised) or ``killed`` (KeyboardInterrupt)."""
        return self.summary["status"]

    @property
    def mode(self) -> str:
        """The comparison mode used: ``equal`` or ``allclose``."""
        return self.summary["mode"]

    @property
    def passed(self) -> bool:
        """Parity holds for the mode: the run completed and no compared tag or op failed."""
        return bool(self.summary.get("passed"))

    @property
    def fingerprint(self) -> str:
        """``config_fingerprint(self.settings)``."""
        return self.summary["config_fingerprint"]

    def to_pandas(self) -> tuple[Any, Any]:
        """``(modules_df, ops_df)`` as pandas DataFrames (nullable dtypes kept as arrow types)."""
        import pandas as pd

        kw = {"types_mapper": pd.ArrowDtype}
        return self.modules.to_pandas(**kw), self.ops.to_pandas(**kw)


# ---------------------------------------------------------------------------------------------
# summary


def _finite(x: Any) -> float | None:
    """``float(x)`` when finite, else None (summary.json must stay strict JSON)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _json_clean(obj: Any) -> Any:
    """Round-trip through strict JSON so a stored and a loaded summary compare equal."""
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


def _failing_mask(table: pa.Table, weights: bool | None = None) -> pa.ChunkedArray:
    """Mask of rows whose status fails (anything but equal, close, skipped).

    ``weights`` True keeps only param/buffer rows, False only the others, None all.
    """
    bad = pc.invert(pc.is_in(table.column("status"), pa.array(sorted(PASSING | NEUTRAL))))
    if weights is not None:
        is_weight = pc.fill_null(pc.is_in(table.column("kind"), pa.array(WEIGHT_KINDS)), False)
        bad = pc.and_(bad, is_weight if weights else pc.invert(is_weight))
    return bad


def _not_cache_hit(table: pa.Table) -> pa.ChunkedArray:
    """True for rows not marked ``cache_hit`` (null counts as not a hit)."""
    return pc.invert(pc.fill_null(table.column("cache_hit"), False))


def first_divergence(table: pa.Table) -> dict[str, Any] | None:
    """The first failing row (by step, then exec_order, then table order), weights left out.

    Rows marked ``cache_hit`` are left out too: their error belongs to the cache that skipped
    the module, not to the module (issue 7; counted in ``summary["cache_hits_failing"]``).
    ``skipped`` rows are not divergences; parameters and buffers are reported apart
    (``summary["weights_failing"]``) so a weight-loading error is never blamed on a module
    (the TensorChecker's rule). Returns the keys tag, module, kind, step, exec_order, status,
    max_abs_diff, message; None when no such row fails.
    """
    if not table.num_rows:
        return None
    bad = pc.and_(_failing_mask(table, weights=False), _not_cache_hit(table))
    failing = table.append_column("_row", pa.array(range(table.num_rows), pa.int64())).filter(bad)
    if not failing.num_rows:
        return None
    failing = failing.sort_by(
        [("step", "ascending"), ("exec_order", "ascending"), ("_row", "ascending")]
    )
    row = failing.slice(0, 1).to_pylist()[0]
    keys = ("tag", "module", "kind", "step", "exec_order", "status", "max_abs_diff", "message")
    return {k: row[k] for k in keys}


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
    rows = [
        r
        for r in table.select(["module", "kind", "status", "max_abs_diff", "sqnr_db"]).to_pylist()
        if r["module"] == root and r["kind"] == "output"
    ]
    if not rows:
        return {"output_max_abs_diff": None, "output_sqnr_db": None, "output_equal": None}
    diffs = [r["max_abs_diff"] for r in rows if r["max_abs_diff"] is not None]
    sqnrs = [r["sqnr_db"] for r in rows if r["sqnr_db"] is not None]
    return {
        "output_max_abs_diff": _finite(max(diffs)) if diffs else None,
        "output_sqnr_db": _finite(min(sqnrs)) if sqnrs else None,
        "output_equal": all(r["status"] == "equal" for r in rows),
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
) -> dict[str, Any]:
    """The run summary (see ``RunResult.summary``), JSON-clean.

    ``passed`` is True only when the run completed, at least one tensor was compared, and no
    modules or ops row has a failing status (anything but equal, close, skipped). In ``equal``
    mode the comparison core never returns ``close``, so passing there means bitwise equal.
    """
    counts, ops_counts = status_counts(modules), status_counts(ops)
    passing = counts["equal"] + counts["close"]
    skipped = counts["skipped"]
    failing = modules.num_rows - passing - skipped
    ops_failing = ops.num_rows - ops_counts["equal"] - ops_counts["close"] - ops_counts["skipped"]
    steps = sorted({s for s in modules.column("step").to_pylist() if s is not None})
    summary = {
        "run_id": run_id,
        "status": status,
        "passed": status == "completed" and failing == 0 and ops_failing == 0 and passing > 0,
        "counts": counts,
        "ops_counts": ops_counts,
        "tensors_compared": modules.num_rows,
        "tensors_passing": passing,
        "tensors_failing": failing,
        "tensors_skipped": skipped,
        "ops_compared": ops.num_rows,
        "ops_failing": ops_failing,
        "weights_failing": _failing_mask(modules, weights=True).to_pylist().count(True)
        if modules.num_rows
        else 0,
        "first_divergence": first_divergence(modules),
        "first_divergent_op": first_divergence(ops),
        "root_causes": list(root_causes or []),
        "cache_hits_failing": pc.sum(
            pc.and_(_failing_mask(modules, weights=False), pc.invert(_not_cache_hit(modules)))
        ).as_py()
        or 0
        if modules.num_rows
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
    }
    return _json_clean(summary)
