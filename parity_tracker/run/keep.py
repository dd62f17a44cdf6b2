"""Keep what the reproducers of a run's first divergence and root causes need (issue 20 §4).

Written under the run's dump folder as ``repro/`` (so ``log_run`` uploads it as
``tensors/repro/``), one sub-folder per reproducer plus ``kept.json``:

- ``op-NN``: a root-cause op's material (``localize.keep.KeptOp``, written by
  ``files.repro_data.write_op``), kept during the op comparison (``run_parity(capture_ops=True)``).
- ``module``: the first divergent module call: its class, constructor arguments where they can
  be recovered (attributes named like the constructor's parameters; a HuggingFace ``config``
  object as ``to_dict()``; a diffusers ``ConfigMixin`` through ``from_config``), ``repr``, the
  ``state_dict`` as safetensors, its inputs and both sides' outputs. These come from one more
  forward of each side with a hook on that module only (the first run compared and released
  them; each re-run stops right after that call). The rebuild is checked at once: the rebuilt
  module must reproduce the reference output exactly, else the reproducer compares recorded
  outputs only and says why.

Everything is bounded by ``limit_bytes`` per reproducer; what does not fit is listed in
``kept.json`` under ``not_kept`` with the reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from parity_tracker.capture.leaves import output_leaves
from parity_tracker.capture.tags import call_base, named_modules
from parity_tracker.compare.verdict import first_divergence
from parity_tracker.files import repro_data, repro_lib
from parity_tracker.files.atomic import atomic_write_json
from parity_tracker.localize.keep import leading_slice

KEPT_INDEX = "kept.json"


def _clone(value: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value)


class _Caught(BaseException):
    """Stops the re-run forward once the call is caught.

    A BaseException, so drives that catch ``Exception`` do not swallow it.
    """


class _CallCatcher:
    """A forward hook pair catching the ``(step, call)``-th call of one module."""

    def __init__(self, stepper: Any, step: int, call: int) -> None:
        self.stepper, self.step, self.call = stepper, step, call
        self.seen: dict[int, int] = {}
        self.args: Any = None
        self.kwargs: Any = None
        self.output: Any = None
        self._mine = False

    def pre(self, _mod: Any, args: Any, kwargs: Any) -> None:
        step = int(getattr(self.stepper, "step", 0) or 0)
        k = self.seen.get(step, 0)
        self.seen[step] = k + 1
        self._mine = (step, k) == (self.step, self.call) and self.output is None
        if self._mine:
            self.args, self.kwargs = _clone(args), _clone(kwargs)

    def post(self, _mod: Any, _args: Any, _kwargs: Any, output: Any) -> None:
        if self._mine:
            self.output, self._mine = _clone(output), False
            raise _Caught


def catch_call(
    model: torch.nn.Module, module: str, step: int, call: int, run: Callable[[Any], None]
) -> _CallCatcher | None:
    """Run ``run(stepper)`` with ``module`` (display name) hooked; its ``(step, call)`` call."""
    mod = named_modules(model).get(module)
    if mod is None:
        return None

    class _Stepper:
        step = 0

        def register_tensor(self, *a: Any, **k: Any) -> None: ...

        def mark_cache_hit(self, *a: Any, **k: Any) -> None: ...

    stepper = _Stepper()
    catcher = _CallCatcher(stepper, step, call)
    handles = [
        mod.register_forward_pre_hook(catcher.pre, with_kwargs=True),
        mod.register_forward_hook(catcher.post, with_kwargs=True),
    ]
    try:
        run(stepper)
    except _Caught:
        pass
    finally:
        for h in handles:
            h.remove()
    return catcher if catcher.output is not None else None


# ---------------------------------------------------------------------------------------------
# constructor recovery


def _config_value(v: Any) -> dict[str, Any] | None:
    if hasattr(v, "to_dict") and hasattr(type(v), "from_dict"):
        cls = type(v)
        return {"config": {"module": cls.__module__, "qualname": cls.__qualname__,
                           "dict": v.to_dict()}}  # fmt: skip
    return None


def ctor_spec(mod: torch.nn.Module) -> tuple[dict[str, Any] | None, str | None]:
    """``({"kwargs": ...} | {"from_config": ...}, None)`` or ``(None, reason)``."""
    cls = type(mod)
    config = getattr(mod, "config", None)
    if hasattr(cls, "from_config") and isinstance(config, dict):  # diffusers ConfigMixin
        enc = repro_data.encode(dict(config))
        bad = repro_data.unsupported(enc)
        return ({"from_config": enc}, None) if not bad else (None, f"config holds {bad[0]}")
    kwargs: dict[str, Any] = {}
    for name, p in list(inspect.signature(cls.__init__).parameters.items())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if not hasattr(mod, name):
            if p.default is p.empty:
                return None, f"constructor argument {name!r} is not kept by the module"
            continue
        v = getattr(mod, name)
        if isinstance(v, torch.Tensor) or (v is None and p.default is True):
            v = v is not None  # ``bias=True`` becomes a parameter (or None)
        enc = _config_value(v) or repro_data.encode(v)
        if repro_data.unsupported(enc):
            if p.default is p.empty:
                return None, f"constructor argument {name!r} = {type(v).__qualname__} not saved"
            continue
        kwargs[name] = enc
    return {"kwargs": kwargs}, None


# ---------------------------------------------------------------------------------------------
# writing


def _nbytes(value: Any) -> int:
    from torch.utils._pytree import tree_flatten

    leaves = tree_flatten(value)[0]
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _write_leaves(folder: Path, prefix: str, value: Any) -> list[dict[str, Any]]:
    leaves = repro_lib.leaves(value)
    return [repro_data.write_tensor(folder, f"{prefix}_{i}", t) for i, t in enumerate(leaves)]


def write_module(
    folder: Path,
    mod: torch.nn.Module,
    ref: _CallCatcher,
    cand_output: Any,
    row: dict[str, Any],
    run_id: str,
    limit_bytes: int,
) -> tuple[bool, str]:
    """Write the module reproducer; returns ``(rebuildable, reason)``.

    Over ``limit_bytes``, only a slice of the recorded outputs is kept (:func:`_cut_outputs`)
    and the test compares them (the module is not rebuilt).

    Raises:
        ValueError: the outputs have no tensor pair to compare.
    """
    io = _nbytes((ref.args, ref.kwargs, ref.output, cand_output))
    cut, too_big = None, None
    if io > limit_bytes:
        cand_output, cut = _cut_outputs(ref, cand_output, limit_bytes)
        too_big = f"its inputs and outputs take {io} bytes, over the {limit_bytes}-byte limit"
    folder.mkdir(parents=True, exist_ok=True)
    inputs: list[torch.Tensor] = []

    def tensor(t: torch.Tensor) -> int:
        inputs.append(t)
        return len(inputs) - 1

    args, kwargs = repro_data.encode(tuple(ref.args), tensor), repro_data.encode(ref.kwargs, tensor)
    ctor, reason = ctor_spec(mod) if too_big is None else (None, too_big)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in mod.state_dict().items()}
    state_file = None
    if ctor is not None and repro_data.unsupported([args, kwargs]):
        ctor, reason = (
            None,
            "an input could not be saved: " + repro_data.unsupported([args, kwargs])[0],
        )
    if ctor is not None and io + _nbytes(state) > limit_bytes:
        ctor, reason = None, f"its state_dict ({_nbytes(state)} bytes) exceeds the size limit"
    if ctor is not None and state:
        try:
            from safetensors.torch import save_file

            save_file(state, str(repro_lib.inside(folder, "state_dict.safetensors")))
            state_file = "state_dict.safetensors"
        except Exception as exc:  # quantized or otherwise unsupported tensors
            ctor, reason = None, f"state_dict not saved as safetensors: {exc}"
    cls = type(mod)
    meta = {
        "kind": "module", "run_id": run_id, "module": row.get("module"),
        "module_class": {"module": cls.__module__, "qualname": cls.__qualname__},
        "repr": repr(mod)[:4000], "ctor": ctor, "state_dict": state_file,
        "args": args, "kwargs": kwargs,
        "input_tensors": [
            repro_data.write_tensor(folder, f"in_{i}", t) for i, t in enumerate(inputs)
        ],
        "ref_outputs": _write_leaves(folder, "ref_out", ref.output),
        "cand_outputs": _write_leaves(folder, "cand_out", cand_output),
        "rebuild": ctor is not None, "rebuild_reason": reason,
        **repro_data.row_facts(row), "slice": cut,
    }  # fmt: skip
    repro_data.write_index(folder, meta)
    if ctor is not None:
        reason = _check_rebuild(folder, meta)
        if reason is not None:
            meta.update(rebuild=False, rebuild_reason=reason)
            repro_data.write_index(folder, meta)
    return bool(meta["rebuild"]), str(meta["rebuild_reason"] or "")


def _cut_outputs(ref: _CallCatcher, cand_output: Any, limit: int) -> tuple[Any, dict[str, Any]]:
    """Keep only the flat run of elements around the worst one of the worst output pair.

    ``ref`` loses its inputs (they do not fit); its output becomes the reference slice.

    Raises:
        ValueError: no output pair of equal shape.
    """
    pairs = [
        (r, c)
        for r, c in zip(repro_lib.leaves(ref.output), repro_lib.leaves(cand_output), strict=False)
        if r.shape == c.shape and r.numel() and not r.is_quantized and not c.is_quantized
    ]
    if not pairs:
        raise ValueError("too large, and no output pair of equal shape to cut a slice from")

    def diff(p: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return (p[0].double() - p[1].double()).abs().nan_to_num(float("inf")).reshape(-1)

    r, c = max(pairs, key=lambda p: float(diff(p).max()))
    worst, n = int(diff((r, c)).argmax()), r.numel()
    start, stop = leading_slice(
        n, worst, max(1, limit // (2 * (r.element_size() + c.element_size())))
    )
    ref.args, ref.kwargs, ref.output = (), {}, r.reshape(-1)[start:stop].clone()
    cut = {"dim": "flat", "start": start, "stop": stop, "of": n, "shape": list(r.shape)}
    return c.reshape(-1)[start:stop].clone(), cut


def _check_rebuild(folder: Path, meta: dict[str, Any]) -> str | None:
    """None when the rebuilt module reproduces the recorded reference output exactly."""
    try:
        got = repro_lib.module_outputs(folder, meta, repro_lib.rebuild_module(folder, meta))
    except Exception as exc:
        return f"rebuilding it failed: {type(exc).__name__}: {exc}"[:500]
    want = [repro_lib.load_tensor(folder, e) for e in meta["ref_outputs"]]
    if len(got) != len(want) or not all(
        g.dtype == w.dtype and g.shape == w.shape and torch.equal(g.cpu(), w.cpu())
        for g, w in zip(got, want, strict=False)
    ):
        return "the rebuilt module does not reproduce the recorded reference output exactly"
    return None


def keep_for_run(
    root: Path,
    *,
    run_id: str,
    rows: list[dict[str, Any]],
    kept_ops: list[Any],
    unkept_ops: list[str],
    run_module: Callable[[int, str, int, int], _CallCatcher | None] | None,
    limit_bytes: int,
) -> Path:
    """Write ``root/repro`` (op reproducers, the first divergent module's, ``kept.json``)."""
    out = root / "repro"
    out.mkdir(parents=True, exist_ok=True)
    items: list[dict[str, Any]] = []
    not_kept = [{"tag": t, "reason": f"over the {limit_bytes}-byte limit"} for t in unkept_ops]
    for n, kept in enumerate(kept_ops):
        repro_data.write_op(out / f"op-{n:02d}", kept, run_id)
        items.append(
            {"kind": "op", "tag": kept.tag, "dir": f"op-{n:02d}", "cause": kept.row.get("cause")}
        )
    fd = first_divergence(rows)
    if fd is not None and fd.get("module") and run_module is not None:
        _keep_module(out, fd, run_module, run_id, limit_bytes, items, not_kept)
    atomic_write_json(out / KEPT_INDEX, {"items": items, "not_kept": not_kept}, indent=1)
    return out


def _dumped_candidate(dump: Path, fd: dict[str, Any], ref: _CallCatcher, base: str) -> Any:
    """The candidate's dumped tensor of the first divergent tag, or None.

    ``ref.output`` is narrowed to the same leaf (None: the dump does not hold the tag).
    """
    import json

    import numpy as np

    from parity_tracker.files.dump import INDEX_NAME, _restore

    index = dump / INDEX_NAME
    leaves = {tag: leaf for tag, _slot, leaf in output_leaves(base, ref.output)}
    if not index.is_file() or fd["tag"] not in leaves:
        return None
    step = int(fd.get("step") or 0)
    for e in json.loads(index.read_text())["files"]:
        if (e["tag"], e["side"], e.get("step", 0)) == (fd["tag"], 1, step) and "file" in e:
            arr = np.load(repro_lib.inside(dump, e["file"]), allow_pickle=False)
            ref.output = leaves[fd["tag"]]
            return _restore(dump, e, torch.from_numpy(arr))
    return None


def _keep_module(out, fd, run_module, run_id, limit_bytes, items, not_kept) -> None:
    module, step, call = fd["module"], int(fd.get("step") or 0), int(fd.get("call_index") or 0)
    try:
        got = run_module(0, module, step, call), run_module(1, module, step, call)
    except Exception as exc:
        not_kept.append({"tag": fd["tag"], "reason": f"re-running failed: {exc!r}"[:500]})
        return
    (ref, mod), (cand, _) = got
    cand_output = cand.output if cand is not None else None
    if ref is not None and cand is None:  # e.g. an onnxruntime candidate: its dumped tensor
        cand_output = _dumped_candidate(out.parent, fd, ref, call_base(module, call))
    if ref is None or cand_output is None:
        side = "reference" if ref is None else "candidate (nor in the dump)"
        not_kept.append({"tag": fd["tag"], "reason": f"module {module} not found on the {side}"})
        return
    try:
        rebuild, reason = write_module(
            out / "module", mod, ref, cand_output, fd, run_id, limit_bytes
        )
    except ValueError as exc:
        not_kept.append({"tag": fd["tag"], "reason": str(exc)})
        return
    items.append({"kind": "module", "tag": fd["tag"], "dir": "module", "module": module,
                  "rebuild": rebuild, "rebuild_reason": reason or None})  # fmt: skip
