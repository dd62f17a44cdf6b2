"""The vae-tiny target's code (imports torch at import time).

Its metadata (``NAME``, ``DESCRIPTION``, ``SETTINGS``) and the module docstring are in
``parity_tracker.builtin_targets.vae_tiny``, the entry point, which reads without torch and loads
this module on first use of ``build`` or any other name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from parity_tracker.builtin_targets import _common
from parity_tracker.builtin_targets.vae_tiny import DESCRIPTION as DESCRIPTION
from parity_tracker.builtin_targets.vae_tiny import NAME as NAME
from parity_tracker.builtin_targets.vae_tiny import SETTINGS as SETTINGS
from parity_tracker.pipeline.case import ParityCase

#: AutoencoderKL config (diffusers' argument names); the smallest that keeps the real structure:
#: two down blocks (so one downsampler), a mid block with attention, two up blocks. Every
#: activation is compared, so the channel count sets the run time (16/32: ~0.2M floats each).
CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D", "DownEncoderBlock2D"),
    "up_block_types": ("UpDecoderBlock2D", "UpDecoderBlock2D"),
    "block_out_channels": (16, 32),
    "layers_per_block": 1,
    "latent_channels": 4,
    "norm_num_groups": 8,
    "sample_size": 64,
}
SEED = 0
IMAGES = ("astronaut", "chelsea", "coffee")
SIZE = 64


def photographs(names: tuple[str, ...] = IMAGES, size: int = SIZE) -> torch.Tensor:
    """scikit-image's bundled photographs as a batch ``(N, 3, size, size)`` float32 in [-1, 1].

    Each RGB image is centre-cropped to a square and resized with anti-aliasing
    (``skimage.transform.resize``, which returns floats in [0, 1]); then ``x * 2 - 1``.
    """
    from skimage import data
    from skimage.transform import resize

    batch = []
    for name in names:
        img = getattr(data, name)()[..., :3]
        h, w = img.shape[:2]
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        square = img[top : top + side, left : left + side]
        small = resize(square, (size, size), anti_aliasing=True, preserve_range=False)
        batch.append(np.transpose(small.astype(np.float32), (2, 0, 1)))
    return torch.from_numpy(np.stack(batch) * 2.0 - 1.0).float()


def make_model() -> torch.nn.Module:
    """The reference AutoencoderKL from :data:`CONFIG`, seeded init, eval mode, fp32."""
    from diffusers import AutoencoderKL

    with _common.seeded(SEED):
        model = AutoencoderKL(**CONFIG)
    model.eval().requires_grad_(False)
    return model


def build(settings: dict[str, Any] | None = None) -> ParityCase:
    """Build the vae-tiny case.

    Args:
        settings: ``quantization`` (none | fp16 | bf16); missing keys take the first value.

    Returns:
        A single-forward :class:`ParityCase`, ``inputs=(images,)`` with ``images``
        ``(3, 3, 64, 64)`` float32 in [-1, 1].

    Raises:
        InputError: an unknown setting or value.
    """
    chosen = _common.resolve_settings(NAME, SETTINGS, settings)
    onnx, record = _common.engine_settings(NAME, chosen, quantization="none", implementation="same")
    reference = make_model()
    if onnx:
        return _onnx_case(reference, photographs(), chosen, record)
    candidate = _common.frozen_copy(reference)
    cast = _common.CAST_DTYPES.get(chosen["quantization"])
    if cast is not None:
        # nn.Module.to: diffusers' ModelMixin.to warns about fp32-kept modules (there are none here)
        candidate = _common.cast_inputs(torch.nn.Module.to(candidate, cast), dtype=cast)
    impl = chosen["implementation"]
    candidate = _common.compile_candidate(candidate, impl)
    name = "copy" if cast is None else f"{chosen['quantization']}-cast"
    recorded = _common.recorded_settings(
        NAME,
        record,
        candidate=name if impl == "same" else f"{name}+compile-{impl}",
        dtype=str(cast or torch.float32).removeprefix("torch."),
        implementation=impl,
    )
    return ParityCase(
        reference=reference,
        candidate=candidate,
        inputs=(photographs(),),
        settings=recorded,
        notes=f"seeded AutoencoderKL {CONFIG['block_out_channels']}; images: {', '.join(IMAGES)}",
    )


def _onnx_case(reference: torch.nn.Module, images: torch.Tensor, chosen: dict, record: dict):
    """``candidate=onnxruntime``: the reference exported to ONNX, run in onnxruntime."""
    cand = _common.onnx_drives(reference, [(images,)], chosen)
    how = (
        f"seeded AutoencoderKL {CONFIG['block_out_channels']}; candidate: "
        "torch.onnx.export(dynamo=True)"
    )
    return _common.onnx_case(NAME, reference, cand, chosen, record, how)
