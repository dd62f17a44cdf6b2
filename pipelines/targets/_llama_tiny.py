"""The llama-tiny target's code (imports torch at import time).

Its metadata (``NAME``, ``DESCRIPTION``, ``SETTINGS``) and the module docstring are in
``parity_tracker.builtin_targets.llama_tiny``, the entry point, which reads without torch and loads
this module on first use of ``build`` or any other name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from parity_tracker.builtin_targets import _common
from parity_tracker.builtin_targets.llama_tiny import DESCRIPTION as DESCRIPTION
from parity_tracker.builtin_targets.llama_tiny import NAME as NAME
from parity_tracker.builtin_targets.llama_tiny import SETTINGS as SETTINGS
from parity_tracker.pipeline.case import ParityCase

#: The opening of Lewis Carroll's *Alice's Adventures in Wonderland* (1865, public domain).
TEXT = (
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having "
    "nothing to do: once or twice she had peeped into the book her sister was reading, but it "
    "had no pictures or conversations in it."
)
PROMPT_LEN = 24
STEPS = 8
SEED = 0


def make_config(attention: str = "eager", kv_heads: int = 2) -> Any:
    """The small ``LlamaConfig``: 2 layers, hidden 64, MLP 128, 4 heads, 2 KV heads, vocab 256.

    ``kv_heads``: the number of key/value heads (4 for ``distributed=tp4``).
    """
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attn_implementation=attention,
    )


def token_ids(text: str = TEXT, length: int = PROMPT_LEN + STEPS - 1) -> torch.Tensor:
    """The first ``length`` UTF-8 bytes of ``text`` as token ids ``(1, length)`` int64."""
    data = list(text.encode("utf-8"))[:length]
    return torch.tensor([data], dtype=torch.long)


def make_model(kv_heads: int = 2) -> torch.nn.Module:
    """The reference model: seeded init, eager attention, eval mode, fp32."""
    from transformers import LlamaForCausalLM

    with _common.seeded(SEED):
        model = LlamaForCausalLM(make_config("eager", kv_heads))
    model.eval().requires_grad_(False)
    return model


def recompute_drive(ids: torch.Tensor, prompt_len: int, steps: int) -> Callable[..., None]:
    """A drive that recomputes the whole prefix ``ids[:, :prompt_len + k]`` at step ``k``."""
    from transformers import DynamicCache

    def drive(model: torch.nn.Module, rec: Callable[[int], Any]) -> None:
        for k in range(steps):
            rec(k)
            cache = DynamicCache(config=model.config)
            model(input_ids=ids[:, : prompt_len + k], cache=cache, use_cache=True)

    return drive


def kv_drive(ids: torch.Tensor, prompt_len: int, steps: int) -> Callable[..., None]:
    """A drive that prefills ``ids[:, :prompt_len]`` at step 0, then feeds one token per step."""
    from transformers import DynamicCache

    def drive(model: torch.nn.Module, rec: Callable[[int], Any]) -> None:
        cache = DynamicCache(config=model.config)
        rec(0)
        model(input_ids=ids[:, :prompt_len], cache=cache, use_cache=True)
        for k in range(1, steps):
            rec(k)
            pos = prompt_len + k - 1
            model(input_ids=ids[:, pos : pos + 1], cache=cache, use_cache=True)

    return drive


def tp_plan(num_layers: int) -> dict[str, Any]:
    """The tensor-parallel plan: attention and MLP sharded, everything else replicated."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    for i in range(num_layers):
        layer = f"model.layers.{i}"
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            plan[f"{layer}.{name}"] = ColwiseParallel()
        plan[f"{layer}.self_attn.o_proj"] = RowwiseParallel()
        plan[f"{layer}.mlp.gate_proj"] = ColwiseParallel()
        plan[f"{layer}.mlp.up_proj"] = ColwiseParallel()
        plan[f"{layer}.mlp.down_proj"] = RowwiseParallel()
    return plan


def build_rank(kv_heads: int, rank: int, world_size: int) -> Any:
    """One rank's candidate (in a spawned rank): the reference parallelised by :func:`tp_plan`."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from parity_tracker.distributed import RankCase

    model = make_model(kv_heads)
    mesh = init_device_mesh("cpu", (world_size,))
    parallelize_module(model, mesh, tp_plan(model.config.num_hidden_layers))
    return RankCase(model, drive=recompute_drive(token_ids(), PROMPT_LEN, STEPS))


def _build_sharded(chosen: dict[str, str]) -> ParityCase:
    """The ``distributed=tp2|tp4`` case (see the module docstring)."""
    from parity_tracker.distributed import ShardedCandidate
    from parity_tracker.errors import InputError

    others = {k: v for k, v in chosen.items() if k != "distributed" and v != SETTINGS[k][0]}
    if others:
        raise InputError(
            f"target {NAME!r}: distributed={chosen['distributed']} runs with the other settings "
            f"at their defaults; drop {', '.join(f'{k}={v}' for k, v in others.items())}"
        )
    chosen = {k: v for k, v in chosen.items() if k != "ort_optimization"}  # onnxruntime only
    world_size = int(chosen["distributed"].removeprefix("tp"))
    kv_heads = 4 if world_size == 4 else 2
    candidate = ShardedCandidate(functools.partial(build_rank, kv_heads), world_size)
    recorded = _common.recorded_settings(
        NAME, chosen, candidate=f"tensor-parallel x{world_size} (gloo)", dtype="float32",
        implementation="same",
    )  # fmt: skip
    return ParityCase(
        reference=make_model(kv_heads),
        candidate=candidate,
        drive=recompute_drive(token_ids(), PROMPT_LEN, STEPS),
        settings=recorded,
        notes=f"{STEPS} decoding steps; attention and MLP sharded over {world_size} gloo ranks",
    )


def build(settings: dict[str, Any] | None = None) -> ParityCase:
    """Build the llama-tiny case.

    Args:
        settings: ``cache`` (off | kv), ``attention`` (eager | sdpa), ``quantization``
            (none | bf16), ``distributed`` (none | tp2 | tp4); missing keys take the first
            value.

    Returns:
        A multi-step :class:`ParityCase` (``STEPS`` = 8 decoding steps over a 24-byte prompt)
        with ``drive`` (full recompute) and ``candidate_drive`` (recompute, or KV-cache decoding
        when ``cache=kv``); ``align`` is set for ``cache=kv``.

    Raises:
        InputError: an unknown setting or value.
    """
    chosen = _common.resolve_settings(NAME, SETTINGS, settings)
    if chosen["distributed"] != "none":
        return _build_sharded(chosen)
    del chosen["distributed"]  # not recorded when off: fingerprints of earlier runs unchanged
    onnx, record = _common.engine_settings(
        NAME, chosen, cache="off", attention="eager", quantization="none", implementation="same"
    )
    reference = make_model()
    if onnx:
        return _onnx_case(reference, chosen, record)
    candidate = _common.frozen_copy(reference)
    if chosen["attention"] != "eager":
        candidate.set_attn_implementation(chosen["attention"])
    cast = _common.CAST_DTYPES.get(chosen["quantization"])
    if cast is not None:
        candidate = candidate.to(cast)
    impl = chosen["implementation"]
    # dynamic=True: one graph for the 8 prefix lengths (static shapes compile twice: the first
    # length, then a dynamic graph when the second length arrives)
    candidate = _common.compile_candidate(candidate, impl, dynamic=True)
    ids = token_ids()
    kv = chosen["cache"] == "kv"
    parts = (
        [chosen["attention"]]
        + (["kv-cache"] if kv else [])
        + ([chosen["quantization"]] * bool(cast))
        + ([f"compile-{impl}"] if impl != "same" else [])
    )
    kernels = [chosen["attention"]] * (chosen["attention"] != "eager") + [impl] * (impl != "same")
    recorded = _common.recorded_settings(
        NAME,
        record,
        candidate="+".join(parts) if parts != ["eager"] else "copy",
        dtype=str(cast or torch.float32).removeprefix("torch."),
        implementation="+".join(kernels) or "same",
    )
    return ParityCase(
        reference=reference,
        candidate=candidate,
        drive=recompute_drive(ids, PROMPT_LEN, STEPS),
        candidate_drive=(kv_drive if kv else recompute_drive)(ids, PROMPT_LEN, STEPS),
        settings=recorded,
        notes=(
            f"teacher-forced decoding of {STEPS} steps after a {PROMPT_LEN}-byte prompt of "
            "Alice's Adventures in Wonderland; reference = eager full recompute per step"
            + ("; kv steps aligned to the recompute's last position" if kv else "")
        ),
        align=_common.sequence_align if kv else None,
    )


def _onnx_case(reference: torch.nn.Module, chosen: dict, record: dict) -> ParityCase:
    """``candidate=onnxruntime``: the full recompute exported with a dynamic sequence length.

    Both sides run ``model(input_ids)`` on the growing prefix with ``use_cache=False`` (no
    cache object crosses the export; the KV-cache path is not exported), one step per length.
    """
    from torch.export import Dim

    from parity_tracker.adapters.foreign import ForeignCandidate
    from parity_tracker.adapters.onnx import export, onnx_candidate

    reference.config.use_cache = False
    ids = token_ids()
    steps = [(ids[:, : PROMPT_LEN + k],) for k in range(STEPS)]
    seq = Dim("seq", min=2, max=reference.config.max_position_embeddings)
    proto = export(reference, steps[0], dynamic_shapes=({1: seq},))
    cand: ForeignCandidate = onnx_candidate(
        reference, steps, proto, ort_optimization=chosen["ort_optimization"]
    )
    how = (
        f"full recompute of {STEPS} growing prefixes (use_cache=False) exported with a "
        "dynamic sequence length, run"
    )
    return _common.onnx_case(NAME, reference, cand, chosen, record, how)
