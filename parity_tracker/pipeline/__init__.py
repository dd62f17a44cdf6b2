"""The pipeline stage: targets, one target run, and the nightly matrix over them.

Submodules: ``case`` (``ParityCase``, the target contract), ``targets`` (the registry: entry
points and ``module:function`` specs), ``run_target`` (build, run and log one target),
``config`` (the matrix file), ``matrix`` (cells and shards), ``baseline`` (which stored run a
cell is diffed against), ``results`` (cell and nightly records, the cell verdict), ``pages``
(the data of the nightly's pages) and ``nightly`` (the orchestration). The names below keep the
old ``parity_tracker.pipeline`` module's public API importable; they load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ParityCase": "case",
    "Target": "targets",
    "resolve_target": "targets",
    "list_targets": "targets",
    "TargetBuildError": "run_target",
    "TargetRun": "run_target",
    "build_case": "run_target",
    "run_target": "run_target",
    "run_nightly": "nightly",
    "NightlyResult": "results",
    "CellResult": "results",
    "Cell": "matrix",
    "load_matrix": "config",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"parity_tracker.pipeline.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'parity_tracker.pipeline' has no attribute {name!r}")
