"""Make one tag's full tensor from its per-rank tensors, and name the ranks whose part differs.

Unsharding (the inverse of ``torch.distributed.tensor``'s placements on a one-dimensional
mesh): ``shard(d)`` concatenates the ranks' blocks along ``d`` in mesh order (rank order for
plain tensors); ``replicate`` takes the first rank's copy (every copy is still compared, see
:func:`blame`); ``partial`` reduces the terms (sum, mean, max or min, elementwise, in rank
order). One tag at a time: the caller drops the result once it is compared.

Per-rank blame compares each rank's own part with the matching part of the reference, in the
run's mode and tolerances (``parity_tracker.compare.compare_tensors``): a ``shard(d)`` block
with the reference's block (``torch.split`` by the ranks' sizes), a ``replicate`` copy with the
whole reference. A ``partial`` term has no reference part of its own, so no rank can be named
(None).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from parity_tracker.compare.core import compare_tensors
from parity_tracker.distributed.placements import Placement
from parity_tracker.statuses import is_passing


def unshard(parts: Sequence[torch.Tensor], placement: Placement) -> torch.Tensor:
    """The full tensor from the ranks' parts (in mesh/rank order) under ``placement``.

    Args:
        parts: one tensor per rank, in order; shapes as the placement requires.
        placement: a checked placement (``shard`` dim non-negative).

    Returns:
        A new tensor (the parts are not modified). ``partial(avg)`` is computed in float64
        for floating inputs and cast back, so the mean does not depend on summation order
        more than the reference's own reduction does.

    Raises:
        RuntimeError: shapes that do not concatenate or broadcast (torch's own message).
    """
    if placement.kind == "shard":
        return torch.cat(list(parts), dim=placement.dim)
    if placement.kind == "replicate":
        return parts[0].clone()
    stacked = torch.stack(list(parts))
    if placement.reduce == "max":
        return stacked.amax(0)
    if placement.reduce == "min":
        return stacked.amin(0)
    if placement.reduce == "avg":
        wide = stacked.double() if stacked.is_floating_point() else stacked
        return wide.mean(0).to(stacked.dtype)
    return stacked.sum(0)


def reference_parts(
    reference: torch.Tensor, parts: Sequence[torch.Tensor], placement: Placement
) -> list[torch.Tensor] | None:
    """The reference's part matching each rank's part, or None for ``partial``."""
    if placement.kind == "replicate":
        return [reference] * len(parts)
    if placement.kind == "shard":
        sizes = [p.shape[placement.dim] for p in parts]
        if sum(sizes) != reference.shape[placement.dim]:
            return None
        return list(torch.split(reference, sizes, dim=placement.dim))
    return None


def blame(
    reference: torch.Tensor | None,
    parts: Sequence[torch.Tensor],
    placement: Placement,
    *,
    mode: str,
    tag: str,
    tolerances: Any = None,
) -> list[int] | None:
    """The ranks (0-based, sorted) whose part differs from the reference's part.

    Args:
        reference: the reference's full tensor (None when the reference has none).
        parts: each rank's part, in rank order.
        placement: how the parts make the full tensor.
        mode: ``equal`` or ``allclose`` (the run's mode).
        tag: the tag, for per-tag tolerance overrides.
        tolerances: a ``parity_tracker.compare.tolerances.Tolerances`` or None.

    Returns:
        The failing ranks (possibly empty), or None when no rank can be named (``partial``, no
        reference, or parts that do not split the reference's shape).
    """
    if reference is None:
        return None
    ref_parts = reference_parts(reference, parts, placement)
    if ref_parts is None:
        return None
    bad = []
    for r, (ref, part) in enumerate(zip(ref_parts, parts, strict=True)):
        comp = compare_tensors(ref, part, mode=mode, tag=tag, tolerances=tolerances)
        if not is_passing(comp.status):
            bad.append(r)
    return bad
