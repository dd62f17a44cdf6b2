"""How a tag's per-rank tensors make up the full tensor: parsed, declared, read or inferred.

A placement follows ``torch.distributed.tensor``'s vocabulary on a one-dimensional mesh of
``world_size`` ranks (``placement_types.py``): ``shard(d)`` (rank ``r`` holds the ``r``-th block
of dim ``d``, blocks sized as ``torch.chunk`` sizes them), ``replicate`` (every rank holds the
whole tensor) and ``partial`` / ``partial(avg|max|min)`` (every rank holds a term of a
reduction; the full tensor is the reduction of all terms).

Where a placement comes from, in order (recorded in ``Placement.source``):

1. ``dtensor``: the captured tensor is a ``DTensor``; its own ``placements`` are used.
2. ``declared``: a glob of the user's ``placements`` mapping matches the tag
   (``{"*.q_proj": "shard(-1)", "*.o_proj": "partial"}``; see :func:`match_declared`).
3. ``inferred``: from shapes alone (:func:`infer`): every rank shape equal to the reference
   shape is ``replicate``; rank shapes that differ from the reference along exactly one dim,
   whose sizes add up to the reference's and follow ``torch.chunk``'s block sizes in rank
   order, are ``shard(d)``. Anything else is refused (:class:`AmbiguousPlacement`) with a
   message asking for a declaration. A partial sum has the reference's shape, so it is never
   inferred: declare it.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from parity_tracker.capture.tags import TAG_PREFIX
from parity_tracker.errors import InputError

#: Reductions of a partial placement (``torch.distributed.tensor.Partial``'s ``reduce_op``).
REDUCE_OPS = ("sum", "avg", "max", "min")
#: Where a placement came from.
SOURCES = ("dtensor", "declared", "inferred")

_SPEC = re.compile(r"^\s*(shard)\s*\(\s*(-?\d+)\s*\)\s*$|^\s*(replicate)\s*$|"
                   r"^\s*(partial)\s*(?:\(\s*(\w+)\s*\))?\s*$", re.IGNORECASE)  # fmt: skip


class AmbiguousPlacement(InputError):
    """Per-rank shapes that do not say how to unshard a tag; the message asks to declare it."""


@dataclass(frozen=True)
class Placement:
    """One tag's placement over a one-dimensional mesh.

    Attributes:
        kind: ``shard``, ``replicate`` or ``partial``.
        dim: the sharded dim (``shard`` only; may be negative as declared).
        reduce: the reduction of a ``partial`` placement (one of :data:`REDUCE_OPS`).
        source: ``dtensor``, ``declared`` or ``inferred`` (:data:`SOURCES`).
    """

    kind: str
    dim: int | None = None
    reduce: str | None = None
    source: str = "declared"

    def __str__(self) -> str:
        if self.kind == "shard":
            return f"shard({self.dim})"
        if self.kind == "partial":
            return "partial" if self.reduce in (None, "sum") else f"partial({self.reduce})"
        return self.kind

    def describe(self) -> str:
        """``"shard(0) (inferred)"``: the placement and where it came from."""
        return f"{self} ({self.source})"


def parse(spec: str | Placement, source: str = "declared") -> Placement:
    """Parse ``"shard(d)"``, ``"replicate"``, ``"partial"`` or ``"partial(avg|max|min)"``.

    Raises:
        InputError: anything else; the message lists the accepted forms.
    """
    if isinstance(spec, Placement):
        return spec
    m = _SPEC.match(str(spec))
    if not m:
        raise InputError(
            f"placement {spec!r} is not one of 'shard(d)' (d an int, may be negative), "
            "'replicate', 'partial' or 'partial(avg|max|min)'"
        )
    if m.group(1):
        return Placement("shard", dim=int(m.group(2)), source=source)
    if m.group(3):
        return Placement("replicate", source=source)
    reduce = (m.group(5) or "sum").lower()
    if reduce not in REDUCE_OPS:
        raise InputError(f"placement {spec!r}: partial reduction must be one of {REDUCE_OPS}")
    return Placement("partial", reduce=reduce, source=source)


def parse_declared(placements: Mapping[str, str] | None) -> dict[str, Placement]:
    """Validate a user's ``{glob: spec}`` mapping; raises ``InputError`` naming a bad entry."""
    out = {}
    for glob, spec in (placements or {}).items():
        try:
            out[str(glob)] = parse(spec)
        except InputError as exc:
            raise InputError(f"placements[{glob!r}]: {exc}") from None
    return out


def _tag_names(tag: str, module: str | None) -> list[str]:
    """The names a declared glob is matched against (see ``match_declared``)."""
    bare = tag.removeprefix(TAG_PREFIX)
    names = [tag, bare]
    if module is not None and bare.split("@", 1)[0] == module:
        names.append(module)
    return names


def match_declared(
    declared: Mapping[str, Placement], tag: str, module: str | None = None
) -> Placement | None:
    """The first declared placement whose glob matches ``tag`` (``fnmatch``), else None.

    A glob is matched against the tag (``checker_layers.0.mlp.up_proj``), the tag without the
    ``checker_`` prefix, and, for a module's output tag, the module name. Inputs and weights
    are matched by their own tags: ``*.o_proj_input_0``, ``*.q_proj.weight``.
    """
    names = _tag_names(tag, module)
    for glob, placement in declared.items():
        if any(fnmatch.fnmatchcase(n, glob) for n in names):
            return placement
    return None


def chunk_sizes(length: int, world_size: int) -> list[int]:
    """Block sizes of ``torch.chunk(length, world_size)`` padded with zeros to ``world_size``.

    DTensor's ``Shard`` splits a dim this way (``placement_types.Shard._split_tensor``): blocks
    of ``ceil(length / world_size)``, the last ones smaller or empty.
    """
    full = math.ceil(length / world_size) if world_size else 0
    sizes = [max(0, min(full, length - r * full)) for r in range(world_size)]
    return sizes


def _ask(tag: str, ref_shape: Sequence[int], rank_shapes: Sequence[Sequence[int]], why: str):
    shapes = ", ".join(f"rank {r}: {list(s)}" for r, s in enumerate(rank_shapes))
    name = tag.removeprefix(TAG_PREFIX)
    return AmbiguousPlacement(
        f"cannot infer how to unshard {tag}: reference shape {list(ref_shape)}, {shapes} ({why})."
        f" Declare it, e.g. placements={{{name!r}: 'shard(<dim>)'}} or 'replicate' or "
        "'partial'"
    )


def infer(tag: str, ref_shape: Sequence[int], rank_shapes: Sequence[Sequence[int]]) -> Placement:
    """Infer the placement of a plain per-rank tensor from its shapes (module docstring, 3).

    Args:
        tag: the tag (for the message).
        ref_shape: the unsharded reference's shape.
        rank_shapes: each rank's tensor shape, in rank order.

    Returns:
        ``replicate`` or ``shard(d)`` with ``source="inferred"`` (``d`` non-negative).

    Raises:
        AmbiguousPlacement: the shapes differ from the reference along no dim consistently,
            along several dims, do not add up, or are not ``torch.chunk``'s blocks in rank
            order (a permuted or uneven split that cannot be told from a bug).
    """
    ref = tuple(int(x) for x in ref_shape)
    shapes = [tuple(int(x) for x in s) for s in rank_shapes]
    if all(s == ref for s in shapes):
        return Placement("replicate", source="inferred")
    if any(len(s) != len(ref) for s in shapes):
        raise _ask(tag, ref, shapes, "the ranks' number of dims differs from the reference's")
    dims = {d for s in shapes for d in range(len(ref)) if s[d] != ref[d]}
    if len(dims) != 1:
        raise _ask(
            tag, ref, shapes, f"rank shapes differ from the reference in dims {sorted(dims)}"
        )
    d = dims.pop()
    sizes = [s[d] for s in shapes]
    if sum(sizes) != ref[d]:
        raise _ask(tag, ref, shapes, f"dim {d}: rank sizes {sizes} do not add up to {ref[d]}")
    if sizes != chunk_sizes(ref[d], len(shapes)):
        raise _ask(
            tag, ref, shapes,
            f"dim {d}: rank sizes {sizes} are not torch.chunk's blocks in rank order "
            f"{chunk_sizes(ref[d], len(shapes))}",
        )  # fmt: skip
    return Placement("shard", dim=d, source="inferred")


def check_declared(
    tag: str, placement: Placement, ref_shape: Sequence[int], rank_shapes: Sequence[Sequence[int]]
) -> Placement:
    """Check a declared or DTensor placement against the shapes; the dim made non-negative.

    Raises:
        AmbiguousPlacement: the rank shapes cannot be unsharded that way into the reference's
            number of dims (a shape difference in the unsharded result is left to the
            comparison, which reports it as ``shape_mismatch``).
    """
    shapes = [tuple(int(x) for x in s) for s in rank_shapes]
    if placement.kind != "shard":
        return placement
    ndim = len(shapes[0]) if shapes else len(ref_shape)
    d = placement.dim if placement.dim >= 0 else placement.dim + ndim
    if not 0 <= d < ndim or any(len(s) != ndim for s in shapes):
        raise _ask(tag, ref_shape, shapes, f"{placement.describe()} does not fit these shapes")
    return Placement("shard", dim=d, source=placement.source)
