"""parity_tracker: prove a second implementation of a PyTorch model computes what PyTorch does.

It finds the first divergent module and operator, and keeps the history in MLflow.

Public names are imported lazily so that ``import parity_tracker`` stays cheap (no mlflow import
until a run is logged).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Comparison": "parity_tracker.compare",
    "compare_tensors": "parity_tracker.compare",
    "ParityCase": "parity_tracker.pipeline.case",
    "TensorChecker": "parity_tracker.tensor_checker",
    "DumpMode": "parity_tracker.tensor_checker",
    "tensor_checker": "parity_tracker.tensor_checker",
    "module_register_tensor_checker": "parity_tracker.tensor_checker",
    "run_parity": "parity_tracker.run",
    "RunResult": "parity_tracker.run",
    "RunSummary": "parity_tracker.run",
    "RunStore": "parity_tracker.track",
    "diff_runs": "parity_tracker.analysis.diff",
    "log_run": "parity_tracker.track",
    "load_run": "parity_tracker.track",
    "find_runs": "parity_tracker.track",
    "sync_spool": "parity_tracker.track",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'parity_tracker' has no attribute {name!r}")
