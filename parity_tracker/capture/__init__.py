"""Capture: what the two models compute, as tagged records (never compared here).

- :mod:`~parity_tracker.capture.tags`: the tag grammar and the root name;
- :mod:`~parity_tracker.capture.leaves`: flattening inputs/outputs into tagged leaves;
- :mod:`~parity_tracker.capture.snapshot`: snapshots that later in-place operations cannot
  rewrite (:class:`Snapshotter`);
- :mod:`~parity_tracker.capture.store`: the one bounded, spilling tensor store.

``parity_tracker.capture`` keeps every name it had as a flat module.
"""

from parity_tracker.capture.leaves import (
    NonTensor,
    flatten,
    input_leaves,
    is_tensor_like,
    output_leaves,
    own_tensors,
)
from parity_tracker.capture.snapshot import SnapshotStore, Snapshotter, tensor_version
from parity_tracker.capture.tags import (
    ROOT_FALLBACK,
    ROOT_NAME,
    TAG_PREFIX,
    call_base,
    module_display_name,
    param_tag,
    root_name,
)
from parity_tracker.compare.convert import as_tensor

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
