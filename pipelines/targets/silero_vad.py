"""``silero-vad``: Silero VAD's TorchScript model against its ONNX export run by onnxruntime.

Both models ship in the ``silero-vad`` wheel (``silero_vad/data/``) with the same trained
weights: a real pair of engines. Reference: ``silero_vad.jit`` (TorchScript, its 16 kHz
``_model``). Candidate, by the ``candidate`` setting: ``onnx`` (``silero_vad.onnx``, opset 16),
``onnx-op15`` (``silero_vad_16k_op15.onnx``), ``onnx-op18-ifless``
(``silero_vad_op18_ifless.onnx``), each run by onnxruntime's CPU provider with one thread; or
``torchscript`` (a second load of the reference file: the identity candidate).

The reference is a small ``nn.Module`` around the TorchScript network (TorchScript takes no
Python hooks, so the scripted model is kept out of ``named_modules()``): the runner hooks it
like any PyTorch model, and its root registers per call ``checker_model_input_0`` (the
576-sample window: 512 new samples after 64 of context, the silero-vad streaming protocol as in
its ``OnnxWrapper``), ``checker_model_input_1`` (the LSTM state in, ``(2, 1, 128)``),
``checker_model_output_0`` (speech probability ``(1, 1)``) and ``checker_model_output_1``
(the state out). The onnxruntime candidate is no module: its drive registers the same tags
by hand through ``rec.register`` (names from :mod:`parity_tracker.capture`, the seed's way for
a foreign engine). One step per chunk; each side feeds its own state back.

Input: :func:`synth_speech`, a deterministic speech-like signal (voiced bursts with gliding
pitch and formant-weighted harmonics under attack/decay envelopes, plus seeded noise) of
32 chunks (1.024 s at 16 kHz).
"""

from __future__ import annotations

from typing import Any

NAME = "silero-vad"
DESCRIPTION = (
    "Silero VAD (real trained weights, from the silero-vad wheel): TorchScript reference "
    "against the shipped ONNX model run by onnxruntime, streaming 32 chunks of synthetic speech"
)
SETTINGS: dict[str, list[str]] = {
    "candidate": ["onnx", "onnx-op15", "onnx-op18-ifless", "torchscript"],
}


def build(settings: dict[str, Any] | None = None) -> Any:
    """Build the silero-vad case (``_silero_vad.build``; imports torch and the model code)."""
    from parity_tracker.builtin_targets import _silero_vad

    return _silero_vad.build(settings)


def __getattr__(name: str) -> Any:
    """Every other name of the target (model, data, helpers) from ``_silero_vad``, loaded on use."""
    if name.startswith("__"):
        raise AttributeError(name)
    from parity_tracker.builtin_targets import _silero_vad

    return getattr(_silero_vad, name)
