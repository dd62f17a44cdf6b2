"""The run stage: ``run_parity`` runs both models, compares, and returns the run record.

Submodules: ``run`` (orchestration), ``summary`` (the run record), ``mode`` (mode choice and
configuration fingerprint), ``environment`` (what a run was made in). The names below keep the
old ``parity_tracker.run`` module's public API importable; they load on first use, so
``parity_tracker.run.environment`` stays cheap to import.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "run_parity": "run",
    "run_case": "run",
    "StepRecorder": "run",
    "default_dump_root": "run",
    "RunResult": "result",
    "RunSummary": "summary",
    "FirstDivergence": "summary",
    "WorstTensor": "summary",
    "RunError": "summary",
    "worst_tensor": "summary",
    "diff_histogram": "histogram",
    "histogram_from_dump": "histogram",
    "read_dump_histogram": "histogram",
    "build_summary": "summary",
    "status_counts": "summary",
    "first_divergence": "summary",
    "output_metrics": "summary",
    "NEUTRAL": "summary",
    "WEIGHT_KINDS": "summary",
    "RUN_STATUSES": "summary",
    "choose_mode": "mode",
    "config_fingerprint": "mode",
    "NOT_FINGERPRINTED": "mode",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"parity_tracker.run.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'parity_tracker.run' has no attribute {name!r}")
