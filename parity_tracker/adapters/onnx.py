"""ONNX Runtime candidates, module by module (the first user of :mod:`.foreign`).

1. **Export** (:func:`export`): ``torch.onnx.export(reference, args, dynamo=True)``. Torch
   2.13's exporter writes on every node ``metadata_props["pkg.torch.onnx.name_scopes"]``, e.g.
   ``"['', 'encoder', 'encoder.conv_in', 'conv2d']"``: the ``named_modules()`` names of the
   module calls the node came from, then the FX node's own name. Parameters and buffers
   become initializers under their qualified names (``encoder.conv_in.weight``).
2. **Map** (:func:`build_name_map`): each module call is the contiguous run of nodes whose
   scope holds its name (the k-th run = call k, FX order being execution order). Its
   *outputs* are the values its nodes produce and a node outside it (or the graph output)
   consumes; its *inputs* the values its nodes consume that come from outside (initializers
   left out). They are paired with the reference's tags (:func:`.foreign.probe_reference`):
   one to one, or by unique shape; what cannot be paired, and modules the exporter kept no
   node for (an identity such as ``Dropout`` in eval), are *not observable* with the reason.
3. **Observe** (:class:`OrtEngine`): like Polygraphy's ``--onnx-outputs mark all``, every
   mapped value is made a graph output of a second, *marked* model. Marking can change what
   ONNX Runtime computes (a marked value blocks the fusions across it), so the *deployed*
   (unmarked) model runs too: the model outputs' verdict comes from it; the per-module values
   from the marked model are diagnostic (run param ``foreign_module_values``); if the two
   models' outputs differ, the run says that observing changed the result
   (``observing_changed_result``, ``observing_max_abs_diff``). With graph optimisations on
   (``ort_optimization=enable_all``), a mapped value that the deployed model's optimised graph
   no longer has (fused away) is *not observable*, never ``missing``.
"""

from __future__ import annotations

import ast
import os
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from parity_tracker.adapters.foreign import ForeignCandidate, NameMap, ProbedTag, probe_reference
from parity_tracker.capture import root_name
from parity_tracker.compare.hashing import numpy_in_place
from parity_tracker.errors import InfrastructureError, InputError

#: ``ort_optimization`` setting values and the onnxruntime graph optimisation level of each.
ORT_OPTIMIZATION = ("disable_all", "enable_all")
SCOPES_KEY = "pkg.torch.onnx.name_scopes"
DEPLOYED = "deployed:"


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise InfrastructureError(
            "ONNX candidates need onnx, onnxscript and onnxruntime: "
            "pip install 'parity-tracker[onnx]'"
        ) from exc
    return onnx


def export(reference: torch.nn.Module, args: tuple[Any, ...], **kwargs: Any) -> Any:
    """Export ``reference`` with ``torch.onnx.export(..., dynamo=True)``; the ``ModelProto``.

    Args:
        reference: the module (exported in eval mode).
        args: positional example inputs.
        **kwargs: passed on (``dynamic_shapes``, ``opset_version``, ...).

    Returns:
        The exported ``onnx.ModelProto`` (the exporter's own graph optimisation applied).
    """
    _onnx()
    was = reference.training
    reference.eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(reference, args, dynamo=True, verbose=False, **kwargs)
    finally:
        reference.train(was)
    return program.model_proto


def load_model(model: Any, reference: torch.nn.Module, args: tuple[Any, ...]) -> Any:
    """A ``ModelProto`` from a path, a ``ModelProto``, an ``ONNXProgram`` or an ExportedProgram.

    ``None`` exports ``reference`` on ``args`` (:func:`export`).

    Raises:
        InputError: a path that does not exist, or an object of another type.
    """
    onnx = _onnx()
    if model is None:
        return export(reference, args)
    if isinstance(model, (str, os.PathLike)):
        if not Path(model).is_file():
            raise InputError(f"ONNX model {str(model)!r} does not exist: pass an existing .onnx")
        return onnx.load(str(model))
    if isinstance(model, onnx.ModelProto):
        return model
    if hasattr(model, "model_proto"):  # torch.onnx.ONNXProgram
        return model.model_proto
    if isinstance(model, torch.export.ExportedProgram):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.onnx.export(model, args, dynamo=True, verbose=False).model_proto
    raise InputError(
        f"onnx_model is a {type(model).__name__}: pass a .onnx path, an onnx.ModelProto, a "
        "torch.onnx.ONNXProgram or a torch.export.ExportedProgram"
    )


def node_scopes(node: Any) -> list[str] | None:
    """The module names a node was exported from (``''`` = root), or ``None`` without metadata."""
    for prop in node.metadata_props:
        if prop.key == SCOPES_KEY:
            try:
                names = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return None
            return [str(n) for n in names[:-1]]
    return None


def _shapes(model: Any) -> dict[str, tuple[Any, ...]]:
    """``{value name: shape}``, a symbolic dimension as its name (value_info, inputs, outputs)."""
    g = model.graph
    out = {}
    for vi in (*g.value_info, *g.input, *g.output):
        dims = vi.type.tensor_type.shape.dim
        out[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims)
    for init in g.initializer:
        out[init.name] = tuple(init.dims)
    return out


def _segments(model: Any) -> dict[str, list[list[int]]]:
    """``{module raw name: [node indices of call 0, of call 1, ...]}`` from the name scopes."""
    runs: dict[str, list[list[int]]] = {}
    last: dict[str, int] = {}
    for i, node in enumerate(model.graph.node):
        for name in node_scopes(node) or []:
            if last.get(name) == i - 1:
                runs[name][-1].append(i)
            else:
                runs.setdefault(name, []).append([i])
            last[name] = i
    return runs


def _boundary(model: Any, nodes: list[int], consumers: dict[str, set[int]], graph_out: set[str]):
    """``(inputs, outputs)`` value names of a call: external inputs and escaping outputs."""
    inside = set(nodes)
    consts = {i.name for i in model.graph.initializer}
    produced, inputs, outputs = set(), [], []
    for i in nodes:
        node = model.graph.node[i]
        for name in node.input:
            if name and name not in produced and name not in consts and name not in inputs:
                inputs.append(name)
        for name in node.output:
            produced.add(name)
            if name and (name in graph_out or consumers.get(name, set()) - inside):
                outputs.append(name)
    return inputs, outputs


def _match(tags: list[ProbedTag], names: list[str], shapes: dict[str, tuple]) -> dict[str, str]:
    """Pair tags with value names: one to one, in order when shapes agree, else by unique shape."""

    def same(tag: ProbedTag, name: str) -> bool:
        shape = shapes.get(name)
        if shape is None or tag.shape is None or len(shape) != len(tag.shape):
            return shape is None
        return all(isinstance(d, str) or d == t for d, t in zip(shape, tag.shape, strict=True))

    if len(tags) == len(names) and all(same(t, n) for t, n in zip(tags, names, strict=True)):
        return {t.tag: n for t, n in zip(tags, names, strict=True)}
    out = {}
    for t in tags:
        fits = [n for n in names if same(t, n)]
        if len(fits) == 1 and sum(same(o, fits[0]) for o in tags) == 1:
            out[t.tag] = fits[0]
    return out


def build_name_map(model: Any, probed: Sequence[ProbedTag], root: str = "model") -> NameMap:
    """Map the reference's tags (step 0) to the values of an exported ONNX model.

    Args:
        model: the ``onnx.ModelProto`` (from ``torch.onnx.export(..., dynamo=True)``).
        probed: the reference's tags (:func:`.foreign.probe_reference`).
        root: the reference root's display name (``model`` or ``root``).

    Returns:
        The :class:`NameMap`; root inputs / outputs map to the graph's inputs / outputs
        (outputs prefixed ``deployed:``: read from the unmarked model), parameters and buffers
        to initializers of the same qualified name.
    """
    g = model.graph
    shapes = _shapes(model)
    consumers: dict[str, set[int]] = {}
    for i, node in enumerate(g.node):
        for name in node.input:
            consumers.setdefault(name, set()).add(i)
    graph_out = {o.name for o in g.output}
    inits = {i.name for i in g.initializer}
    segs = _segments(model)
    has_scopes = bool(segs)
    nmap = NameMap()
    groups: dict[tuple[str | None, str, int], list[ProbedTag]] = {}
    for p in probed:
        if p.step != 0 or p.shape is None:
            continue
        if p.kind in ("param", "buffer"):
            qname = p.tag.removeprefix("checker_")
            if qname in inits:
                nmap.values[p.tag] = qname
                nmap.weights.add(p.tag)
            else:
                nmap.not_observable[p.tag] = (
                    f"the exporter kept no initializer named {qname!r} (folded, transposed or "
                    "cast into another constant)"
                )
            continue
        groups.setdefault((p.module, p.kind, p.call_index), []).append(p)
    graph_in = [i.name for i in g.input if i.name not in inits]
    for (module, kind, k), tags in groups.items():
        why = "no graph input/output pairs with it"
        if module == root and k == 0:
            names = graph_in if kind == "input" else [DEPLOYED + o.name for o in g.output]
            found = _match(tags, names, {**shapes, **{DEPLOYED + o: shapes[o] for o in graph_out}})
        elif not has_scopes:
            found, why = {}, f"the ONNX model carries no module name scopes ({SCOPES_KEY})"
        else:
            raw = "" if module == root else str(module)
            calls = segs.get(raw, [])
            if k >= len(calls):
                found, why = {}, f"the exporter kept no node for call {k} of module {module!r}"
            else:
                ins, outs = _boundary(model, calls[k], consumers, graph_out)
                found = _match(tags, ins if kind == "input" else outs, shapes)
                why = (
                    f"{len(ins if kind == 'input' else outs)} value(s) enter/leave module "
                    f"{module!r} in the export, {len(tags)} {kind} tensor(s) in PyTorch: no "
                    "unambiguous pairing"
                )
        for t in tags:
            if t.tag in found:
                nmap.values[t.tag] = found[t.tag]
            else:
                nmap.not_observable[t.tag] = why
    return nmap


def _marked(model: Any, names: list[str]) -> Any:
    """A copy of ``model`` with each of ``names`` added as a graph output (Polygraphy's mark)."""
    onnx = _onnx()
    marked = onnx.ModelProto()
    marked.CopyFrom(model)
    infos = {vi.name: vi for vi in marked.graph.value_info}
    have = {o.name for o in marked.graph.output} | {i.name for i in marked.graph.input}
    for name in names:
        if name in have:
            continue
        vi = infos.get(name)
        marked.graph.output.append(vi if vi is not None else onnx.ValueInfoProto(name=name))
        have.add(name)
    return marked


class OrtEngine:
    """An ONNX model in two onnxruntime CPU sessions: deployed (unmarked) and marked.

    Args:
        model: the ``onnx.ModelProto``.
        name_map: the map from :func:`build_name_map`; mapped values the deployed model's
            optimised graph no longer has are moved to its ``not_observable``.
        ort_optimization: ``disable_all`` or ``enable_all`` (onnxruntime's
            ``GraphOptimizationLevel.ORT_DISABLE_ALL`` / ``ORT_ENABLE_ALL``).
        threads: intra-op threads (1: reproducible).

    Attributes:
        notes: run params: ``ort_optimization``, ``observing_changed_result``,
            ``observing_max_abs_diff`` (max abs difference of the two models' outputs over
            all steps, ``0.0`` when they agree), ``foreign_module_values``.
    """

    def __init__(
        self, model: Any, name_map: NameMap, ort_optimization: str = "disable_all", threads: int = 1
    ) -> None:
        if ort_optimization not in ORT_OPTIMIZATION:
            raise InputError(
                f"ort_optimization={ort_optimization!r}; allowed: {', '.join(ORT_OPTIMIZATION)}"
            )
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover
            raise InfrastructureError("pip install 'parity-tracker[onnx]' (onnxruntime)") from exc
        self._ort, self.level, self.threads = ort, ort_optimization, threads
        self.name_map = name_map
        wanted = {name_map.values[t] for t in name_map.weights}
        to_array = _onnx().numpy_helper.to_array
        self.weights = {i.name: to_array(i) for i in model.graph.initializer if i.name in wanted}
        self.outputs = [o.name for o in model.graph.output]
        self.inputs = [i.name for i in model.graph.input if i.name not in _inits(model)]
        with tempfile.TemporaryDirectory(prefix="parity-ort-") as tmp:
            optimized = os.path.join(tmp, "deployed.onnx")
            self.deployed = self._session(model, optimized)
            kept = _value_names(_onnx().load(optimized))
        self._drop_fused(kept)
        marked = [
            n
            for n in name_map.names()
            if not n.startswith(DEPLOYED) and n not in self.inputs and n not in self.weights
        ]
        self.marked_names = [n for n in marked if n not in self.outputs] + self.outputs
        self.marked = self._session(_marked(model, marked), None)
        self.max_diff = 0.0
        self.notes = {
            "ort_optimization": ort_optimization,
            "foreign_module_values": "diagnostic: from the ONNX model with every mapped value "
            "marked as a graph output; the model outputs come from the deployed model",
        }

    def _session(self, model: Any, optimized: str | None) -> Any:
        ort = self._ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = self.threads
        opts.log_severity_level = 3
        level = "ORT_ENABLE_ALL" if self.level == "enable_all" else "ORT_DISABLE_ALL"
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        if optimized:
            opts.optimized_model_filepath = optimized
        return ort.InferenceSession(
            model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"]
        )

    def _drop_fused(self, kept: set[str]) -> None:
        nmap = self.name_map
        for tag, name in list(nmap.values.items()):
            if tag in nmap.weights or name.startswith(DEPLOYED) or name in kept:
                continue
            del nmap.values[tag]
            nmap.not_observable[tag] = (
                f"value {name!r} is fused away by onnxruntime's graph optimisations "
                f"(ort_optimization={self.level}): the deployed model never materialises it"
            )

    def run(self, inputs: Sequence[Any]) -> dict[str, Any]:
        """One forward of both models; ``{value name: array}`` (deployed outputs prefixed)."""
        feeds = {n: _numpy(x) for n, x in zip(self.inputs, inputs, strict=True)}
        deployed = self.deployed.run(self.outputs, feeds)
        values = dict(
            zip(self.marked_names, self.marked.run(self.marked_names, feeds), strict=True)
        )
        for name, dep in zip(self.outputs, deployed, strict=True):
            diff = np.abs(dep.astype(np.float64) - values[name].astype(np.float64))
            self.max_diff = max(self.max_diff, float(diff.max()) if diff.size else 0.0)
        self.notes["observing_changed_result"] = self.max_diff > 0
        self.notes["observing_max_abs_diff"] = self.max_diff
        if self.max_diff > 0:
            warnings.warn(
                "observing changed the result: the ONNX model with its intermediates marked as "
                "outputs computes outputs that differ from the deployed model's by up to "
                f"{self.max_diff:.3g}; the verdict on the model outputs is the deployed model's",
                UserWarning,
                stacklevel=2,
            )
        values.update({DEPLOYED + n: v for n, v in zip(self.outputs, deployed, strict=True)})
        values.update(self.weights)
        values.update(feeds)
        return values


def _inits(model: Any) -> set[str]:
    return {i.name for i in model.graph.initializer}


def _value_names(model: Any) -> set[str]:
    g = model.graph
    names = {i.name for i in g.input} | {i.name for i in g.initializer}
    for node in g.node:
        names.update(node.output)
    return names


def _numpy(x: Any) -> np.ndarray:
    """An input for ONNX Runtime: a tensor read in place (``compare.hashing.numpy_in_place``).

    ``Tensor.numpy()`` would mark the caller's input storage not resizable for good (its own
    later ``resize_`` raised, w9trust); the view is read within ``InferenceSession.run``.
    """
    if not isinstance(x, torch.Tensor):
        return np.asarray(x)
    return numpy_in_place(x.detach().cpu().resolve_conj().resolve_neg())


def onnx_candidate(
    reference: torch.nn.Module,
    steps: Sequence[tuple[Any, ...]],
    onnx_model: Any = None,
    *,
    ort_optimization: str = "disable_all",
    threads: int = 1,
) -> ForeignCandidate:
    """An ONNX Runtime candidate for ``reference``, compared module by module.

    Args:
        reference: the PyTorch module (the reference of the run).
        steps: the positional inputs of each forward (one tuple per step).
        onnx_model: a ``.onnx`` path, an ``onnx.ModelProto``, a ``torch.onnx.ONNXProgram`` or a
            ``torch.export.ExportedProgram``; ``None`` exports ``reference`` on ``steps[0]``.
        ort_optimization: ``disable_all`` | ``enable_all``.
        threads: onnxruntime intra-op threads.

    Returns:
        A :class:`.foreign.ForeignCandidate`: pass it as the candidate with
        ``drive=cand.reference_drive, candidate_drive=cand.drive``.

    Raises:
        InputError: a bad ``onnx_model`` or ``ort_optimization``.
    """
    steps = [tuple(s) for s in steps]
    model = load_model(onnx_model, reference, steps[0])
    probed = probe_reference(reference, ForeignCandidate(None, NameMap(), steps).reference_drive)
    nmap = build_name_map(model, probed, root_name(reference))
    engine = OrtEngine(model, nmap, ort_optimization, threads)
    return ForeignCandidate(engine, nmap, steps, notes={"onnx_opset": _opset(model)})


def _opset(model: Any) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
