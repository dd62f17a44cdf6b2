"""vae-tiny: the bundled photographs, a bf16 cell (identity and 1-ULP: the contract test)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from helpers import run_quiet as run

from parity_tracker.builtin_targets import vae_tiny

pytestmark = pytest.mark.slow


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


def test_bf16_cell_reports_the_output_error():
    case = vae_tiny.build({"quantization": "bf16"})
    assert case.settings["dtype"] == "bfloat16"
    x = case.inputs[0]
    twin = copy.deepcopy(case.reference).to(torch.bfloat16)  # PyTorch at bf16, built here
    with torch.no_grad():
        ref = case.reference(x.clone()).sample.double().numpy()
        cand = case.candidate(x.clone()).sample
        at_bf16 = twin(x.clone().bfloat16()).sample.double().numpy()
    assert cand.dtype == torch.bfloat16
    expected = float(np.abs(cand.double().numpy() - at_bf16).max())
    s = run(case).summary
    assert s["mode"] == "budget"  # a cast: error budget (issue 15)
    # the twin is the run's reference side (run.budget, 2026-12-01): the output is compared
    # with PyTorch at bf16 (it was compared with the fp32 reference's forward)
    got = s["output_max_abs_diff"]
    assert got is not None and not math.isnan(got)
    assert got == pytest.approx(expected, rel=1e-6, abs=0)
    assert 0 < float(np.abs(cand.double().numpy() - ref).max()) < 0.5  # the cast's own error
