"""vae-tiny: identity bitwise, 1-ULP localization at the seed's downsampler, a bf16 cell."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from parity_tracker.builtin_targets import _common, vae_tiny
from parity_tracker.run import run_case
from parity_tracker.tensor_checker import DumpMode

pytestmark = pytest.mark.slow


def run(case):
    return run_case(case, dump_mode=DumpMode.NOT)


def test_inputs_are_the_bundled_photographs():
    from skimage import data

    x = vae_tiny.photographs()
    assert x.shape == (3, 3, 64, 64) and x.dtype == torch.float32
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0
    # astronaut is 512x512 (no crop): its mean colour survives the anti-aliased resize
    astronaut = data.astronaut().astype(np.float64) / 255.0 * 2 - 1
    np.testing.assert_allclose(
        x[0].double().mean(dim=(1, 2)).numpy(), astronaut.mean(axis=(0, 1)), atol=2e-3
    )


def test_identity_candidate_is_bitwise_equal_with_the_seeds_module_names():
    case = vae_tiny.build({})
    assert case.settings["candidate"] == "copy" and case.settings["implementation"] == "same"
    result = run(case)
    s = result.summary
    assert s["mode"] == "equal" and s["passed"] and s["output_equal"]
    assert s["counts"]["equal"] == s["tensors_compared"]
    modules = set(result.modules.column("module").to_pylist())
    assert {
        "encoder.conv_in",
        "encoder.down_blocks.0.downsamplers.0",
        "decoder.conv_out",
    } <= modules


def test_one_ulp_in_the_downsampler_is_the_first_divergence():
    case = vae_tiny.build({})
    name = "encoder.down_blocks.0.downsamplers.0.conv"
    _common.nudge_one_ulp(case.candidate.get_submodule(name).weight)
    result = run(case)
    first = result.summary["first_divergence"]
    assert first["module"] == name
    rows = {r["tag"]: r for r in result.modules.to_pylist()}
    assert rows[f"checker_{name}"]["status"] == "mismatch"
    assert rows["checker_encoder.down_blocks.0.resnets.0"]["status"] == "equal"
    assert rows[f"checker_{name}.weight"]["mismatch_count"] == 1


def test_bf16_cell_reports_the_output_error():
    case = vae_tiny.build({"quantization": "bf16"})
    assert case.settings["dtype"] == "bfloat16"
    x = case.inputs[0]
    with torch.no_grad():
        ref = case.reference(x.clone()).sample.double().numpy()
        cand = case.candidate(x.clone()).sample
    assert cand.dtype == torch.bfloat16
    expected = float(np.abs(cand.double().numpy() - ref).max())
    s = run(case).summary
    assert s["mode"] == "allclose"
    got = s["output_max_abs_diff"]
    assert got is not None and not math.isnan(got)
    assert got == pytest.approx(expected, rel=1e-6)
    assert 0 < got < 0.5
