"""Measurement 7 (issue 15): a ``mode="budget"`` run ÷ the plain forwards it stands for.

The pair: the transformer of measurement 1 (fp32 reference) against a copy cast to bf16 that
casts its inputs (a pre-hook), the case the nightly's cast cells are. The budget run
(``run_parity(mode="budget")``, no dumps) does a float64 golden pass under the dispatch mode,
then the twin (the reference cast to bf16) as the run's reference side and the candidate, all
hooked: three forwards (until 2026-12-01 a fourth, the fp32 reference's own, ran as well).

- **÷ three plain forwards** (target ≤ 1.5; ``--quick``, the 2-layer size: ≤
  :data:`QUICK_TARGET`): the plain float64 golden forward (a float64 copy, no dispatch mode),
  the plain twin forward and the plain candidate forward.
- **÷ two plain forwards** (information): the plain reference and candidate forwards, the
  denominator of measurement 1.
- **fresh memory per budget run** (information, issue 19 wave 7): the minor page faults of each
  timed budget call (``getrusage`` ``ru_minflt`` before and after it) times the page size, in
  MiB, median over the repeats, with the plain forwards' in the detail. A budget run keeps the
  golden's float64 activations and weights, the twin's weights and its activations (the
  reference side's) until the candidate is judged; the allocator hands most of that back to the
  system between runs, so each run writes it into fresh pages again (the kernel zeroes each
  one): a cost on the CPU clock that the plain forwards, whose memory is reused, do not pay.

Time spent building the golden and twin copies (``deepcopy``) is inside the run's time.
"""

from __future__ import annotations

import copy
import mmap
from typing import Any

import torch

from benchmarks import cases
from benchmarks._common import Row, alternate, failed, judged, medians, paired_ratio

NAME = "7 budget run ÷ plain"
TARGET = 1.5
#: the quick size's own target (2×128 transformer, seq 64), judged at that size like measurement
#: 1's ≤ 2.0. There fixed costs dominate; what the other targets of issue 19 imply: four plain
#: forwards (golden, twin, reference, candidate ≈ 1.3× the three; three since 2026-12-01, the
#: twin being the reference side), ~300 captured tensors at item 1's ≤ 30 µs, ~47 verdicts
#: (full metrics vs the reference + the budget) at ≈ 150 µs, the two copies and the dispatch
#: mode ≈ 6 ms: ≈ 4.5× the three plain forwards (≈ 9 ms) → ≤ 5 (kept)
QUICK_TARGET = 5.0
#: repeats: the issue's at full size; at the quick size 5 (a run is ~0.1 s; each call also
#: pays an untimed gc.collect), which steadies the median on a shared machine in ~10 s
REPEATS = {False: cases.REPEATS[False], True: 5}


def _cast(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    model.register_forward_pre_hook(
        lambda _m, args: tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    )
    return model


def _minor_faults() -> int | None:
    """This process's minor page faults so far (``ru_minflt``), or None without ``resource``."""
    try:
        import resource
    except ImportError:  # not on Unix
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _counting_faults(call: Any, faults: list[int]) -> Any:
    """``call`` that also appends the minor page faults it caused to ``faults``."""

    def counted() -> None:
        before = _minor_faults()
        call()
        after = _minor_faults()
        if before is not None and after is not None:
            faults.append(after - before)

    return counted


def _fresh_row(pair: Any, faults: dict[str, list[int]], quick: bool) -> Row:
    """The information row: MiB of fresh pages per budget run (median), plain's in the detail."""
    mib = {
        k: sorted(v)[len(v) // 2] * mmap.PAGESIZE / 2**20 if v else None for k, v in faults.items()
    }
    plain = "n/a" if mib["plain3"] is None else f"{mib['plain3']:.0f} MiB"
    detail = (
        f"{pair.label}: minor page faults × {mmap.PAGESIZE} B per timed call, median of "
        f"{REPEATS[quick]}; the 3 plain forwards: {plain}"
    )
    extra = {"minor_faults": faults, "page_bytes": mmap.PAGESIZE}
    return Row(
        NAME, "fresh memory per budget run", mib["budget"], "MiB", detail=detail, extra=extra
    )


def _contenders(pair: Any) -> dict[str, Any]:
    from parity_tracker.run import run_parity
    from parity_tracker.tensor_checker import DumpMode

    ref, x = pair.reference.eval(), pair.inputs
    cand = _cast(copy.deepcopy(ref).bfloat16(), torch.bfloat16).eval()
    twin = _cast(copy.deepcopy(ref).bfloat16(), torch.bfloat16).eval()
    golden = copy.deepcopy(ref).double().eval()
    x64 = tuple(t.double() if t.is_floating_point() else t for t in x)

    def plain(*models_inputs: tuple[torch.nn.Module, tuple]) -> None:
        with torch.no_grad():
            for model, inputs in models_inputs:
                model(*inputs)

    def budget() -> None:
        run_parity(ref, cand, x, mode="budget", dump_mode=DumpMode.NOT, environment={})

    return {
        "plain3": lambda: plain((golden, x64), (twin, x), (cand, x)),
        "plain2": lambda: plain((ref, x), (cand, x)),
        "budget": budget,
    }


def run(quick: bool) -> list[Row]:
    """The two ratios on the transformer (``--quick``: its 2-layer size)."""
    try:
        pair = cases.transformer(quick)
        torch.backends.mha.set_fastpath_enabled(False)
        faults: dict[str, list[int]] = {"budget": [], "plain3": []}
        contenders = _contenders(pair)
        for name, found in faults.items():
            contenders[name] = _counting_faults(contenders[name], found)
        times = alternate(contenders, REPEATS[quick])
        for found in faults.values():
            del found[: len(found) - REPEATS[quick]]  # the timed repeats, not the warm-up
    except Exception as exc:
        return [failed(NAME, "transformer bf16 cast", exc, f"≤ {TARGET:g}")]
    med = medians(times)
    extra = {"medians_s": med, "repeats": REPEATS[quick]}
    detail = (
        f"{pair.label}, bf16 cast candidate; medians: budget {med['budget']:.3f} s, "
        f"3 plain (golden f64 + twin + candidate) {med['plain3']:.3f} s, "
        f"2 plain (reference + candidate) {med['plain2']:.3f} s"
    )
    three = paired_ratio(times, "budget", "plain3")
    two = paired_ratio(times, "budget", "plain2")
    limit = QUICK_TARGET if quick else TARGET
    extra3 = {**extra, "quick_target": True} if quick else extra  # __main__ keeps the verdict
    row3 = judged(
        NAME, f"{pair.label} ÷ 3 plain forwards", three, "×", limit, detail=detail, extra=extra3
    )
    return [
        row3,
        Row(NAME, f"{pair.label} ÷ 2 plain forwards", two, "×", detail=detail, extra=extra),
        _fresh_row(pair, faults, quick),
    ]
