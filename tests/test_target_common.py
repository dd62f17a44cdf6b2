"""Fast tests of the built-in targets' shared helpers and module contract (no model builds)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from parity_tracker.builtin_targets import _common
from parity_tracker.errors import InputError
from parity_tracker.pipeline.targets import resolve_target, target_names

ENGINE = {"candidate": ["torch", "onnxruntime"], "ort_optimization": ["disable_all", "enable_all"]}
COMPILE = {"implementation": ["same", "inductor", "eager"]}
SETTINGS_OF = {
    "digits-cnn": {
        "quantization": ["none", "fp16", "bf16", "int8"],
        "memory_format": ["contiguous", "channels_last"],
        **ENGINE,
    },
    "vae-tiny": {"quantization": ["none", "fp16", "bf16"], **COMPILE, **ENGINE},
    "llama-tiny": {
        "cache": ["off", "kv"],
        "attention": ["eager", "sdpa"],
        "quantization": ["none", "bf16"],
        **COMPILE,
        **ENGINE,
        "distributed": ["none", "tp2", "tp4"],
    },
    "flux-tiny": {"cache": ["off", "first_block"]},
    "silero-vad": {"candidate": ["onnx", "onnx-op15", "onnx-op18-ifless", "torchscript"]},
}


@pytest.mark.parametrize("name", sorted(SETTINGS_OF))
def test_target_module_contract(name):
    target = resolve_target(name)
    assert target.source == "builtin"
    module = importlib.import_module(target.build.__module__)
    assert name == module.NAME
    assert isinstance(module.DESCRIPTION, str) and len(module.DESCRIPTION) > 20
    assert SETTINGS_OF[name] == module.SETTINGS
    assert callable(module.build)


def test_builtin_names_cover_every_module():
    assert [n for n in target_names() if resolve_target(n).source == "builtin"] == sorted(
        SETTINGS_OF
    )
    with pytest.raises(InputError, match="registered targets: digits-cnn"):
        resolve_target("resnet")


def test_importing_targets_does_not_import_heavy_libraries():
    code = (
        "import sys\n"
        "from parity_tracker.pipeline.targets import list_targets\n"
        "assert len(list_targets()) >= 5\n"
        "heavy = [m for m in ('transformers', 'diffusers', 'onnxruntime', 'sklearn', 'skimage',"
        " 'silero_vad', 'mlflow') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_resolve_settings_defaults_and_values():
    allowed = {"quantization": ["none", "fp16"], "cache": ["off", "kv"]}
    assert _common.resolve_settings("t", allowed, None) == {"quantization": "none", "cache": "off"}
    assert _common.resolve_settings("t", allowed, {"cache": "kv"}) == {
        "quantization": "none",
        "cache": "kv",
    }
    # the recorded target/device keys may be fed back
    got = _common.resolve_settings("t", allowed, {"target": "t", "device": "cpu"})
    assert got == {"quantization": "none", "cache": "off"}


@pytest.mark.parametrize(
    ("settings", "pattern"),
    [
        ({"quantization": "int4"}, r"quantization.*'int4'.*allowed values: none, fp16"),
        ({"quantisation": "fp16"}, r"no setting 'quantisation'.*quantization \(none\|fp16\)"),
        ({"device": "cuda"}, r"'device'='cuda'.*allowed: 'cpu'"),
        ({"target": "other"}, r"'target'='other'"),
    ],
)
def test_resolve_settings_rejects_bad_input(settings, pattern):
    with pytest.raises(InputError, match=pattern):
        _common.resolve_settings("t", {"quantization": ["none", "fp16"]}, settings)


def test_recorded_settings_has_every_key():
    out = _common.recorded_settings(
        "t", {"cache": "kv"}, candidate="c", dtype="float32", implementation="same"
    )
    assert out == {
        "target": "t",
        "device": "cpu",
        "quantization": "none",
        "cache": "kv",
        "candidate": "c",
        "dtype": "float32",
        "implementation": "same",
    }
    with pytest.raises(ValueError, match="implementation"):
        _common.recorded_settings("t", {}, candidate="c", dtype="float32")


def test_sequence_align_slices_the_recompute_on_the_query_dimension():
    ref = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)  # (B, T, H)
    cand = torch.zeros(2, 1, 3)
    r, c = _common.sequence_align("t", ref, cand)
    np.testing.assert_array_equal(r.numpy(), ref.numpy()[:, 4:5, :])
    assert c is cand
    weights = torch.rand(1, 4, 6, 6)  # (B, heads, query, key)
    r, _ = _common.sequence_align("t", weights, torch.zeros(1, 4, 1, 6))
    np.testing.assert_array_equal(r.numpy(), weights.numpy()[:, :, 5:6, :])
    ids = torch.tensor([[7, 8, 9]])  # (B, T)
    assert _common.sequence_align("t", ids, torch.tensor([[9]]))[0].tolist() == [[9]]
    pos = torch.arange(6)  # cache_position (T,)
    assert _common.sequence_align("t", pos, torch.tensor([5]))[0].tolist() == [5]


@pytest.mark.parametrize(
    ("ref_shape", "cand_shape"),
    [
        ((2, 5, 3), (2, 5, 3)),  # same shapes: keep
        ((2, 5, 3), (2, 1, 4)),  # two dimensions differ: a real shape bug
        ((2, 5, 3), (2, 6, 3)),  # candidate longer
        ((1, 4, 6, 6), (1, 4, 6, 1)),  # keys dimension differs, not queries
        ((2, 5, 3), (2, 5)),  # ranks differ
    ],
)
def test_sequence_align_leaves_other_pairs(ref_shape, cand_shape):
    assert _common.sequence_align("t", torch.zeros(ref_shape), torch.zeros(cand_shape)) is None


def test_nudge_one_ulp_moves_exactly_one_element_by_one_ulp():
    w = torch.tensor([[0.5, -3.0], [1.0, 2.0]])
    before = w.clone()
    i = _common.nudge_one_ulp(w)
    assert i == 1  # largest magnitude: -3.0
    changed = (w != before).view(-1).nonzero().view(-1).tolist()
    assert changed == [1]
    # float32 spacing at |x| in [2, 4) is 2**-22; nextafter(-3, +inf) = -3 + 2**-22
    assert float(w.view(-1)[1]) == -3.0 + 2.0**-22
    h = torch.tensor([1.0], dtype=torch.float16)
    _common.nudge_one_ulp(h, 0)
    assert float(h[0]) == 1.0 + 2.0**-10


def test_cast_inputs_pre_hook_converts_floating_inputs_only():
    seen = {}

    class Probe(torch.nn.Module):
        def forward(self, x, idx):
            seen["x"], seen["idx"] = x, idx
            return x

    m = _common.cast_inputs(Probe(), dtype=torch.float16, memory_format=torch.channels_last)
    m(torch.ones(1, 3, 2, 2), torch.tensor([1, 2]))
    assert seen["x"].dtype == torch.float16
    assert seen["x"].is_contiguous(memory_format=torch.channels_last)
    assert seen["idx"].dtype == torch.int64


def test_atomic_save_leaves_only_the_final_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    _common.atomic_save({"w": torch.ones(3)}, path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(3))


def test_cache_dir_honours_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_TRACKER_CACHE_DIR", str(tmp_path / "c"))
    assert _common.cache_dir() == tmp_path / "c"
    assert (tmp_path / "c").is_dir()
    monkeypatch.delenv("PARITY_TRACKER_CACHE_DIR")
    monkeypatch.chdir(tmp_path)
    assert _common.cache_dir() == tmp_path / ".parity" / "cache"


def test_seeded_restores_the_callers_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with _common.seeded(0):
        inside = torch.rand(3)
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(0)
    assert torch.equal(torch.rand(3), inside)


def test_silero_synthetic_speech_is_deterministic_and_bounded():
    silero = importlib.import_module("parity_tracker.builtin_targets.silero_vad")
    a, b = silero.synth_speech(), silero.synth_speech()
    assert a.shape == (1, 32 * 512) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert float(a.abs().max()) <= 1.0
    x = a.numpy()[0].astype(np.float64)
    t = np.arange(x.size) / 16_000
    loud = np.sqrt(np.mean(x[(t > 0.15) & (t < 0.35)] ** 2))
    quiet = np.sqrt(np.mean(x[(t > 0.45) & (t < 0.6)] ** 2))
    assert loud > 20 * quiet  # bursts stand out of the noise floor (0.003 rms)
    windows = silero.chunk_windows(a)
    assert len(windows) == 32 and all(w.shape == (1, 576) for w in windows)
    np.testing.assert_array_equal(windows[1].numpy()[0, :64], a.numpy()[0, 448:512])
    np.testing.assert_array_equal(windows[0].numpy()[0, :64], np.zeros(64, np.float32))
