"""A small tensor-parallel example: a two-block MLP model, sharded three ways.

- :func:`build_dtensor`: ``parallelize_module`` with ``ColwiseParallel`` (``up``) and
  ``RowwiseParallel`` (``down``) on a one-dimensional ``DeviceMesh``: DTensor weights.
- :func:`build_megatron`: the same arithmetic with plain per-rank tensors (Megatron-style):
  rank ``r`` holds rows ``r`` of ``up`` and columns ``r`` of ``down``, the row-parallel partial
  sums all-reduced by hand. Nothing is a DTensor: placements are inferred or declared.
- ``nudge_rank``: rank ``nudge_rank``'s shard of ``blocks.0.up.weight`` gets ``+nudge``
  (a bug on one rank only).

Run ``python -m parity_tracker.examples.tp_mlp`` for a tp2 check (gloo, 2 processes).
The builders are module-level functions, so ``functools.partial`` of them pickles into the
spawned ranks.
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import nn

HIDDEN, INNER, SEED = 16, 32, 0


class Block(nn.Module):
    """``x + down(gelu(up(norm(x))))``."""

    def __init__(self, hidden: int = HIDDEN, inner: int = INNER) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, inner)
        self.down = nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., hidden)`` to ``(..., hidden)``."""
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TinyMLP(nn.Module):
    """Two :class:`Block` s and a head; input ``(batch, seq, HIDDEN)`` float32."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(HIDDEN, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, seq, HIDDEN)`` to ``(batch, seq, 8)``."""
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_reference(seed: int = SEED) -> TinyMLP:
    """The reference, seeded so that every process builds the same weights."""
    torch.manual_seed(seed)
    return TinyMLP().eval()


def make_inputs(seed: int = 1) -> tuple[torch.Tensor]:
    """``(x,)`` with x ``(2, 4, HIDDEN)`` float32, seeded (even sequence shards up to 4 ranks)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 4, HIDDEN, generator=g),)


def _nudge(model: nn.Module, rank: int, nudge_rank: int | None, nudge: float) -> None:
    if nudge_rank is not None and rank == nudge_rank:
        w = model.blocks[0].up.weight
        local = w.to_local() if hasattr(w, "to_local") else w
        with torch.no_grad():
            local[0, 0] += nudge


def _raise(*_: object) -> None:
    raise RuntimeError("injected failure in blocks.1")


def build_dtensor(
    rank: int,
    world_size: int,
    nudge_rank: int | None = None,
    nudge: float = 1e-3,
    fail_rank: int | None = None,
) -> nn.Module:
    """This rank's candidate: the reference parallelised with Colwise/RowwiseParallel.

    ``fail_rank``: that rank's ``blocks.1`` raises ``RuntimeError`` when called.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = make_reference()
    mesh = init_device_mesh("cpu", (world_size,))
    plan = {}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.up"] = ColwiseParallel()
        plan[f"blocks.{i}.down"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)
    _nudge(model, rank, nudge_rank, nudge)
    if rank == fail_rank:
        model.blocks[1].register_forward_pre_hook(_raise)
    return model


def build_sequence_parallel(rank: int, world_size: int) -> object:
    """This rank's sequence-parallel candidate and its slice of the sequence.

    ``norm``: ``SequenceParallel`` (activations sharded on the sequence dim 1); ``up``:
    ``ColwiseParallel(input_layouts=Shard(1))`` (all-gathers the sequence); ``down``:
    ``RowwiseParallel(output_layouts=Shard(1))`` (reduce-scatters back to sequence shards).
    Rank ``r`` gets ``torch.chunk(x, world_size, dim=1)[r]`` of :func:`make_inputs`' ``x``.

    Returns:
        A ``parity_tracker.distributed.RankCase``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from parity_tracker.distributed import RankCase

    model = make_reference()
    mesh = init_device_mesh("cpu", (world_size,))
    plan: dict[str, object] = {}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.norm"] = SequenceParallel()
        plan[f"blocks.{i}.up"] = ColwiseParallel(input_layouts=Shard(1))
        plan[f"blocks.{i}.down"] = RowwiseParallel(output_layouts=Shard(1))
    parallelize_module(model, mesh, plan)
    (x,) = make_inputs()
    return RankCase(model, inputs=(torch.chunk(x, world_size, dim=1)[rank],))


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sums the row-parallel partial outputs across ranks (Megatron's ``g`` operator)."""
    import torch.distributed as dist

    dist.all_reduce(x)
    return x


class MegatronBlock(nn.Module):
    """A :class:`Block` holding plain per-rank shards: ``up`` column-, ``down`` row-parallel.

    Requires ``world_size`` to divide ``up.out_features``.
    """

    def __init__(self, full: Block, rank: int, world_size: int) -> None:
        super().__init__()
        self.norm = copy.deepcopy(full.norm)
        cols = full.up.out_features // world_size
        sl = slice(rank * cols, (rank + 1) * cols)
        self.up = nn.Linear(full.up.in_features, cols)
        self.down = nn.Linear(cols, full.down.out_features)
        with torch.no_grad():
            self.up.weight.copy_(full.up.weight[sl])
            self.up.bias.copy_(full.up.bias[sl])
            self.down.weight.copy_(full.down.weight[:, sl])
            # the bias is a partial term too: rank 0 adds it, the others add zeros
            self.down.bias.copy_(full.down.bias if rank == 0 else torch.zeros_like(full.down.bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """As :class:`Block`, with this rank's shards and one all-reduce."""
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return x + _all_reduce(h)


def build_megatron(rank: int, world_size: int, nudge_rank: int | None = None) -> nn.Module:
    """This rank's Megatron-style candidate (plain tensors).

    ``down``'s output and bias are partial terms (declare them ``partial``); the rest is
    inferred: ``up`` column-parallel (weight ``shard(0)``, output ``shard(-1)``), ``down``
    row-parallel (weight ``shard(1)``, input ``shard(-1)``).
    """
    ref = make_reference()
    model = make_reference()
    model.blocks = nn.ModuleList([MegatronBlock(b, rank, world_size) for b in ref.blocks])
    _nudge(model, rank, nudge_rank, 1e-3)
    return model


def main() -> int:
    """tp2 on gloo: print the verdict; exit 0 when parity holds."""
    from parity_tracker.distributed import ShardedCandidate, launch

    cand = ShardedCandidate(functools.partial(build_dtensor), world_size=2, timeout_s=60)
    result = launch(make_reference(), cand, make_inputs(), environment={}, dump_mode="not")
    print(result.summary["counts"], result.summary["distributed"]["placements"])
    return 0 if result.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
