"""Capture: what the two models compute, as tagged records (never compared here).

- :mod:`~parity_tracker.capture.tags`: the tag grammar and the root name;
- :mod:`~parity_tracker.capture.leaves`: flattening inputs/outputs into tagged leaves;
- :mod:`~parity_tracker.capture.snapshot`: snapshots that later in-place operations cannot
  rewrite (:class:`Snapshotter`);
- :mod:`~parity_tracker.capture.store`: the one bounded, spilling tensor store.

``parity_tracker.capture`` keeps every name it had as a flat module.
"""

from typing import Any

from parity_tracker.capture.tags import (
    ROOT_FALLBACK,
    ROOT_NAME,
    TAG_PREFIX,
    call_base,
    module_display_name,
    param_tag,
    root_name,
)

#: Names re-exported lazily (PEP 562): the tag grammar above is torch-free, so reading stored
#: runs (``parity_tracker.capture.tags``) never imports torch through this package.
_LAZY = {
    "NonTensor": "parity_tracker.capture.leaves",
    "flatten": "parity_tracker.capture.leaves",
    "input_leaves": "parity_tracker.capture.leaves",
    "is_tensor_like": "parity_tracker.capture.leaves",
    "output_leaves": "parity_tracker.capture.leaves",
    "own_tensors": "parity_tracker.capture.leaves",
    "SnapshotStore": "parity_tracker.capture.snapshot",
    "Snapshotter": "parity_tracker.capture.snapshot",
    "tensor_version": "parity_tracker.capture.snapshot",
    "as_tensor": "parity_tracker.compare.convert",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ROOT_FALLBACK",
    "ROOT_NAME",
    "TAG_PREFIX",
    "NonTensor",
    "SnapshotStore",
    "Snapshotter",
    "as_tensor",
    "call_base",
    "flatten",
    "input_leaves",
    "is_tensor_like",
    "module_display_name",
    "output_leaves",
    "own_tensors",
    "param_tag",
    "root_name",
    "tensor_version",
]
