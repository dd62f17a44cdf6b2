"""The flux-tiny target's code (imports torch at import time).

Its metadata (``NAME``, ``DESCRIPTION``, ``SETTINGS``) and the module docstring are in
``parity_tracker.builtin_targets.flux_tiny``, the entry point, which reads without torch and loads
this module on first use of ``build`` or any other name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from parity_tracker.builtin_targets import _common
from parity_tracker.builtin_targets.flux_tiny import DESCRIPTION as DESCRIPTION
from parity_tracker.builtin_targets.flux_tiny import NAME as NAME
from parity_tracker.builtin_targets.flux_tiny import SETTINGS as SETTINGS
from parity_tracker.pipeline.case import ParityCase

#: FluxTransformer2DModel config (diffusers' argument names); rope axes sum to the head dim.
CONFIG: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 16,
    "num_layers": 2,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 32,
    "pooled_projection_dim": 32,
    "axes_dims_rope": (4, 6, 6),
}
STEPS = 6
LATENT_HW = (4, 4)
TEXT_TOKENS = 8
SEED = 0
INPUT_SEED = 1
#: First Block Cache threshold. The random-init tiny model changes its first-block residual by
#: 0.34-0.62 (relative) per step, so real-model thresholds (0.05-0.2) would never skip; 0.5 skips
#: steps 1, 2, 4, 5 (measured, torch 2.13 CPU).
THRESHOLD = 0.5
CONTEXT = "cond"


def make_model() -> torch.nn.Module:
    """The reference transformer: seeded init, eval mode, fp32."""
    from diffusers import FluxTransformer2DModel

    with _common.seeded(SEED):
        model = FluxTransformer2DModel(**CONFIG)
    model.eval().requires_grad_(False)
    return model


def make_inputs() -> dict[str, torch.Tensor]:
    """Fixed sampling inputs (seeded): latents, text embeddings, pooled projections, ids.

    Latents ``(1, 16, 16)``, text ``(1, 8, 32)``, pooled ``(1, 32)`` float32; the rotary
    position ids ``img_ids`` ``(16, 3)`` (row, column of each latent token) and ``txt_ids``
    ``(8, 3)`` zeros, as Flux pipelines build them.
    """
    gen = torch.Generator().manual_seed(INPUT_SEED)
    h, w = LATENT_HW
    img_ids = torch.zeros(h, w, 3)
    img_ids[..., 1] = torch.arange(h)[:, None]
    img_ids[..., 2] = torch.arange(w)[None, :]
    return {
        "latents": torch.randn(1, h * w, CONFIG["in_channels"], generator=gen),
        "encoder_hidden_states": torch.randn(
            1, TEXT_TOKENS, CONFIG["joint_attention_dim"], generator=gen
        ),
        "pooled_projections": torch.randn(1, CONFIG["pooled_projection_dim"], generator=gen),
        "img_ids": img_ids.reshape(h * w, 3),
        "txt_ids": torch.zeros(TEXT_TOKENS, 3),
    }


def sigmas(steps: int = STEPS) -> list[float]:
    """``steps + 1`` noise levels: ``steps`` values from 1 to ``1/steps``, then 0."""
    return [*torch.linspace(1.0, 1.0 / steps, steps).tolist(), 0.0]


def _fbc_state_manager(model: torch.nn.Module) -> Any | None:
    """The First Block Cache's shared state manager, or None when no cache is applied."""
    from diffusers.hooks import HookRegistry
    from diffusers.hooks.first_block_cache import _FBC_LEADER_BLOCK_HOOK

    head = model.transformer_blocks[0]
    registry = getattr(head, "_diffusers_hook", None)
    if registry is None:
        return None
    hook = HookRegistry.get_hook(registry, _FBC_LEADER_BLOCK_HOOK)
    return None if hook is None else hook.state_manager


def cached_module_names(model: torch.nn.Module) -> list[str]:
    """Modules whose outputs a First Block Cache hit replaces, in ``named_modules()`` order.

    The head block itself (it runs, but its output becomes output + cached residual), every
    other block and every submodule of those (skipped); not the head block's submodules.
    """
    head = "transformer_blocks.0"
    names = []
    for name, _ in model.named_modules():
        top = name.split(".")[:2]
        if top[0] not in ("transformer_blocks", "single_transformer_blocks") or len(top) < 2:
            continue
        if name.startswith(head + "."):
            continue
        names.append(name)
    return names


def make_drive(inputs: dict[str, torch.Tensor], steps: int = STEPS) -> Callable[..., None]:
    """The denoising loop as a drive; marks cache hits when the model has a First Block Cache.

    A cached model's stateful cache hooks are reset first, so every run of the drive (the
    runner's, an isolation re-run, a test's) starts from the same empty cache.
    """
    sig = sigmas(steps)

    def drive(model: torch.nn.Module, rec: Any) -> None:
        manager = _fbc_state_manager(model)
        cached = cached_module_names(model) if manager is not None else []
        if manager is not None:  # start from an empty cache, as a pipeline call does
            from diffusers.hooks import HookRegistry

            HookRegistry.check_if_exists_or_initialize(model).reset_stateful_hooks(recurse=True)
        x = inputs["latents"].clone()
        for k in range(steps):
            rec(k)
            kwargs = {
                "hidden_states": x,
                "encoder_hidden_states": inputs["encoder_hidden_states"],
                "pooled_projections": inputs["pooled_projections"],
                "timestep": torch.tensor([sig[k]]),
                "img_ids": inputs["img_ids"],
                "txt_ids": inputs["txt_ids"],
                "return_dict": False,
            }
            if manager is None:
                v = model(**kwargs)[0]
            else:
                with model.cache_context(CONTEXT):
                    v = model(**kwargs)[0]
                    skipped = not manager.get_state().should_compute
                if skipped:
                    for name in cached:
                        rec.mark_cache_hit(name)
            x = x + (sig[k + 1] - sig[k]) * v

    return drive


def build(settings: dict[str, Any] | None = None) -> ParityCase:
    """Build the flux-tiny case.

    Args:
        settings: ``cache`` (off | first_block); missing keys take the first value.

    Returns:
        A multi-step :class:`ParityCase` (``STEPS`` = 6 denoising steps) with one ``drive``
        for both sides; with ``cache=first_block`` the candidate carries diffusers' First Block
        Cache and the drive marks its hits.

    Raises:
        InputError: an unknown setting or value.
    """
    from diffusers.hooks import FirstBlockCacheConfig

    chosen = _common.resolve_settings(NAME, SETTINGS, settings)
    reference = make_model()
    candidate = _common.frozen_copy(reference)
    cached = chosen["cache"] == "first_block"
    if cached:
        candidate.enable_cache(FirstBlockCacheConfig(threshold=THRESHOLD))
    recorded = _common.recorded_settings(
        NAME,
        chosen,
        candidate=f"first-block-cache@{THRESHOLD}" if cached else "copy",
        dtype="float32",
        implementation="same",
    )
    return ParityCase(
        reference=reference,
        candidate=candidate,
        drive=make_drive(make_inputs()),
        settings=recorded,
        notes=(
            f"{STEPS}-step Euler flow-matching loop on fixed seeded latents/text embeddings"
            + (
                f"; First Block Cache threshold {THRESHOLD}: skipped steps mark the head block, "
                "the other blocks and their submodules as cache hits"
                if cached
                else ""
            )
        ),
    )
