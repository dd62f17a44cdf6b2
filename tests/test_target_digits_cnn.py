"""digits-cnn: trained on real data, quantized and channels-last cells (identity and 1-ULP:
test_targets_contract.py)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from helpers import run_quiet as run

from parity_tracker.builtin_targets import digits_cnn
from parity_tracker.errors import InputError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("digits-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PARITY_TRACKER_CACHE_DIR", str(path))
        yield path


def test_training_is_deterministic_cached_and_accurate(cache_dir):
    case = digits_cnn.build({})
    files = sorted(p.name for p in cache_dir.iterdir() if p.suffix == ".pt")
    assert len(files) == 1 and files[0].startswith("digits-cnn-")
    mtime = (cache_dir / files[0]).stat().st_mtime_ns
    digits_cnn.build({"quantization": "fp16"})  # second build: served from the cache
    assert (cache_dir / files[0]).stat().st_mtime_ns == mtime
    # retraining by the recipe gives the cached weights bit for bit
    x_tr, y_tr, x_te, y_te = digits_cnn.load_data()
    fresh = digits_cnn.train(x_tr, y_tr).state_dict()
    for name, value in case.reference.state_dict().items():
        assert torch.equal(fresh[name], value), name
    # held-out accuracy, computed here with numpy from the logits
    with torch.no_grad():
        logits = case.reference(x_te).numpy()
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_te.numpy()))
    assert accuracy > 0.9
    assert f"{accuracy:.4f}" in case.notes
    assert case.inputs[0].shape == (64, 1, 8, 8)
    assert torch.equal(case.inputs[0], x_te[:64])


def test_default_case_records_every_setting():
    # the identity run itself is checked for every target in test_targets_contract.py
    case = digits_cnn.build({})
    assert case.settings == {
        "target": "digits-cnn",
        "device": "cpu",
        "quantization": "none",
        "cache": "off",
        "memory_format": "contiguous",
        "candidate": "copy",
        "dtype": "float32",
        "implementation": "same",
    }


@pytest.mark.parametrize(
    ("settings", "dtype"),
    [
        ({"quantization": "fp16"}, torch.float16),
        ({"quantization": "bf16"}, torch.bfloat16),
        ({"quantization": "int8"}, torch.float32),
    ],
)
def test_quantized_cells_report_the_output_error(settings, dtype):
    case = digits_cnn.build(settings)
    x = case.inputs[0]
    cast = dtype != torch.float32
    # a cast's reference side is the twin (run.budget, 2026-12-01): PyTorch at that dtype,
    # built here; int8 (allclose, no twin) is compared with the fp32 reference
    side = copy.deepcopy(case.reference).to(dtype) if cast else case.reference
    with torch.no_grad():
        expected_ref = case.reference(x.clone()).numpy().astype(np.float64)
        side_out = side(x.clone().to(dtype)).float().numpy().astype(np.float64)
        cand_out = case.candidate(x.clone())
    assert cand_out.dtype == dtype
    cand64 = cand_out.float().numpy().astype(np.float64)
    expected = float(np.abs(cand64 - side_out).max())
    s = run(case).summary
    # a cast is judged against PyTorch's own error (budget, issue 15); int8 weights have no twin
    assert s["mode"] == ("budget" if cast else "allclose")
    assert "quantization" in s["mode_reason"]
    got = s["output_max_abs_diff"]
    assert got is not None and not math.isnan(got)
    assert got == pytest.approx(expected, rel=1e-6, abs=0)
    # logits of magnitude ~10: a real but bounded quantization error against fp32
    assert 0 < float(np.abs(cand64 - expected_ref).max()) < 1.0
    if not cast:
        assert s["output_sqnr_db"] is not None and 20 < s["output_sqnr_db"] < 120


def test_int8_candidate_uses_dynamic_int8_linear_layers():
    case = digits_cnn.build({"quantization": "int8"})
    kinds = {n: type(m).__module__ for n, m in case.candidate.named_modules()}
    assert "quantized.dynamic" in kinds["fc1"] and "quantized.dynamic" in kinds["fc2"]
    assert kinds["conv1"] == "torch.nn.modules.conv"
    assert case.candidate.fc1.weight().dtype == torch.qint8
    assert case.settings["dtype"] == "qint8"
    assert "quantize_dynamic" in case.notes


def test_channels_last_cell_runs_the_candidate_in_nhwc():
    case = digits_cnn.build({"memory_format": "channels_last"})
    assert case.candidate.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert case.settings["implementation"] == "same"
    s = run(case).summary
    assert s["mode"] == "equal"
    # a layout change alone: the output error is reported (measured 0 on torch 2.13 x86)
    assert s["output_max_abs_diff"] is not None and not math.isnan(s["output_max_abs_diff"])


def test_bad_settings_name_the_setting_and_the_allowed_values():
    with pytest.raises(InputError, match=r"quantization.*'int4'.*none, fp16, bf16, int8"):
        digits_cnn.build({"quantization": "int4"})
    with pytest.raises(InputError, match=r"memory_format \(contiguous\|channels_last\)"):
        digits_cnn.build({"layout": "nhwc"})
