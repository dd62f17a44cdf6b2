"""``flux-tiny``: diffusers' ``FluxTransformer2DModel`` from a small config, in a denoising loop.

Reference: the model built from :data:`CONFIG` with seeded init (no download), run for
:data:`STEPS` Euler steps of rectified-flow sampling: ``x ← x + (σ_{k+1} − σ_k) · v(x, σ_k)``
with ``σ`` from 1 down to 0 (the flow-matching update of diffusers'
``FlowMatchEulerDiscreteScheduler`` without shift). Latents, text embeddings and pooled
projections are fixed (seeded); the image is 4×4 latent tokens, the text 8 tokens.

Candidate: a copy (one state_dict); with ``cache=first_block`` diffusers' First Block Cache
(``FirstBlockCacheConfig(threshold=THRESHOLD)``) is applied. At each step the first block
(``transformer_blocks.0``) runs; when its residual changed by less than the threshold
(mean |Δ| / mean |previous|) the remaining blocks are skipped and the cached residual of the
last full step is added to the first block's output instead.

Cache hits: module hooks still fire on a skipped block (its forward returns its input), so the
drive reads the cache's own decision after each step (``should_compute`` of the shared
First Block Cache state) and, on a skipped step, calls ``rec.mark_cache_hit(name)`` for the
head block (its output is replaced by output + cached residual), every other block and every
submodule of those blocks. Rows of those modules at that step are cache hits.
"""

from __future__ import annotations

from typing import Any

NAME = "flux-tiny"
DESCRIPTION = (
    "diffusers FluxTransformer2DModel (2 double + 2 single blocks, 2 heads x 16) over a 6-step "
    "Euler flow-matching loop; candidate = a copy with diffusers' First Block Cache"
)
SETTINGS: dict[str, list[str]] = {"cache": ["off", "first_block"]}


def build(settings: dict[str, Any] | None = None) -> Any:
    """Build the flux-tiny case (``_flux_tiny.build``; imports torch and the model code)."""
    from parity_tracker.builtin_targets import _flux_tiny

    return _flux_tiny.build(settings)


def __getattr__(name: str) -> Any:
    """Every other name of the target (model, data, helpers) from ``_flux_tiny``, loaded on use."""
    if name.startswith("__"):
        raise AttributeError(name)
    from parity_tracker.builtin_targets import _flux_tiny

    return getattr(_flux_tiny, name)
