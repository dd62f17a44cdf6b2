"""The target registry: built-ins, entry points, module:function specs, settings validation."""

from __future__ import annotations

import subprocess
import sys
import types
from importlib.metadata import EntryPoint

import pytest

from parity_tracker.errors import InputError
from parity_tracker.pipeline import targets as T


def test_builtin_resolves_by_name_with_schema():
    t = T.resolve_target("digits-cnn")
    assert t.name == "digits-cnn" and t.source == "builtin"
    assert t.settings["quantization"] == ["none", "fp16", "bf16", "int8"]
    assert t.defaults() == {
        "quantization": "none", "memory_format": "contiguous", "candidate": "torch",
        "ort_optimization": "disable_all",
    }  # fmt: skip
    assert set(T.target_names()) >= {"digits-cnn", "vae-tiny", "llama-tiny", "flux-tiny"}


def test_listing_builtins_imports_no_heavy_library():
    code = (
        "import sys; from parity_tracker.pipeline.targets import list_targets; "
        "ts = list_targets(); "
        "heavy = [m for m in ('transformers', 'diffusers', 'onnxruntime', 'sklearn', 'skimage',"
        " 'mlflow') if m in sys.modules]; print(len(ts), heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    count, heavy = out.stdout.split(" ", 1)
    assert int(count) >= 4 and heavy.strip() == "[]", out.stdout


def test_validate_fills_defaults_and_names_allowed_values():
    t = T.resolve_target("digits-cnn")
    assert t.validate({"quantization": "int8"}) == {
        "quantization": "int8", "memory_format": "contiguous", "candidate": "torch",
        "ort_optimization": "disable_all",
    }  # fmt: skip
    with pytest.raises(InputError, match=r"quantization='fp8'.*none, fp16, bf16, int8"):
        t.validate({"quantization": "fp8"})
    with pytest.raises(InputError, match=r"unknown setting 'cache'.*quantization, memory_format"):
        t.validate({"cache": "kv"})


def test_spec_targets_function_and_module():
    t = T.resolve_target("cli_targets:tiny")
    assert t.source == "spec" and t.name == "cli_targets:tiny"
    assert t.settings == {"perturb": ["none", "fc2"], "quantization": ["none", "bf16"]}
    case = t.build_case(t.validate({}))
    assert case.settings["target"] == "cli_targets:tiny" and case.settings["perturb"] == "none"
    assert case.settings["candidate"] == "copy"  # the builder's own value is kept
    free = T.resolve_target("cli_targets:broken")  # no schema: settings pass through
    assert free.validate({"anything": "goes"}) == {"anything": "goes"}
    with pytest.raises(InputError, match="has no attribute 'nope'"):
        T.resolve_target("cli_targets:nope")
    with pytest.raises(InputError, match="cannot import module"):
        T.resolve_target("not_a_module_xyz:build")


def test_entry_point_targets(monkeypatch):
    mod = types.ModuleType("fake_engine_targets")
    mod.NAME, mod.DESCRIPTION = "ignored-name", "an engine's own pair"
    mod.SETTINGS = {"precision": ["fp32", "fp8"]}
    mod.build = lambda settings: settings
    monkeypatch.setitem(sys.modules, "fake_engine_targets", mod)
    eps = [
        *T._entry_points(),  # the built-ins, registered in this project's pyproject.toml
        EntryPoint("engine-pair", "fake_engine_targets", T.ENTRY_POINT_GROUP),
        EntryPoint("engine-fn", "cli_targets:tiny", T.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(T, "_entry_points", lambda: eps)
    t = T.resolve_target("engine-pair")
    assert (t.name, t.source, t.settings) == ("engine-pair", "entry-point", mod.SETTINGS)
    assert T.resolve_target("engine-fn").settings["perturb"] == ["none", "fc2"]
    names = [x.name for x in T.list_targets()]
    assert "engine-pair" in names and "engine-fn" in names and "digits-cnn" in names
    assert "engine-pair" in T.target_names()


def test_unknown_target_lists_registered():
    with pytest.raises(
        InputError, match=r"unknown target 'nope'.*digits-cnn.*module.path:function"
    ):
        T.resolve_target("nope")


def test_unknown_target_with_nothing_registered_says_to_reinstall(monkeypatch):
    monkeypatch.setattr(T, "_entry_points", lambda: [])
    with pytest.raises(InputError, match=r"registered targets: \(none\).*pip install -e \."):
        T.resolve_target("digits-cnn")


def test_entry_point_that_does_not_import_names_it(monkeypatch):
    ep = EntryPoint("ghost", "no_such_module_xyz", T.ENTRY_POINT_GROUP)
    monkeypatch.setattr(T, "_entry_points", lambda: [ep])
    with pytest.raises(InputError, match=r"target 'ghost': cannot import 'no_such_module_xyz'"):
        T.resolve_target("ghost")


def test_parse_assignments():
    assert T.parse_assignments(["a=1", " b = x=y "]) == {"a": "1", "b": "x=y"}
    for bad in (["novalue"], ["=1"]):
        with pytest.raises(InputError, match="KEY=VALUE"):
            T.parse_assignments(bad)
