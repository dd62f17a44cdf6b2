"""``digits-cnn``: a small CNN trained on scikit-learn's handwritten digits, held-out digits in.

Reference: the trained fp32 model. Candidate: a copy of it (one state_dict), changed only by the
settings: ``quantization`` casts the copy to fp16/bf16 (inputs cast by a pre-hook) or makes its
Linear layers dynamic int8 (``torch.ao.quantization.quantize_dynamic``: int8 weights per tensor,
activations quantized per batch at run time, fp32 in and out; the convolutions stay fp32);
``memory_format=channels_last`` converts the copy and its inputs to NHWC (a layout-only change,
so ``implementation`` stays ``same`` and the auto mode stays ``equal``: the seed's class-B check).

The model is trained deterministically (seeded, one thread, fixed recipe) in about a second and
cached under ``./.parity/cache/`` (or ``$PARITY_TRACKER_CACHE_DIR``) keyed by a hash of the recipe,
the data and the torch version; the checkpoint is written atomically under a file lock.
"""

from __future__ import annotations

from typing import Any

from parity_tracker.builtin_targets import _settings

NAME = "digits-cnn"
DESCRIPTION = (
    "small CNN trained on scikit-learn digits (8x8 handwritten digits), evaluated on 64 held-out "
    "images; candidate = a copy cast to fp16/bf16, dynamic int8 Linear layers, or channels_last"
)
SETTINGS: dict[str, list[str]] = {
    "quantization": ["none", "fp16", "bf16", "int8"],
    "memory_format": ["contiguous", "channels_last"],
    "candidate": _settings.ENGINES,
    "ort_optimization": _settings.ORT_OPTIMIZATIONS,
}


def build(settings: dict[str, Any] | None = None) -> Any:
    """Build the digits-cnn case (``_digits_cnn.build``; imports torch and the model code)."""
    from parity_tracker.builtin_targets import _digits_cnn

    return _digits_cnn.build(settings)


def __getattr__(name: str) -> Any:
    """Every other name of the target (model, data, helpers) from ``_digits_cnn``, loaded on use."""
    if name.startswith("__"):
        raise AttributeError(name)
    from parity_tracker.builtin_targets import _digits_cnn

    return getattr(_digits_cnn, name)
