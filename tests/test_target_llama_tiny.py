"""llama-tiny: KV cache aligned by position, SDPA, bf16 (identity and 1-ULP: the contract test)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import run_quiet as run

from parity_tracker.builtin_targets import llama_tiny

pytestmark = pytest.mark.slow


def logits_rows(result):
    """The rows of the root's logits output, one per step (the root is named ``root`` by the
    checker here, because LlamaForCausalLM has a child named ``model``)."""
    rows = [
        r
        for r in result.modules.to_pylist()
        if r["kind"] == "output" and r["tag"].endswith("_output_logits")
    ]
    assert len({r["tag"] for r in rows}) == 1
    return sorted(rows, key=lambda r: r["step"])


def last_logits_per_step(model, ids):
    """Logits of the last position at each step, by full recompute (use_cache=False)."""
    out = []
    with torch.no_grad():
        for k in range(llama_tiny.STEPS):
            logits = model(input_ids=ids[:, : llama_tiny.PROMPT_LEN + k], use_cache=False).logits
            out.append(logits[:, -1].double())
    return out


def test_token_ids_are_the_texts_bytes():
    ids = llama_tiny.token_ids()
    assert ids.shape == (1, llama_tiny.PROMPT_LEN + llama_tiny.STEPS - 1)
    assert bytes(ids[0].tolist()).decode() == llama_tiny.TEXT[: ids.shape[1]]


def test_kv_cache_is_aligned_by_position_and_close():
    case = llama_tiny.build({"cache": "kv"})
    assert case.align is not None and case.candidate_drive is not case.drive
    ids = llama_tiny.token_ids()
    ref = last_logits_per_step(case.reference, ids)
    # the candidate's own cached decode, independently of the runner
    from transformers import DynamicCache

    cache, cand = DynamicCache(config=case.candidate.config), []
    with torch.no_grad():
        p = llama_tiny.PROMPT_LEN
        cand.append(case.candidate(input_ids=ids[:, :p], cache=cache, use_cache=True).logits)
        for k in range(1, llama_tiny.STEPS):
            step = ids[:, p + k - 1 : p + k]
            cand.append(case.candidate(input_ids=step, cache=cache, use_cache=True).logits)
    expected = [float((c[:, -1].double() - r).abs().max()) for c, r in zip(cand, ref, strict=True)]
    result = run(case)
    s = result.summary
    assert s["mode"] == "allclose" and "cache=kv" in s["mode_reason"]
    assert s["passed"]  # fp32 KV-cache decoding is within fp32 allclose tolerances
    rows = logits_rows(result)
    assert [r["step"] for r in rows] == list(range(llama_tiny.STEPS))
    assert [r["max_abs_diff"] for r in rows] == pytest.approx(expected, rel=1e-6, abs=1e-12)
    # the prefill is the same computation; later steps compare one position after alignment
    assert rows[0]["status"] == "equal" and rows[0]["ref_shape"] == [1, llama_tiny.PROMPT_LEN, 256]
    assert all(r["ref_shape"] == r["cand_shape"] == [1, 1, 256] for r in rows[1:])


def test_sdpa_cell_reports_the_output_error():
    case = llama_tiny.build({"attention": "sdpa"})
    assert case.candidate.config._attn_implementation == "sdpa"
    assert case.reference.config._attn_implementation == "eager"
    assert case.settings["implementation"] == "sdpa"
    result = run(case)
    assert result.summary["mode"] == "budget"  # another implementation: error budget (issue 15)
    got = max(r["max_abs_diff"] for r in logits_rows(result))
    assert not math.isnan(got) and 0 < got < 1e-4


def test_bf16_cell_reports_the_output_error():
    case = llama_tiny.build({"quantization": "bf16"})
    ids = llama_tiny.token_ids()
    with torch.no_grad():
        cand = [
            case.candidate(input_ids=ids[:, : llama_tiny.PROMPT_LEN + k], use_cache=False).logits
            for k in range(llama_tiny.STEPS)
        ]
    assert cand[0].dtype == torch.bfloat16
    full_ref, full_twin = [], []
    twin = copy.deepcopy(case.reference).to(torch.bfloat16)  # PyTorch at bf16, built here
    with torch.no_grad():
        for k in range(llama_tiny.STEPS):
            n = llama_tiny.PROMPT_LEN + k
            full_ref.append(case.reference(input_ids=ids[:, :n], use_cache=False).logits.double())
            full_twin.append(twin(input_ids=ids[:, :n], use_cache=False).logits.double())
    expected = [float((c.double() - t).abs().max()) for c, t in zip(cand, full_twin, strict=True)]
    errors = [float((c.double() - r).abs().max()) for c, r in zip(cand, full_ref, strict=True)]
    result = run(case)
    assert result.summary["mode"] == "budget"  # a cast: error budget (issue 15)
    rows = logits_rows(result)
    # the twin is the run's reference side (run.budget, 2026-12-01): the rows compare the
    # candidate with PyTorch at bf16 (they compared with the fp32 reference's forward)
    assert [r["max_abs_diff"] for r in rows] == pytest.approx(expected, rel=1e-6, abs=0)
    assert all(0 < e < 0.5 for e in errors)  # the bf16 output error vs the fp32 reference
