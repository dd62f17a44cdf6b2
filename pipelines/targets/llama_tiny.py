"""``llama-tiny``: transformers' ``LlamaForCausalLM`` from a small config, decoding real text.

Reference: the model built from :func:`make_config` with seeded init (no download) and eager
attention, recomputing the whole prefix at every decoding step (a fresh cache per step, so both
sides return the same output structure). Candidate: a copy (one state_dict) changed only by the
settings:

- ``cache=kv``: incremental decoding with a ``DynamicCache`` — step 0 is the prefill of the
  prompt, each later step feeds one new token. The recompute sees ``P + k`` positions at step
  ``k``, the cached step one;
  :func:`parity_tracker.builtin_targets._common.sequence_align` slices the
  recompute's last position(s) on the query-position dimension of each pair whose shapes differ
  only there (hidden states and logits ``(B, T, ·)`` on dim 1, attention weights and masks
  ``(B, ·, T, T)`` on dim 2, ``cache_position`` on dim 0). Parameters and the keys dimension
  are never sliced.
- ``attention=sdpa``: the candidate runs ``attn_implementation="sdpa"`` (PyTorch's
  ``scaled_dot_product_attention``) against the reference's eager attention. SDPA returns no
  attention weights and may pass no mask tensor, so those tags exist on the reference only.
- ``quantization=bf16``: the candidate is cast to bfloat16.
- ``distributed=tp2`` / ``tp4``: tensor parallelism over 2 or 4 gloo ranks (spawned
  processes): in every layer ``q/k/v_proj`` and ``gate/up_proj`` are ``ColwiseParallel``,
  ``o_proj`` and ``down_proj`` ``RowwiseParallel``; embeddings, norms and ``lm_head`` stay
  replicated (``parity_tracker.distributed``). ``tp4`` needs the KV heads divisible by 4, so
  its reference and candidate have 4 KV heads (plain multi-head attention) instead of 2. Only
  with the other settings at their defaults.

Token ids are the UTF-8 bytes of :data:`TEXT` (vocab 256: no tokenizer, no download); decoding
is teacher-forced on the text, so both sides see the same tokens at every step.
"""

from __future__ import annotations

from typing import Any

from parity_tracker.builtin_targets import _settings

NAME = "llama-tiny"
DESCRIPTION = (
    "transformers LlamaForCausalLM (2 layers, hidden 64, 4 heads / 2 KV heads, byte vocab) "
    "decoding real English text; candidate = KV-cache decoding, SDPA attention or a bf16 copy"
)
SETTINGS: dict[str, list[str]] = {
    "cache": ["off", "kv"],
    "attention": ["eager", "sdpa"],
    "quantization": ["none", "bf16"],
    "implementation": _settings.IMPLEMENTATIONS,
    "candidate": _settings.ENGINES,
    "ort_optimization": _settings.ORT_OPTIMIZATIONS,
    "distributed": ["none", "tp2", "tp4"],
}


def build(settings: dict[str, Any] | None = None) -> Any:
    """Build the llama-tiny case (``_llama_tiny.build``; imports torch and the model code)."""
    from parity_tracker.builtin_targets import _llama_tiny

    return _llama_tiny.build(settings)


def __getattr__(name: str) -> Any:
    """Every other name of the target (model, data, helpers) from ``_llama_tiny``, loaded on use."""
    if name.startswith("__"):
        raise AttributeError(name)
    from parity_tracker.builtin_targets import _llama_tiny

    return getattr(_llama_tiny, name)
