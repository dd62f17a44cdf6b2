"""Tracking: parity runs as MLflow runs. The ONLY package of parity_tracker that imports mlflow.

Submodules: ``store`` (tracking URI, client, experiments, locking), ``log``
(log, spool, sync), ``stage`` (what a run logs, its staging folder), ``parents`` (parent runs,
files attached later), ``query`` (reading runs back; ``RunStore`` holds every read), ``load``
(``load_run``), ``search`` (``find_runs``, ``find_run_heads``), ``records`` (``RunInfo``,
``RunHead``, ``StoredTables``), ``tag_status`` (a tag's status in stored runs, behind
``RunStore.tag_statuses``). The names below keep the old
``parity_tracker.track`` module's public API importable.
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use, so that the read-only commands (history, diff) import neither torch
# (through ``track.log`` -> ``run.result``) nor mlflow until they need them.
_LAZY = {
    **dict.fromkeys(
        ("CONTRACT_METRICS", "DERIVED_PARAMS", "EXTRA_METRICS", "SpooledError", "log_run",
         "run_metrics", "run_params", "run_tags", "spool_root", "stage_run", "sync_spool"),
        "log",
    ),
    **dict.fromkeys(
        ("end_run", "log_artifact_files", "record_diff", "set_description",
         "start_parent_run"),
        "parents",
    ),
    **dict.fromkeys(
        ("RunHead", "RunInfo", "RunStore", "find_run_heads", "find_runs", "load_run"), "query"
    ),
    "STALE_RUN_TIMEOUT_S": "owner",
    "reap_stale_runs": "owner",
    "TAG_COMPLETE": "store",
    "TAG_RUN_ID": "store",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"parity_tracker.track.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'parity_tracker.track' has no attribute {name!r}")


__all__ = [
    "CONTRACT_METRICS",
    "DERIVED_PARAMS",
    "EXTRA_METRICS",
    "STALE_RUN_TIMEOUT_S",
    "TAG_COMPLETE",
    "TAG_RUN_ID",
    "RunHead",
    "RunInfo",
    "RunStore",
    "SpooledError",
    "end_run",
    "find_run_heads",
    "find_runs",
    "load_run",
    "log_artifact_files",
    "log_run",
    "reap_stale_runs",
    "record_diff",
    "run_metrics",
    "run_params",
    "run_tags",
    "set_description",
    "spool_root",
    "stage_run",
    "start_parent_run",
    "sync_spool",
]
