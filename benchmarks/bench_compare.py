"""Comparison throughput as a fraction of ``numpy.copyto`` bandwidth (issue 2 §5).

Two ratios, measured in one process on two 2^26-element float32 tensors (2^22 with ``quick``):

- equal path: ``compare_tensors(a, b)`` with ``b`` a bitwise copy of ``a`` (status ``equal``:
  both content hashes and a bitwise check, chunk by chunk);
- full metrics: ``compare_tensors(a, c, mode="allclose")`` with ``c = a + noise`` everywhere
  (status ``mismatch``: hashes plus every metric of ``parity_tracker.compare.metrics``).

Throughput is the bytes of BOTH inputs read per second (``2 · nbytes / t``); ``copyto``
bandwidth is the bytes copied per second (``nbytes / t`` of ``numpy.copyto(dst, a)``, which
reads ``nbytes`` and writes ``nbytes``). The three contenders run alternately in every repeat
(order rotated each repeat) after a warm-up; each figure is the median over repeats of the
per-repeat ratio. Goals: equal ≥ 0.5, full ≥ 0.25 (issue 19: at 2^26 and at the quick 2^22).
``small_mismatch`` adds the µs of one full comparison of a 64-element differing pair (≤ 60).

Wall-clock ratios are the figures of record. The ``*_cpu`` ratios use process CPU time (all
threads summed) instead: on a machine shared with other busy processes a 30 ms ``copyto``
often runs in one uninterrupted time slice while a 0.5 s comparison is pre-empted many times,
so wall-clock ratios there understate the code; CPU-time ratios are per core (two worker
threads count twice), a lower bound of what an idle machine gives.
"""

from __future__ import annotations

import os
import statistics
import time
import timeit

import numpy as np
import torch

from parity_tracker.compare import compare_tensors, fused


def _time(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process, all threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def run(quick: bool = False) -> dict:
    """Measure both ratios; returns ratios, raw GB/s (1e9 B/s), sizes, repeats and threads."""
    n = 1 << (22 if quick else 26)
    repeats = 5 if quick else 7
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=gen)
    b = a.clone()
    c = a + 1e-3 * torch.randn(n, generator=gen)
    src, dst = a.numpy(), np.empty(n, dtype=np.float32)
    nbytes = a.numel() * a.element_size()
    eq = compare_tensors(a, b)
    full = compare_tensors(a, c, mode="allclose")
    assert eq.status == "equal" and full.status == "mismatch", (eq.status, full.status)
    contenders = {
        "copyto": lambda: np.copyto(dst, src),
        "equal": lambda: compare_tensors(a, b),
        "full": lambda: compare_tensors(a, c, mode="allclose"),
    }
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
    names = list(contenders)
    for rep in range(repeats):
        order = names[rep % 3 :] + names[: rep % 3]
        for name in order:
            times[name].append(_time(contenders[name]))

    def ratio(name: str, clock: int) -> float:
        pairs = zip(times["copyto"], times[name], strict=True)
        return statistics.median(2 * tc[clock] / t[clock] for tc, t in pairs)

    med = {k: statistics.median(t[0] for t in v) for k, v in times.items()}
    return {
        "equal_over_copyto": ratio("equal", 0),
        "full_over_copyto": ratio("full", 0),
        "equal_over_copyto_cpu": ratio("equal", 1),
        "full_over_copyto_cpu": ratio("full", 1),
        "copyto_gbps": nbytes / med["copyto"] / 1e9,
        "equal_gbps": 2 * nbytes / med["equal"] / 1e9,
        "full_gbps": 2 * nbytes / med["full"] / 1e9,
        "numel": n,
        "repeats": repeats,
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],
        "compiled_loop": fused.kernel() is not None,
        **small_mismatch(),
    }


SMALL_N = 64


def small_mismatch() -> dict:
    """µs per ``compare_tensors(a, a + 1e-3, mode="allclose")`` on 64-element float32 pairs.

    Every element differs (status ``mismatch``, every metric); best of 5 means of 2,000 calls,
    wall and process CPU (issue 19: ≤ 60 µs).
    """
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(SMALL_N, generator=gen)
    c = a + 1e-3
    assert compare_tensors(a, c, mode="allclose").status == "mismatch"
    wall, cpu = _per_call_us(lambda: compare_tensors(a, c, mode="allclose"), SMALL_N)
    return {"small_mismatch_us": wall, "small_mismatch_us_cpu": cpu, "small_numel": SMALL_N}


PER_CALL_SIZES = (64, 4096, 1 << 16, 1 << 20)


def _per_call_us(fn, n: int) -> tuple[float, float]:
    """Best-of-5 mean (wall, process CPU) time of one call, in µs.

    CPU time is the steadier figure on a busy machine, but it also counts torch's pool threads
    spinning while they wait, so it can exceed the wall time.
    """
    number = max(3, min(2000, (1 << 17) // n))
    wall = timeit.repeat(fn, number=number, repeat=5, timer=time.perf_counter)
    cpu = timeit.repeat(fn, number=number, repeat=5, timer=time.process_time)
    return min(wall) / number * 1e6, min(cpu) / number * 1e6


def per_call() -> dict:
    """Per-call cost of ``compare_tensors`` on identical float32 pairs vs ``torch.equal``.

    For each size in :data:`PER_CALL_SIZES`: µs per ``compare_tensors(a, a.clone())``
    (status ``equal``, both hashes, NaN/inf counts), per ``torch.equal`` on the same pair, and
    per ``compare_tensors(a, a + 1e-3, mode="allclose")`` (every metric), plus the ratio of the
    first two, each as wall and CPU time. Targets (issue 2 follow-up): ≤ 30 µs at 64
    elements, ≤ 2× torch.equal at 2^20.
    """
    out = {}
    gen = torch.Generator().manual_seed(0)
    for n in PER_CALL_SIZES:
        a = torch.randn(n, generator=gen)
        b, c = a.clone(), a + 1e-3
        ours = _per_call_us(lambda: compare_tensors(a, b), n)  # noqa: B023 (called at once)
        ref = _per_call_us(lambda: torch.equal(a, b), n)  # noqa: B023
        full = _per_call_us(lambda: compare_tensors(a, c, mode="allclose"), n)  # noqa: B023
        out[n] = {
            "equal_us_wall": ours[0],
            "equal_us_cpu": ours[1],
            "torch_equal_us_wall": ref[0],
            "torch_equal_us_cpu": ref[1],
            "ratio_wall": ours[0] / ref[0],
            "allclose_mismatch_us_wall": full[0],
            "allclose_mismatch_us_cpu": full[1],
        }
    return out


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2^22 elements instead of 2^26")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--per-call", action="store_true", help="per-call µs on small pairs")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(json.dumps(per_call() if args.per_call else run(args.quick), indent=2))
