"""Tracking: parity runs as MLflow runs. The ONLY package of parity_tracker that imports mlflow.

Submodules: ``store`` (tracking URI, client, experiments, locking, tag-status index), ``log``
(stage, log, spool, sync), ``parents`` (parent runs, files attached later), ``query``
(reading runs back; ``RunStore`` holds every read), ``tag_status`` (a tag's status in stored
runs, behind ``RunStore.tag_statuses``). The names below keep the old
``parity_tracker.track`` module's public API importable.
"""

from __future__ import annotations

from parity_tracker.track.log import (
    CONTRACT_METRICS,
    DERIVED_PARAMS,
    EXTRA_METRICS,
    SpooledError,
    log_run,
    run_metrics,
    run_params,
    run_tags,
    spool_root,
    stage_run,
    sync_spool,
)
from parity_tracker.track.owner import STALE_RUN_TIMEOUT_S, reap_stale_runs
from parity_tracker.track.parents import (
    end_run,
    log_artifact_files,
    record_diff,
    set_description,
    start_parent_run,
)
from parity_tracker.track.query import (
    RunHead,
    RunInfo,
    RunStore,
    find_run_heads,
    find_runs,
    load_run,
)
from parity_tracker.track.store import TAG_COMPLETE, TAG_RUN_ID

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
