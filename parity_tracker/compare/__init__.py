"""Comparison semantics: one reference tensor against one candidate (design.md).

The package is pure: it imports torch, numpy and xxhash, never capture, tracking or reports.
``parity_tracker.compare`` keeps the names it had as a flat module:
:func:`compare_tensors`, :class:`Comparison`, :func:`missing` and the status vocabulary
(re-exported from :mod:`parity_tracker.statuses`). They are loaded on first use: importing
``parity_tracker.compare.verdict`` alone does not import torch.
"""

from typing import Any

from parity_tracker.statuses import MODES, PASSING, STATUSES, Status

#: Names re-exported lazily (PEP 562), so importing a torch-free submodule (``verdict``,
#: ``tolerances`` aside) does not import torch through this package.
_LAZY = {
    "EQUAL_CHUNK": "core",
    "SMALL": "core",
    "Comparison": "core",
    "compare_tensors": "core",
    "missing": "core",
    "passes": "verdict",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EQUAL_CHUNK",
    "MODES",
    "PASSING",
    "SMALL",
    "STATUSES",
    "Comparison",
    "Status",
    "compare_tensors",
    "missing",
    "passes",
]
