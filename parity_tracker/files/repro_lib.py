"""The standalone half of a reproducer folder (issue 20): copied into it as ``_parity_repro.py``.

It imports only the standard library, numpy, torch and (for the assertions)
``parity_tracker.testing``, so a reproducer runs with ``pytest`` on a machine that has nothing
else. The run stage imports it too (to check, while the model is alive, that a module rebuilds),
so the code that writes a reproducer and the code that replays it cannot drift apart.

``repro.json`` (format ``parity_tracker.repro``, version 1) names every file relative to the
folder; :func:`inside` refuses any path that leaves it. Tensors are ``.npy`` files written
losslessly (``parity_tracker.files.dump.to_numpy``: bfloat16/float8 as float32, quantized as
``int_repr`` + scale/zero point) with their original dtype, shape and strides; non-tensor values
are tagged JSON (:func:`decode`).
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT, VERSION, INDEX = "parity_tracker.repro", 1, "repro.json"


def inside(folder: Path, name: str) -> Path:
    """``folder / name``, refusing absolute paths and paths that leave ``folder``."""
    root = Path(folder).resolve()
    path = (root / name).resolve()
    if Path(name).is_absolute() or (path != root and root not in path.parents):
        raise ValueError(f"path {name!r} in {INDEX} leaves the reproducer folder {root}")
    return path


def read_index(folder: Path) -> dict[str, Any]:
    """The folder's ``repro.json`` (checked format and version)."""
    meta = json.loads(inside(folder, INDEX).read_text())
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"{folder}/{INDEX} is not a {FORMAT} v{VERSION} index")
    return meta


def device() -> torch.device:
    """Where the reproducer runs: ``$REPRO_DEVICE`` (default ``cpu``)."""
    return torch.device(os.environ.get("REPRO_DEVICE", "cpu"))


def load_tensor(folder: Path, entry: dict[str, Any]) -> torch.Tensor:
    """A tensor entry back in its original dtype, shape and strides (on :func:`device`)."""
    arr = np.load(inside(folder, entry["file"]), allow_pickle=False)
    t = torch.from_numpy(arr)
    if "qscheme" in entry:
        if "scale" in entry:
            return torch._make_per_tensor_quantized_tensor(t, entry["scale"], entry["zero_point"])
        scales = torch.from_numpy(np.load(inside(folder, entry["scales_file"]), allow_pickle=False))
        zps = torch.from_numpy(
            np.load(inside(folder, entry["zero_points_file"]), allow_pickle=False)
        )
        return torch._make_per_channel_quantized_tensor(t, scales, zps, entry["axis"])
    t = t.to(getattr(torch, entry["dtype"])).to(device())
    stride = entry.get("stride")
    if stride is None or tuple(stride) == t.stride():
        return t
    strided = torch.empty_strided(
        tuple(entry["shape"]), tuple(stride), dtype=t.dtype, device=t.device
    )
    try:
        strided.copy_(t)
    except RuntimeError:  # overlapping strides (an expanded tensor): keep the values
        return t
    return strided


def decode(value: Any, tensors: list[torch.Tensor | None]) -> Any:
    """A tagged JSON value back as Python (``{"tensor": i}`` -> ``tensors[i]``)."""
    if not isinstance(value, dict):
        return value
    (kind, v), *_ = value.items()
    simple = {
        "tensor": lambda: tensors[v],
        "float": lambda: float(v),
        "dtype": lambda: getattr(torch, v),
        "layout": lambda: getattr(torch, v),
        "memory_format": lambda: getattr(torch, v),
        "device": lambda: device(),
        "list": lambda: [decode(x, tensors) for x in v],
        "tuple": lambda: tuple(decode(x, tensors) for x in v),
        "dict": lambda: {k: decode(x, tensors) for k, x in v.items()},
    }
    if kind in simple:
        return simple[kind]()
    raise ValueError(
        f"argument {value.get('repr', value)!r} could not be saved; rebuild it by hand"
    )


def op_callable(meta: dict[str, Any]) -> Any:
    """``torch.ops.<namespace>.<name>.<overload>``."""
    packet = getattr(getattr(torch.ops, meta["namespace"]), meta["name"])
    return getattr(packet, meta["overload"])


def layout_differences(meta: dict[str, Any]) -> list[str]:
    """Dtype / stride / contiguity differences of the two sides' inputs, in words."""
    out = []
    for p, pair in enumerate(meta["inputs"]):
        ref, cand = pair.get("ref"), pair.get("cand")
        if ref is None or cand is None:
            continue
        for key in ("dtype", "stride", "contiguous"):
            if ref.get(key) != cand.get(key):
                out.append(f"{key} (input {p}: {ref.get(key)} vs {cand.get(key)})")
    return out


def bitwise_equal(reference: torch.Tensor, candidate: torch.Tensor) -> bool:
    """Same dtype, shape and values (NaN matching NaN at the same positions).

    The ``equal`` status's rule (``torch.equal`` plus a dtype check, NaN-aware): case A (the
    kernel differs) is only claimed for inputs equal this way.
    """
    if reference.dtype != candidate.dtype or reference.shape != candidate.shape:
        return False
    if torch.equal(reference, candidate):
        return True
    if not (reference.is_floating_point() or reference.is_complex()):
        return False
    same = (reference == candidate) | (reference.isnan() & candidate.isnan())
    return bool(same.all())


def value_differences(ref_in: list[Any], cand_in: list[Any]) -> list[str]:
    """Inputs present on both sides that are not bitwise equal (:func:`bitwise_equal`), in words.

    A dtype difference alone is named by :func:`layout_differences`; here the values are
    compared after casting both to their promoted dtype.
    """
    out = []
    for p, (r, c) in enumerate(zip(ref_in, cand_in, strict=False)):
        if r is None or c is None or r.is_quantized or c.is_quantized:
            continue
        if r.shape != c.shape:
            out.append(f"shape (input {p}: {list(r.shape)} vs {list(c.shape)})")
            continue
        common = torch.promote_types(r.dtype, c.dtype)
        r2, c2 = r.to(common), c.to(r.device).to(common)
        if bitwise_equal(r2, c2):
            continue
        wide = torch.complex128 if common.is_complex else torch.float64
        diff = (r2.to(wide) - c2.to(wide)).abs()
        worst = diff[~diff.isnan()].max().item() if bool((~diff.isnan()).any()) else float("nan")
        out.append(f"value (input {p}: not bitwise equal, max abs diff {worst!r})")
    return out


def argument_differences(meta: dict[str, Any]) -> list[str]:
    """Non-tensor arguments that differ between the two sides' calls, in words."""
    out = []
    ref, cand = meta["args"].get("tuple", []), meta["cand_args"].get("tuple", [])
    for p in range(max(len(ref), len(cand))):
        a, b = ref[p] if p < len(ref) else None, cand[p] if p < len(cand) else None
        if a != b and not (isinstance(a, dict) and "tensor" in a):
            out.append(f"argument {p}: {a} vs {b}")
    rk, ck = meta["kwargs"].get("dict", {}), meta["cand_kwargs"].get("dict", {})
    for k in sorted(set(rk) | set(ck)):
        if rk.get(k) != ck.get(k):
            out.append(f"{k}={rk.get(k)!r} vs {ck.get(k)!r}")
    return out


def _first(outs: Any) -> list[torch.Tensor]:
    return list(outs) if isinstance(outs, (tuple, list)) else [outs]


def _assert(meta: dict[str, Any], reference: Any, candidate: Any, msg: str) -> None:
    from parity_tracker.testing import assert_tensor_allclose, assert_tensor_equal

    if meta.get("mode") == "allclose":
        assert_tensor_allclose(reference, candidate, meta.get("rtol"), meta.get("atol"), msg=msg)
    else:
        assert_tensor_equal(reference, candidate, msg=msg)


def _equalish(meta: dict[str, Any], reference: Any, candidate: Any) -> bool:
    try:
        _assert(meta, reference, candidate, "")
    except AssertionError:
        return False
    return True


def check_op(folder: Path) -> None:
    """Run the op on the reference inputs with PyTorch; compare with the candidate's output.

    Raises:
        AssertionError: the candidate's recorded output differs. The message names the op and
            says whether the inputs differ (dtype/stride/contiguity, or values that are not
            bitwise equal: case B, PyTorch on the candidate's own inputs is tried too) or the
            kernel differs (case A: bitwise-equal inputs with the same layout).
    """
    folder = Path(folder)
    meta = read_index(folder)
    op = op_callable(meta)
    ref_in = [load_tensor(folder, p["ref"]) if p.get("ref") else None for p in meta["inputs"]]
    cand_in = [load_tensor(folder, p["cand"]) if p.get("cand") else None for p in meta["inputs"]]
    args, kwargs = decode(meta["args"], ref_in), decode(meta["kwargs"], ref_in)
    expected = _first(op(*args, **kwargs))
    layout = layout_differences(meta) + value_differences(ref_in, cand_in)
    on_cand = None
    if None not in cand_in:
        cargs, ckw = decode(meta["cand_args"], cand_in), decode(meta["cand_kwargs"], cand_in)
        on_cand = _first(op(*cargs, **ckw))
    name = f"{meta['namespace']}::{meta['name']}.{meta['overload']}"
    for out in meta["outputs"]:
        i, cand = out["index"], load_tensor(folder, out["cand"])
        if layout:
            same = on_cand is not None and _equalish(meta, on_cand[i], cand)
            verdict = (
                "PyTorch on the candidate's inputs gives the candidate's output: fix the inputs "
                "(look upstream)"
                if same
                else "and the kernel differs too (PyTorch on the candidate's inputs disagrees)"
            )
            msg = f"{name} output {i}: inputs differ in {'; '.join(layout)}; {verdict}"
        else:
            msg = f"{name} output {i}: kernel differs (bitwise-equal inputs, same layout)"
        args_diff = argument_differences(meta)
        if args_diff:
            msg += f"; the candidate called it with other arguments: {', '.join(args_diff)}"
        _assert(meta, expected[i], cand, msg)


def _import(module: str, qualname: str) -> Any:
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _ctor_value(v: Any) -> Any:
    if isinstance(v, dict) and "config" in v:
        cfg = v["config"]
        cls = _import(cfg["module"], cfg["qualname"])
        return cls.from_dict(cfg["dict"]) if hasattr(cls, "from_dict") else cls(**cfg["dict"])
    return decode(v, [])


def rebuild_module(folder: Path, meta: dict[str, Any]) -> torch.nn.Module:
    """The reference module from its class, saved constructor arguments and state_dict.

    Raises:
        ValueError: the folder says the module cannot be rebuilt (its README says why).
    """
    spec = meta["module_class"]
    if not meta.get("rebuild"):
        raise ValueError(f"{spec['qualname']} cannot be rebuilt: {meta.get('rebuild_reason')}")
    cls = _import(spec["module"], spec["qualname"])
    ctor = meta["ctor"]
    if "from_config" in ctor:
        mod = cls.from_config(decode(ctor["from_config"], []))
    else:
        mod = cls(**{k: _ctor_value(v) for k, v in ctor["kwargs"].items()})
    if meta.get("state_dict"):
        from safetensors.torch import load_file

        state = load_file(str(inside(folder, meta["state_dict"])))
        mod.load_state_dict(state, strict=True, assign=True)
    return mod.eval().to(device())


def leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in leaves(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in leaves(v)]
    if hasattr(value, "to_tuple"):  # transformers ModelOutput
        return leaves(value.to_tuple())
    if hasattr(value, "sample"):  # diffusers DecoderOutput
        return leaves(value.sample)
    return []


def _tensors(folder: Path, entries: list[dict[str, Any]]) -> list[torch.Tensor]:
    return [load_tensor(folder, e) for e in entries]


def module_outputs(folder: Path, meta: dict[str, Any], module: torch.nn.Module) -> list[Any]:
    """The tensor leaves of ``module`` run on the saved inputs."""
    ins = _tensors(folder, meta["input_tensors"])
    args, kwargs = decode(meta["args"], ins), decode(meta["kwargs"], ins)
    with torch.no_grad():
        return leaves(module(*args, **kwargs))


def check_module(folder: Path) -> None:
    """Rebuild the reference module, run it, compare with the candidate's recorded output.

    When the module cannot be rebuilt (``rebuild`` false), compare the recorded reference
    output with the recorded candidate output instead.

    Raises:
        AssertionError: the candidate's recorded output differs (names the module and output).
    """
    folder = Path(folder)
    meta = read_index(folder)
    cand = _tensors(folder, meta["cand_outputs"])
    if meta.get("rebuild"):
        ref, how = module_outputs(folder, meta, rebuild_module(folder, meta)), "rebuilt"
    else:
        ref, how = _tensors(folder, meta["ref_outputs"]), "recorded"
    assert len(ref) == len(cand), f"{len(ref)} reference outputs vs {len(cand)} candidate ones"
    for i, (r, c) in enumerate(zip(ref, cand)):  # noqa: B905 (lengths asserted above)
        label = f"{meta['module_class']['qualname']} {meta['module']} output {i} ({how} reference)"
        _assert(meta, r, c, label)


def check(folder: Path) -> None:
    """Replay the reproducer in ``folder`` (op or module level)."""
    kind = read_index(Path(folder))["kind"]
    (check_op if kind == "op" else check_module)(Path(folder))


__all__ = [
    "bitwise_equal",
    "check",
    "check_module",
    "check_op",
    "decode",
    "inside",
    "load_tensor",
    "value_differences",
]
