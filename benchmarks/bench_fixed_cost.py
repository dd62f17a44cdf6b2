"""Measurement 9: fixed cost per captured tensor, in µs, on a model of many small modules.

``(module-level run − the two plain forwards) ÷ captured rows``: a stack of tiny blocks
(``Linear(16, 16)``, ``LayerNorm(16)``, ``GELU``) on a ``(4, 16)`` float32 input, so the
forwards themselves cost almost nothing and what is left is the per-tensor work of the capture,
the comparison and the row assembly. ``run_parity(ref, cand, x, mode="equal",
dump_mode=DumpMode.NOT)`` and ``ref(x); cand(x)`` (no_grad) run side by side, alternating
(``_common.alternate``); the figure is the median over repeats of the per-repeat difference
divided by the rows of the run's modules table (parameters, inputs, outputs of every module).
Target ≤ 30 µs (issue 19, item 1), at both sizes (the figure is per tensor: the size only
changes how many tensors it is averaged over).
"""

from __future__ import annotations

import copy
import statistics

import torch
from torch import nn

from benchmarks._common import CLOCK, Row, alternate, failed, judged, medians, other_clock
from benchmarks.models import Pair, plain_forwards
from benchmarks.overhead import parity_runner

NAME = "9 fixed cost per tensor"
TARGET_US = 30.0
#: blocks of (Linear, LayerNorm, GELU): --full, --quick
BLOCKS = {False: 200, True: 100}
REPEATS = {False: 7, True: 5}
WIDTH = 16


def small_pair(blocks: int, seed: int = 0) -> Pair:
    """``blocks`` × (``Linear(16, 16)``, ``LayerNorm(16)``, ``GELU``), twice (deep copy)."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.GELU()]
    reference = nn.Sequential(*layers).eval()
    candidate = copy.deepcopy(reference).eval()
    x = torch.randn(4, WIDTH)
    return Pair(reference, candidate, (x,), f"{3 * blocks} small modules, input (4, {WIDTH})")


def run(quick: bool) -> list[Row]:
    """The row of measurement 9 (µs per captured row)."""
    pair = small_pair(BLOCKS[quick])
    try:
        call, why = parity_runner(pair, capture_ops=False)
        if call is None:
            raise RuntimeError(why)
        rows = call().modules.num_rows  # untimed: coverage and warm-up
        times = alternate(
            {"plain": lambda: plain_forwards(pair), "module": call}, REPEATS[quick], warmup=1
        )
    except Exception as exc:
        return [failed(NAME, pair.label, exc, f"≤ {TARGET_US:g}")]
    per = [(m - p) / rows * 1e6 for m, p in zip(times["module"], times["plain"], strict=True)]
    oth = other_clock()
    per_other = [
        (m - p) / rows * 1e6
        for m, p in zip(times[f"{oth}:module"], times[f"{oth}:plain"], strict=True)
    ]
    med = medians(times)
    detail = (
        f"{rows} module-table rows; median {CLOCK['name']} s: module {med['module']:.4f}, "
        f"plain {med['plain']:.4f}; {oth}-clock {statistics.median(per_other):.3g} µs/row"
    )
    extra = {"clock": CLOCK["name"], "rows": rows, "times_s": times, "quick_target": True}
    return [
        judged(
            NAME, pair.label, statistics.median(per), "µs", TARGET_US, detail=detail, extra=extra
        )
    ]
