"""Write a reproducer's data: tensors as lossless ``.npy`` and ``repro.json`` (issue 20).

The format is read back by :mod:`parity_tracker.files.repro_lib` (standalone, copied into each
reproducer folder). Tensors go through :func:`parity_tracker.files.dump.to_numpy` (the dump's
lossless forms) with their strides and contiguity added; non-tensor values are tagged JSON
(:func:`encode`). No pickles: ``numpy.save(allow_pickle=False)``, JSON and safetensors only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from parity_tracker.capture.ops import TensorArg
from parity_tracker.files.atomic import atomic_write_json
from parity_tracker.files.dump import to_numpy
from parity_tracker.files.repro_lib import FORMAT, INDEX, VERSION, inside

_TORCH_KINDS = (
    (torch.dtype, "dtype"),
    (torch.layout, "layout"),
    (torch.memory_format, "memory_format"),
)


def encode(value: Any, tensor: Any = None) -> Any:
    """Tagged JSON for an argument value (see ``repro_lib.decode``).

    Args:
        value: an op or module argument: tensors (``TensorArg`` or ``torch.Tensor``), None,
            bool, int, float, str, dtype, layout, memory_format, device, list, tuple, dict.
        tensor: ``tensor(t) -> index`` for live tensors (module inputs); None for op specs.

    Returns:
        A strict-JSON value; anything else becomes ``{"unsupported": type, "repr": ...}`` (its
        replay raises, naming it).
    """
    if isinstance(value, TensorArg):
        return {"tensor": value.index}
    if isinstance(value, torch.Tensor) and tensor is not None:
        return {"tensor": tensor(value)}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    for kind, name in _TORCH_KINDS:
        if isinstance(value, kind):
            return {name: str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__ if type(value) in (list, tuple) else "tuple": [
            encode(v, tensor) for v in value
        ]}  # fmt: skip
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: encode(v, tensor) for k, v in value.items()}}
    return {"unsupported": type(value).__qualname__, "repr": repr(value)[:200]}


def unsupported(value: Any) -> list[str]:
    """The ``repr`` of every value :func:`encode` could not save (empty: replayable)."""
    if isinstance(value, dict):
        if "unsupported" in value:
            return [f"{value['unsupported']}: {value['repr']}"]
        return [u for v in value.values() for u in unsupported(v)]
    if isinstance(value, list):
        return [u for v in value for u in unsupported(v)]
    return []


def write_tensor(folder: Path, name: str, t: torch.Tensor) -> dict[str, Any]:
    """Write ``t`` as ``folder/name.npy`` losslessly; its index entry (file, dtypes, strides)."""
    array, info, extra = to_numpy(t)
    entry: dict[str, Any] = {"file": f"{name}.npy", **info}
    if not t.is_quantized and t.layout == torch.strided:
        entry["stride"], entry["contiguous"] = list(t.stride()), t.is_contiguous()
    np.save(inside(folder, entry["file"]), array, allow_pickle=False)
    for suffix, arr in extra.items():
        entry[f"{suffix}_file"] = f"{name}.{suffix}.npy"
        np.save(inside(folder, entry[f"{suffix}_file"]), arr, allow_pickle=False)
    return entry


def write_index(folder: Path, meta: dict[str, Any]) -> Path:
    """Write ``repro.json`` (strict JSON, atomically) with the format header."""
    path = inside(folder, INDEX)
    atomic_write_json(path, {"format": FORMAT, "version": VERSION, **meta}, indent=1)
    return path


def row_facts(row: dict[str, Any]) -> dict[str, Any]:
    """What a reproducer reports of its table row, as strict JSON.

    Tag, module, status, cause, message, mode, rtol, atol, max |Δ| and its index.
    """
    keys = ("tag", "module", "status", "cause", "message", "mode", "rtol", "atol", "max_abs_diff")
    facts = {k: row.get(k) for k in keys}
    idx = row.get("max_abs_diff_index")
    facts["max_abs_diff_index"] = list(idx) if idx is not None else None
    return {
        k: v if not isinstance(v, float) or math.isfinite(v) else repr(v) for k, v in facts.items()
    }


def write_op(folder: Path, kept: Any, run_id: str) -> Path:
    """Write one ``localize.keep.KeptOp`` into ``folder`` (created); returns ``repro.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    ns, _, name = kept.op.rpartition(".")
    inputs = []
    for p, (r, c) in enumerate(zip(kept.ref_inputs, kept.cand_inputs, strict=False)):
        inputs.append({
            "ref": write_tensor(folder, f"ref_in_{p}", r) if r is not None else None,
            "cand": write_tensor(folder, f"cand_in_{p}", c) if c is not None else None,
        })  # fmt: skip
    cand_outs = dict(kept.cand_outputs)
    outputs = [
        {
            "index": i,
            "ref": write_tensor(folder, f"ref_out_{i}", t),
            "cand": write_tensor(folder, f"cand_out_{i}", cand_outs[i]),
        }
        for i, t in kept.ref_outputs
        if i in cand_outs
    ]
    meta = {
        "kind": "op", "run_id": run_id, "namespace": ns or "aten", "name": name,
        "overload": kept.overload, "args": encode(kept.args[0]), "kwargs": encode(kept.args[1]),
        "cand_args": encode(kept.cand_args[0]), "cand_kwargs": encode(kept.cand_args[1]),
        "inputs": inputs, "outputs": outputs, "slice": kept.slice, **row_facts(kept.row),
    }  # fmt: skip
    return write_index(folder, meta)
