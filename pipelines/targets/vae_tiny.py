"""``vae-tiny``: diffusers' ``AutoencoderKL`` from a small config, on real photographs.

Reference: the model built from :data:`CONFIG` with seeded init (no download). Candidate: a copy
(one state_dict) cast to fp16/bf16 with its input cast by a pre-hook, or the plain copy for
``quantization=none``. The module names are diffusers' own — ``encoder.conv_in``,
``encoder.down_blocks.0.downsamplers.0``, ``decoder.conv_out`` — the names of the seed's example.

Inputs: three of scikit-image's bundled photographs (astronaut, chelsea, coffee), centre
cropped to a square, resized to 64×64 with anti-aliasing and scaled to [-1, 1]:
``(3, 3, 64, 64)`` float32, NCHW. The forward encodes, takes the posterior's mode
(``sample_posterior=False``, deterministic) and decodes.
"""

from __future__ import annotations

from typing import Any

from parity_tracker.builtin_targets import _settings

NAME = "vae-tiny"
DESCRIPTION = (
    "diffusers AutoencoderKL (2 down/up blocks, 16/32 channels, seeded init) encoding and "
    "decoding three scikit-image photographs at 64x64; candidate = a copy cast to fp16/bf16"
)
SETTINGS: dict[str, list[str]] = {
    "quantization": ["none", "fp16", "bf16"],
    "implementation": _settings.IMPLEMENTATIONS,
    "candidate": _settings.ENGINES,
    "ort_optimization": _settings.ORT_OPTIMIZATIONS,
}


def build(settings: dict[str, Any] | None = None) -> Any:
    """Build the vae-tiny case (``_vae_tiny.build``; imports torch and the model code)."""
    from parity_tracker.builtin_targets import _vae_tiny

    return _vae_tiny.build(settings)


def __getattr__(name: str) -> Any:
    """Every other name of the target (model, data, helpers) from ``_vae_tiny``, loaded on use."""
    if name.startswith("__"):
        raise AttributeError(name)
    from parity_tracker.builtin_targets import _vae_tiny

    return getattr(_vae_tiny, name)
