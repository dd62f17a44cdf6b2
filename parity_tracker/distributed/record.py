"""Per-rank capture: hook a model, keep each tag's tensor as this rank holds it, write one file.

Tags are those of the TensorChecker's hooks (``parity_tracker.capture``'s grammar: outputs,
positional and keyword inputs, each module's own parameters and buffers at step 0, ``@k`` for a
repeated call), so the merged candidate pairs with the hooked reference tag by tag.

A ``DTensor`` on a one-dimensional mesh is kept as its local shard plus its placement (no
collective during the forward, so one rank's memory holds only its shards); on a mesh of more
dims it is made whole with ``full_tensor()`` in the hook (every rank runs the same hooks in the
same order, so the collective matches) and recorded as ``replicate``. A plain tensor is kept as
it is; its placement is declared or inferred at merge time (``placements.py``).

Each rank writes ``rank{r}.pt`` (``torch.save`` of ``{key: tensor}``, read back memory-mapped,
one tag at a time) and then ``rank{r}.json`` (the index: per tag its key, step, kind, module,
shape, dtype, DTensor placement; the rank's error, if its forward raised). The JSON is written
last and atomically: its presence means the rank finished.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from parity_tracker.capture import (
    call_base,
    input_leaves,
    module_display_name,
    output_leaves,
    own_tensors,
    param_tag,
    root_name,
)


def _overrides_forward(mod: torch.nn.Module) -> bool:
    """True when ``mod``'s class defines its own ``forward``: False for pure containers.

    Deliberately not :func:`parity_tracker.capture.modules._has_forward`: that one also hooks
    TorchScript submodules and skips packed quantized parameter holders, which this recorder
    (sharded eager models, Python forward hooks on every rank) has never done.
    """
    return type(mod).forward is not torch.nn.Module.forward


def _dtensor_entry(t: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """``(local tensor, placement record)`` of a DTensor (see the module docstring)."""
    mesh = t.device_mesh
    if mesh.ndim != 1:
        return t.full_tensor(), {"placement": "replicate", "mesh": None, "dtensor": True}
    p = t.placements[0]
    if p.is_shard():
        spec = f"shard({p.dim})"
    elif p.is_partial():
        spec = f"partial({getattr(p, 'reduce_op', 'sum')})"
    else:
        spec = "replicate"
    ranks = [int(r) for r in mesh.mesh.flatten().tolist()]
    return t.to_local(), {"placement": spec, "mesh": ranks, "dtensor": True}


class ShardRecorder:
    """Records every tagged tensor of one model's forwards on this rank.

    Attributes:
        step: the current step (set it before each step, as ``StepRecorder`` does).
        entries: ``{(tag, step): {"tensor", "kind", "module", "placement", "mesh"}}`` in
            capture order.
    """

    def __init__(self) -> None:
        self.step = 0
        self.entries: dict[tuple[str, int], dict[str, Any]] = {}
        self._calls: dict[tuple[int, str], int] = {}
        self._frames: dict[int, list[int]] = {}
        self._weights: set[str] = set()
        #: (tag, step) of the non-tensor leaves seen (``capture.leaves.NonTensor``): not recorded,
        #: so the merge marks them not observable on the sharded side (never a missing tag).
        self.not_tensors: set[tuple[str, int]] = set()

    # the StepRecorder interface a drive(model, rec) uses on a rank
    def __call__(self, step: int) -> ShardRecorder:
        """Set the current step (``rec(k)`` / ``with rec(k):`` in a drive)."""
        self.step = int(step)
        return self

    def __enter__(self) -> ShardRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def register(self, tag: str, tensor: Any) -> None:
        """``rec.register(tag, tensor)``: keep a manual tensor at the current step."""
        self.keep(tag, tensor, "manual", None, self.step)

    def mark_cache_hit(self, module: str) -> None:
        """Cache hits are not tracked across ranks: a skipped module's tags are missing."""

    def keep(self, tag: str, value: Any, kind: str, module: str | None, step: int) -> None:
        """Keep a detached, contiguous copy of ``value`` (tensors only; other leaves skipped)."""
        if not isinstance(value, torch.Tensor):
            self.not_tensors.add((tag, step))
            return
        if (tag, step) in self.entries:
            return
        meta: dict[str, Any] = {"placement": None, "mesh": None, "dtensor": False}
        if type(value).__name__ == "DTensor":
            value, meta = _dtensor_entry(value.detach())
        copy = value.detach().contiguous().clone()
        self.entries[(tag, step)] = {"tensor": copy, "kind": kind, "module": module, **meta}

    def _weights_of(self, mod: torch.nn.Module, own: list[tuple[str, str, str, str]]) -> None:
        for qname, owner, local, kind in own:
            store = mod._parameters if kind == "param" else mod._buffers
            value = store[local] if local in store else None  # noqa: SIM401
            if value is None or qname in self._weights:
                continue
            self._weights.add(qname)
            self.keep(param_tag(qname), value, kind, owner, 0)

    @contextmanager
    def hooked(self, model: torch.nn.Module) -> Iterator[ShardRecorder]:
        """Hook every module of ``model`` for the block (the TensorChecker's tags)."""
        root = root_name(model)
        own = own_tensors(model, root)
        handles = []
        for raw, mod in model.named_modules():
            if mod is not model and not _overrides_forward(mod):
                continue
            name = module_display_name(raw, root)
            entries = own.get(id(mod), [])
            handles.append(
                mod.register_forward_pre_hook(self._pre(name, entries), with_kwargs=True)
            )
            handles.append(mod.register_forward_hook(self._post(name), with_kwargs=True))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            for mod in {id(m): m for m in model.modules()}.values():
                self._weights_of(mod, own.get(id(mod), []))  # weights of uncalled modules

    def _pre(self, name: str, own: list) -> Callable[..., None]:
        def pre(mod: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            k = self._calls.get((self.step, name), 0)
            self._calls[(self.step, name)] = k + 1
            for tag, _slot, leaf in input_leaves(call_base(name, k), args, kwargs):
                self.keep(tag, leaf, "input", name, self.step)
            self._weights_of(mod, own)
            self._frames.setdefault(id(mod), []).append(k)

        return pre

    def _post(self, name: str) -> Callable[..., None]:
        def post(mod: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            frames = self._frames.get(id(mod))
            if not frames:
                return
            k = frames.pop()
            for tag, _slot, leaf in output_leaves(call_base(name, k), output):
                self.keep(tag, leaf, "output", name, self.step)

        return post

    def pop(self, tag: str, step: int) -> torch.Tensor | None:
        """The kept tensor of ``(tag, step)``, forgotten here (memory freed once used)."""
        entry = self.entries.pop((tag, step), None)
        return None if entry is None else entry["tensor"]


def error_record(exc: BaseException, rank: int) -> dict[str, Any]:
    """The error record of a rank's exception: type, message, traceback, side and rank."""
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "side": "candidate",
        "rank": rank,
        "time": time.time(),
    }


def _atomic_json(path: Path, obj: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, allow_nan=False)
    os.replace(tmp, path)


def write_rank(
    out_dir: str | os.PathLike[str], rank: int, recorder: ShardRecorder, error: Mapping | None
) -> Path:
    """Write ``rank{r}.pt`` then ``rank{r}.json`` (module docstring); returns the JSON path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors, index = {}, []
    for i, ((tag, step), e) in enumerate(recorder.entries.items()):
        key = f"t{i}"
        tensors[key] = e["tensor"].cpu()
        index.append({
            "key": key, "tag": tag, "step": step, "kind": e["kind"], "module": e["module"],
            "shape": list(e["tensor"].shape), "dtype": str(e["tensor"].dtype),
            "placement": e["placement"], "mesh": e["mesh"], "dtensor": e["dtensor"],
        })  # fmt: skip
    torch.save(tensors, out / f"rank{rank}.pt")
    path = out / f"rank{rank}.json"
    _atomic_json(path, {"rank": rank, "entries": index, "error": dict(error) if error else None})
    return path


class RankFiles:
    """One rank's written capture, its tensors read memory-mapped one at a time.

    Attributes:
        rank: the rank.
        index: ``{(tag, step): entry}`` from ``rank{r}.json`` (empty when the rank wrote none).
        error: the rank's error record, or ``{"type": "NoResult", ...}`` when it wrote nothing.
    """

    def __init__(self, out_dir: str | os.PathLike[str], rank: int) -> None:
        self.rank = rank
        path = Path(out_dir) / f"rank{rank}.json"
        self.index: dict[tuple[str, int], dict[str, Any]] = {}
        self._tensors: Mapping[str, torch.Tensor] = {}
        if not path.exists():
            self.error: dict[str, Any] | None = {
                "type": "NoResult", "side": "candidate", "rank": rank, "traceback": "",
                "message": f"rank {rank} wrote no results (it was killed, or hung past the "
                "collective timeout)",
            }  # fmt: skip
            return
        data = json.loads(path.read_text())
        self.error = data.get("error")
        self.index = {(e["tag"], int(e["step"])): e for e in data["entries"]}
        pt = Path(out_dir) / f"rank{rank}.pt"
        self._tensors = torch.load(pt, mmap=True, weights_only=True) if self.index else {}

    def get(self, tag: str, step: int) -> tuple[torch.Tensor, dict[str, Any]] | None:
        """``(tensor, entry)`` of ``(tag, step)`` on this rank, or None when it has none."""
        entry = self.index.get((tag, step))
        if entry is None:
            return None
        return self._tensors[entry["key"]], entry
