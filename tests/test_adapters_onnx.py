"""ONNX Runtime candidates compared module by module (parity_tracker.adapters.onnx / foreign)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture.tags import output_tag

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from parity_tracker.adapters.foreign import NameMap, ProbedTag, register_values
from parity_tracker.adapters.onnx import export, node_scopes, onnx_candidate
from parity_tracker.compare import PASSING
from parity_tracker.run import run_parity

pytestmark = pytest.mark.slow  # every test exports with torch.onnx (dynamo)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.act = nn.SiLU()
        self.drop = nn.Dropout(0.1)  # identity in eval: the exporter keeps no node for it
        self.ln = nn.LayerNorm(8)
        self.gelu = nn.GELU()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop(self.act(self.norm(self.conv(x))))
        return self.head(self.gelu(self.ln(y.mean((2, 3)))))


class ConvRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.conv(x))


@pytest.fixture(scope="module")
def net():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Net().eval()
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = export(model, (x,))
    return model, x, proto


def _run(reference, cand, **kw):
    return run_parity(
        reference,
        cand,
        drive=cand.reference_drive,
        candidate_drive=cand.drive,
        settings={"implementation": "onnxruntime"},
        dump_mode="not",
        **kw,
    )


def _rows(result):
    return {r["tag"]: r for r in result.modules.to_pylist()}


def _kept_leaves(model: nn.Module, proto) -> set[str]:
    """Leaf modules with at least one exported node, read from the nodes' name scopes."""
    scoped = {name for node in proto.graph.node for name in node_scopes(node) or []}
    return {n for n, m in model.named_modules() if n and not list(m.children()) and n in scoped}


def test_export_compares_every_leaf_module_the_exporter_keeps(net):
    model, x, proto = net
    result = _run(model, onnx_candidate(model, [(x,)], proto))
    rows = _rows(result)
    kept = _kept_leaves(model, proto)
    assert kept == {"conv", "norm", "act", "ln", "gelu", "head"}
    compared = {
        r["module"] for r in rows.values() if r["kind"] == "output" and r["status"] in PASSING
    }
    assert kept <= compared
    assert result.passed
    assert result.mode == "budget"  # another implementation: error budget (issue 15)
    # the dropout (no node) is reported as not observable, not as missing
    drop = rows["checker_drop"]
    assert drop["status"] == "skipped"
    assert "kept no node" in drop["message"]
    assert not [r for r in rows.values() if r["status"].startswith("missing")]
    # the model output's verdict comes from the deployed graph; observing changed nothing here
    assert result.settings["observing_changed_result"] is False
    assert result.settings["observing_max_abs_diff"] == 0.0
    assert result.settings["foreign_module_values"].startswith("diagnostic")


def test_onnx_file_path_of_a_users_model(net, tmp_path):
    model, x, proto = net
    path = tmp_path / "net.onnx"
    path.write_bytes(proto.SerializeToString())
    result = _run(model, onnx_candidate(model, [(x,)], str(path)))
    assert result.passed
    # the output's error, against an independent float64 numpy reference of the head
    with torch.no_grad():
        want = model(x).double().numpy()
    rows = _rows(result)
    assert rows["checker_model"]["max_abs_diff"] <= 1e-5 * (1 + np.abs(want).max())


def _edited(proto, op: str, attr: str, value):
    import onnx

    edited = onnx.ModelProto()
    edited.CopyFrom(proto)
    node = next(n for n in edited.graph.node if n.op_type == op)
    for a in node.attribute:
        if a.name == attr:
            node.attribute.remove(a)
            break
    node.attribute.append(onnx.helper.make_attribute(attr, value))
    return edited


@pytest.mark.parametrize(
    ("op", "attr", "value", "module"),
    [("Gelu", "approximate", "tanh", "gelu"), ("LayerNormalization", "epsilon", 0.5, "ln")],
)
def test_hand_edited_node_names_its_module_first(net, op, attr, value, module):
    model, x, proto = net
    result = _run(model, onnx_candidate(model, [(x,)], _edited(proto, op, attr, value)))
    first = result.first_divergence
    assert first["tag"] == output_tag(module)
    assert first["status"] == "mismatch"
    rows = _rows(result)
    assert rows["checker_conv"]["status"] in PASSING
    # the edited module's input still agrees: the divergence starts inside it
    assert rows[f"checker_{module}_input_0"]["status"] in PASSING


def test_fused_values_are_not_observable_with_enable_all():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = ConvRelu().eval()
    x = torch.rand(1, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    off = _rows(_run(model, onnx_candidate(model, [(x,)], ort_optimization="disable_all")))
    assert off["checker_conv"]["status"] in PASSING
    result = _run(model, onnx_candidate(model, [(x,)], ort_optimization="enable_all"))
    rows = _rows(result)
    conv = rows["checker_conv"]
    # onnxruntime fuses Conv + Relu: the conv's output never exists in the deployed graph
    assert conv["status"] == "skipped"
    assert "fused away" in conv["message"]
    assert rows["checker_model"]["status"] in PASSING
    assert not [r for r in rows.values() if r["status"].startswith("missing")]


def test_a_graph_without_name_scopes_still_compares_its_outputs(net):
    model, x, proto = net
    import onnx

    bare = onnx.ModelProto()
    bare.CopyFrom(proto)
    for node in bare.graph.node:
        del node.metadata_props[:]
    result = _run(model, onnx_candidate(model, [(x,)], bare))
    rows = _rows(result)
    assert rows["checker_model"]["status"] in PASSING
    assert rows["checker_conv"]["status"] == "skipped"
    assert "name scopes" in rows["checker_conv"]["message"]


def test_register_values_marks_what_the_engine_did_not_return():
    class Rec:
        step = 0

        def __init__(self):
            self.got, self.skipped = {}, {}

        def register(self, tag, value):
            self.got[tag] = value

        def mark_not_observable(self, tag, reason):
            self.skipped[tag] = reason

    nmap = NameMap(values={"checker_a": "va", "checker_b": "vb"}, not_observable={"checker_c": "x"})
    rec = Rec()
    register_values(rec, {"va": np.ones(2)}, nmap)
    assert list(rec.got) == ["checker_a"]
    assert rec.skipped == {"checker_b": "the engine returned no value named 'vb'", "checker_c": "x"}
    assert ProbedTag("t", "m", "output", "output", 0, 0, (1,), "torch.float32").shape == (1,)


def test_vae_tiny_export_compares_every_leaf_module_the_exporter_keeps():
    pytest.importorskip("diffusers")
    pytest.importorskip("skimage")
    from pipelines.targets import vae_tiny

    reference = vae_tiny.make_model()
    images = vae_tiny.photographs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = export(reference, (images,))
        result = _run(reference, onnx_candidate(reference, [(images,)], proto))
    rows = _rows(result)
    kept = _kept_leaves(reference, proto)
    leaves = {n for n, m in reference.named_modules() if n and not list(m.children())}
    dropped = leaves - kept
    # only identities lose their nodes: the dropouts (eval) and the attention's output dropout
    assert {type(dict(reference.named_modules())[n]).__name__ for n in dropped} == {"Dropout"}
    compared = {
        r["module"] for r in rows.values() if r["kind"] == "output" and r["status"] in PASSING
    } | {r["module"] for r in rows.values() if r["kind"] == "output" and r["status"] == "mismatch"}
    assert kept <= compared
    assert len(compared & leaves) >= len(kept)
    assert not [r for r in rows.values() if r["status"].startswith("missing")]
    # the decoded images agree within float32 rounding of the reference (|x| <= ~1)
    assert rows["checker_model_output_sample"]["max_abs_diff"] < 1e-4


def test_exported_program_of_a_users_model(net):
    model, x, _ = net
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, (x,))
        result = _run(model, onnx_candidate(model, [(x,)], program))
    assert result.passed
    assert _rows(result)["checker_gelu"]["status"] in PASSING


def test_observing_that_changes_the_outputs_is_reported(net):
    model, x, proto = net
    cand = onnx_candidate(model, [(x,)], proto)
    marked = cand.engine.marked

    class Shifted:  # a marked graph whose outputs moved by 1e-3 (what a blocked fusion can do)
        def run(self, names, feeds):
            values = marked.run(names, feeds)
            out = set(cand.engine.outputs)
            pairs = zip(names, values, strict=True)
            return [v + np.float32(1e-3) if n in out else v for n, v in pairs]

    cand.engine.marked = Shifted()
    with pytest.warns(UserWarning, match="observing changed the result"):
        result = _run(model, cand)
    assert result.settings["observing_changed_result"] is True
    assert result.settings["observing_max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    # the verdict on the model output is the deployed graph's, which did not move
    assert _rows(result)["checker_model"]["status"] in PASSING
