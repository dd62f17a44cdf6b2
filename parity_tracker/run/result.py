"""``RunResult``: one parity run's tables and its record (``RunSummary``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from parity_tracker.run.summary import RunSummary


@dataclass(eq=False, init=False)
class RunResult:
    """The record of one parity run, ready to be written to disk or MLflow.

    Attributes:
        run_id: the parity run id (32 hex digits), also in every table row's ``run_id`` and the
            MLflow tag ``parity.run_id``. Not the MLflow run id (see ``tracking_run_id``).
        modules: one row per compared tag and step (``tables.MODULES_SCHEMA``).
        ops: one row per compared op output (``tables.OPS_SCHEMA``); empty unless ops captured.
        record: the typed, frozen, versioned run record (``RunSummary``).
        settings: the settings as logged (MLflow params), including the chosen ``mode``.
        dump_dir: local folder of dumped tensors (``.npy`` + index), None when nothing dumped or
            when loaded from the store (the tensors stay in the store under ``tensors/``).
        tracking_run_id: the MLflow run id once logged or loaded, else None.

    ``summary`` (the old untyped dict, same keys as ``summary.json``) is a fresh dict made from
    ``record`` at each access: editing it changes nothing; make a new record with
    ``record.replace(...)`` and ``result.with_record(...)`` instead.
    """

    run_id: str
    modules: pa.Table
    ops: pa.Table
    record: RunSummary
    settings: dict[str, Any] = field(default_factory=dict)
    dump_dir: Path | None = None
    tracking_run_id: str | None = None

    def __init__(
        self,
        run_id: str,
        modules: pa.Table,
        ops: pa.Table,
        summary: RunSummary | Mapping[str, Any],
        settings: Mapping[str, Any] | None = None,
        dump_dir: Path | None = None,
        tracking_run_id: str | None = None,
    ) -> None:
        self.run_id, self.modules, self.ops = run_id, modules, ops
        self.record = summary if isinstance(summary, RunSummary) else RunSummary.from_dict(summary)
        self.settings = dict(settings or {})
        self.dump_dir, self.tracking_run_id = dump_dir, tracking_run_id

    def with_record(self, record: RunSummary) -> RunResult:
        """A new result with ``record`` (the tables are shared, not copied)."""
        return RunResult(
            self.run_id, self.modules, self.ops, record, self.settings, self.dump_dir,
            self.tracking_run_id,
        )  # fmt: skip

    @property
    def summary(self) -> dict[str, Any]:
        """``record.to_dict()``: the ``summary.json`` dict (a fresh copy each time)."""
        return self.record.to_dict()

    @property
    def first_divergence(self) -> dict[str, Any] | None:
        """The first non-passing tag in execution order (step, then exec_order), or None."""
        fd = self.record.first_divergence
        return None if fd is None else fd.to_dict()

    @property
    def error(self) -> dict[str, Any] | None:
        """``{type, message, traceback, side}`` when a forward raised, else None."""
        return None if self.record.error is None else self.record.error.to_dict()

    @property
    def environment(self) -> dict[str, Any]:
        """The recorded environment (``run.environment.ENV_KEYS``)."""
        return dict(self.record.environment)

    @property
    def status(self) -> str:
        """``completed``, ``failed`` (a forward raised) or ``killed`` (KeyboardInterrupt)."""
        return self.record.status

    @property
    def mode(self) -> str:
        """The comparison mode used: ``equal`` or ``allclose``."""
        return self.record.mode

    @property
    def passed(self) -> bool:
        """Parity holds for the mode: the run completed and no compared tag or op failed."""
        return self.record.passed

    @property
    def fingerprint(self) -> str:
        """``config_fingerprint(self.settings)``."""
        return self.record.config_fingerprint

    def to_pandas(self) -> tuple[Any, Any]:
        """``(modules_df, ops_df)`` as pandas DataFrames (nullable dtypes kept as arrow types)."""
        import pandas as pd

        kw = {"types_mapper": pd.ArrowDtype}
        return self.modules.to_pandas(**kw), self.ops.to_pandas(**kw)
