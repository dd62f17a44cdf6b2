"""Measurement 10: a decode loop, module-level run ÷ the plain decoding loops of both sides.

The built-in ``llama-tiny`` target's reference (``make_model``: transformers'
``LlamaForCausalLM``, 2 layers, hidden 64) and a frozen copy, both decoding with a KV cache
(``kv_drive``: the prompt's prefill at step 0, then one token per step): ``run_parity(ref,
cand, drive=kv_drive(...), mode="equal", dump_mode=DumpMode.NOT)`` vs the same drive run on
each model with no hooks (no_grad), side by side (``_common.alternate``). 64 decoding steps
(``--full``), 16 (``--quick``). Target ≤ 2.0 (issue 19, item 2), at both sizes.
"""

from __future__ import annotations

import os
from contextlib import redirect_stdout
from typing import Any

import torch

from benchmarks._common import Row, alternate, failed, find, judged, medians, paired_ratio

NAME = "10 decode loop ÷ plain"
TARGET = 2.0
STEPS = {False: 64, True: 16}
REPEATS = {False: 5, True: 3}


def _parts(steps: int) -> tuple[Any, Any, Any]:
    """(reference, candidate, drive) of the llama-tiny KV-cache decode of ``steps`` steps."""
    from parity_tracker.builtin_targets import _common, llama_tiny

    ids = llama_tiny.token_ids(length=llama_tiny.PROMPT_LEN + steps - 1)
    if ids.shape[1] < llama_tiny.PROMPT_LEN + steps - 1:
        raise ValueError(f"llama-tiny's text is too short for {steps} steps")
    reference = llama_tiny.make_model()
    candidate = _common.frozen_copy(reference)
    return reference, candidate, llama_tiny.kv_drive(ids, llama_tiny.PROMPT_LEN, steps)


def run(quick: bool) -> list[Row]:
    """The row of measurement 10."""
    steps = STEPS[quick]
    case = f"llama-tiny, KV cache, {steps} steps"
    target = f"≤ {TARGET:g}"
    run_parity, why = find("parity_tracker.run:run_parity")
    dump_mode, why2 = find("parity_tracker.tensor_checker:DumpMode")
    if run_parity is None or dump_mode is None:
        return [Row(NAME, case, None, "", target, None, "not available yet", why or why2)]
    try:
        reference, candidate, drive = _parts(steps)

        def plain() -> None:
            with torch.no_grad():
                for model in (reference, candidate):
                    drive(model, lambda k: None)

        def ours() -> Any:
            with open(os.devnull, "w") as sink, redirect_stdout(sink):
                return run_parity(
                    reference, candidate, drive=drive, settings={"target": "bench:decode"},
                    mode="equal", dump_mode=dump_mode.NOT,
                )  # fmt: skip

        result = ours()  # untimed: coverage and warm-up
        rows, status = result.modules.num_rows, result.summary.get("status")
        times = alternate({"plain": plain, "module": ours}, REPEATS[quick], warmup=1)
    except Exception as exc:
        return [failed(NAME, case, exc, target)]
    med = medians(times)
    other = {k.split(":")[-1]: v for k, v in times.items() if ":" in k}
    detail = (
        f"{rows} module-table rows, run status {status}; median s: module {med['module']:.3f}, "
        f"plain {med['plain']:.3f}; other-clock ratio "
        f"{paired_ratio(other, 'module', 'plain'):.3g}"
    )
    extra = {"rows": rows, "steps": steps, "times_s": times, "quick_target": True}
    value = paired_ratio(times, "module", "plain")
    return [judged(NAME, case, value, "×", TARGET, detail=detail, extra=extra)]
