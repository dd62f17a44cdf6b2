"""Sharded runs (issue 17): the merge's peak of held tensors against all full tensors together.

``python -m benchmarks.bench_distributed [--target tp_mlp|llama-tiny] [--world-size 2]``
prints one JSON line: wall seconds, ``unshard_peak_bytes`` (the most bytes the merge held at
once: one tag's rank parts + its full tensor + the reference's copy of that tag),
``unshard_full_bytes`` (every full candidate tensor of the run together: what holding them all
would cost) and their ratio, plus the merging process's peak RSS (``ru_maxrss``, KiB on Linux).
Not part of ``make bench`` (it spawns processes); the figure is quoted in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import time


def run(target: str, world_size: int) -> dict:
    """One sharded run of ``target``; returns the figures (see the module docstring)."""
    if target == "llama-tiny":
        from parity_tracker.builtin_targets import llama_tiny
        from parity_tracker.pipeline.run_target import run_case

        case = llama_tiny.build({"distributed": f"tp{world_size}"})
        t0 = time.perf_counter()
        result = run_case(case, environment={}, dump_mode="not")
    else:
        from parity_tracker.distributed import ShardedCandidate, launch
        from parity_tracker.examples import tp_mlp

        cand = ShardedCandidate(tp_mlp.build_dtensor, world_size)
        t0 = time.perf_counter()
        result = launch(tp_mlp.make_reference(), cand, tp_mlp.make_inputs(), environment={},
                        dump_mode="not")  # fmt: skip
    wall = time.perf_counter() - t0
    d = result.summary["distributed"]
    return {
        "target": target,
        "world_size": world_size,
        "passed": result.passed,
        "tags": result.modules.num_rows,
        "wall_s": round(wall, 2),
        "unshard_peak_bytes": d["unshard_peak_bytes"],
        "unshard_full_bytes": d["unshard_full_bytes"],
        "peak_over_full": round(d["unshard_peak_bytes"] / d["unshard_full_bytes"], 4),
        "merge_process_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def main() -> None:
    """Parse the arguments, run, print one JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="llama-tiny", choices=["llama-tiny", "tp_mlp"])
    p.add_argument("--world-size", type=int, default=2)
    a = p.parse_args()
    print(json.dumps(run(a.target, a.world_size)))


if __name__ == "__main__":
    main()
