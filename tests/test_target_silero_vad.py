"""silero-vad: TorchScript vs onnxruntime on real weights (identity and 1-ULP:
test_targets_contract.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import run_quiet as run

from parity_tracker.builtin_targets import silero_vad

pytestmark = pytest.mark.slow


def stream(model, windows):
    """(probabilities, states) per chunk, each side feeding its own state back."""
    state, probs, states = torch.zeros(2, 1, 128), [], []
    with torch.no_grad():
        for w in windows:
            prob, state = model(w, state)
            probs.append(np.asarray(prob, dtype=np.float64))
            states.append(np.asarray(state, dtype=np.float64))
    return probs, states


def test_onnxruntime_candidate_registers_by_hand_and_reports_the_output_error():
    case = silero_vad.build({})
    assert not isinstance(case.candidate, torch.nn.Module)
    assert case.settings["implementation"] == "onnxruntime"
    assert case.candidate.path.name == "silero_vad.onnx"
    windows = silero_vad.chunk_windows(silero_vad.synth_speech())
    ref_probs, ref_states = stream(case.reference, windows)
    cand_probs, cand_states = stream(case.candidate, windows)
    expected = max(
        float(np.abs(a - b).max())
        for a, b in zip(ref_probs + ref_states, cand_probs + cand_states, strict=True)
    )
    # real weights on speech-like input: the bursts are detected, the onset silence is not
    assert ref_probs[0].item() < 0.5 and max(p.item() for p in ref_probs[4:12]) > 0.9
    result = run(case)
    s = result.summary
    assert s["mode"] == "allclose" and "onnxruntime" in s["mode_reason"]
    got = s["output_max_abs_diff"]
    assert got is not None and not math.isnan(got)
    assert got == pytest.approx(expected, rel=1e-6)
    assert 0 < got < 1e-4
    kinds = {r["tag"]: r for r in result.modules.to_pylist() if r["step"] == 3}
    assert set(kinds) == {
        f"checker_model_{x}" for x in ("input_0", "input_1", "output_0", "output_1")
    }


@pytest.mark.parametrize("candidate", ["onnx-op15", "onnx-op18-ifless"])
def test_other_onnx_exports_are_close(candidate):
    case = silero_vad.build({"candidate": candidate})
    assert case.candidate.path.name == silero_vad.ONNX_FILES[candidate]
    s = run(case).summary
    assert s["mode"] == "allclose"
    assert s["output_max_abs_diff"] is not None and 0 < s["output_max_abs_diff"] < 1e-4
