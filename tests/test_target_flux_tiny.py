"""flux-tiny: First Block Cache hits recorded per step (identity and 1-ULP: the contract test)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import run_quiet as run

from parity_tracker.builtin_targets import flux_tiny

pytestmark = pytest.mark.slow


class Recorder:
    """A minimal step recorder: remembers the step and the cache hits marked at each."""

    def __init__(self):
        self.step, self.hits = 0, {}

    def __call__(self, k):
        self.step = k
        return self

    def register(self, tag, tensor):
        raise AssertionError("flux-tiny registers nothing by hand")

    def mark_cache_hit(self, name):
        self.hits.setdefault(self.step, set()).add(name)


def steps_where_tail_blocks_ran(case):
    """Independently of the drive's bookkeeping: the steps at which the last single block's
    attention really ran (a skipped block returns its input without calling its submodules)."""
    ran, rec = set(), Recorder()
    attn = case.candidate.single_transformer_blocks[-1].attn
    handle = attn.register_forward_hook(lambda *_: ran.add(rec.step))
    try:
        with torch.no_grad():
            case.drive(case.candidate, rec)
    finally:
        handle.remove()
    return ran, rec.hits


def test_first_block_cache_hits_are_recorded_on_the_skipped_steps():
    case = flux_tiny.build({"cache": "first_block"})
    assert case.settings["cache"] == "first_block"
    ran, marked = steps_where_tail_blocks_ran(case)
    skipped = set(range(flux_tiny.STEPS)) - ran
    assert 0 in ran and skipped, "the threshold must skip some steps, not the first"
    assert set(marked) == skipped
    cached = set(flux_tiny.cached_module_names(case.candidate))
    assert all(marked[k] == cached for k in skipped)
    assert "transformer_blocks.0" in cached and "transformer_blocks.0.attn" not in cached

    result = run(case)
    s = result.summary
    assert s["mode"] == "allclose" and "cache=first_block" in s["mode_reason"]
    rows = result.modules.to_pylist()
    hit_steps = {r["step"] for r in rows if r["cache_hit"]}
    assert hit_steps == skipped
    # a block the cache skipped is a cache hit, never a missing tensor
    assert not [r for r in rows if r["status"].startswith("missing")]
    for k in skipped:
        attn = [r for r in rows if r["step"] == k and r["module"] == "transformer_blocks.1.attn"]
        assert attn and all(r["cache_hit"] and r["status"] == "skipped" for r in attn)
    computed = [r for r in rows if r["step"] in ran and r["module"] == "transformer_blocks.1"]
    assert computed and not any(r["cache_hit"] for r in computed)
    # the cached output error is reported, and step 0 (a full computation) is still exact
    out = [r for r in rows if r["module"] == "model" and r["kind"] == "output"]
    assert {r["step"]: r["status"] for r in out}[0] == "equal"
    got = s["output_max_abs_diff"]
    assert got is not None and not math.isnan(got) and got > 0
