"""Sharded candidates on ``torch.distributed``: tensor-parallel runs across ranks, one reference.

- :class:`ShardedCandidate` / :func:`launch`: the product spawns the ranks (``parity-tracker
  run`` does this for a case whose candidate is a ``ShardedCandidate``).
- :func:`run_sharded`: the same from a user's own launcher (``torchrun``).
- ``placements``: how per-rank tensors unshard (DTensor's own, declared by glob, or inferred).
- ``record`` / ``merge`` / ``unshard``: per-rank capture, rank 0's merge, the unsharding and
  per-rank blame.

See docs/distributed.md ("Checking a sharded model").
"""

from __future__ import annotations

from parity_tracker.distributed.launch import (
    RankCase,
    ShardedCandidate,
    free_port,
    launch,
    run_sharded,
)
from parity_tracker.distributed.placements import AmbiguousPlacement, Placement, infer, parse

__all__ = [
    "AmbiguousPlacement",
    "Placement",
    "RankCase",
    "ShardedCandidate",
    "free_port",
    "infer",
    "launch",
    "parse",
    "run_sharded",
]
