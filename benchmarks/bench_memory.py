"""Measurement 5 (``--full`` only): extra peak RSS of an op-level run over a deep model.

Measured in subprocesses, because peak RSS only ever grows: one child runs the plain forwards,
another the op-level parity run, on the same ``deep_pair(depth, numel)`` (identical imports,
models and inputs), and each reports its ``VmHWM`` from ``/proc/self/status``. Extra peak =
parity child − plain child. Two depths (32 and 64) show whether it is flat in depth; at depth
64 each side produces 64 × 3 × 32 MiB = 6 GiB of per-op activations (12 GiB both sides),
so a run that kept them would show it. Target: ≤ 1 GiB, and the two depths within 256 MiB.

The machine is shared (24 GiB): the parent polls each child's RSS and kills it above
``CAP_GIB``, reporting the cap as a floor ("> CAP") rather than swapping everyone out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._common import Row, find, judged, missing
from benchmarks.models import captured_bytes

NAME = "5 extra peak RSS"
DEPTHS = (32, 64)
NUMEL = 8 << 20  # 8 Mi float32 elements = 32 MiB per activation
LIMIT_GIB = 1.0
FLAT_GIB = 0.25
CAP_GIB = 8.0
GIB = 1 << 30

CHILD = r"""
import json, os, sys, torch
torch.set_num_threads(int(sys.argv[4]))
from benchmarks.models import deep_pair, plain_forwards
from benchmarks.overhead import parity_runner

def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) * 1024

what, depth, numel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pair = deep_pair(depth, numel)
run, why = parity_runner(pair, capture_ops=True)
if run is None:
    print(json.dumps({"unavailable": why})); sys.exit(0)
before = hwm()
if what == "plain":
    plain_forwards(pair)
else:
    run()
print(json.dumps({"hwm": hwm(), "before": before}))
"""


def _child(what: str, depth: int, numel: int, threads: int) -> dict:
    """Run one child; kill it above CAP_GIB of RSS. Returns its JSON line or ``{"capped":..}``."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, what, str(depth), str(numel), str(threads)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _rss(proc.pid))
        if peak > CAP_GIB * GIB:
            proc.kill()
            proc.wait()
            return {"capped": peak}
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{what} child (depth {depth}) failed: {err.strip()[-300:]}")
    return json.loads(out.strip().splitlines()[-1])


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(quick: bool, depths: tuple[int, ...] = DEPTHS, numel: int = NUMEL) -> list[Row]:
    """Rows of measurement 5: extra peak per depth, and the spread between depths."""
    target = f"≤ {LIMIT_GIB:g}"
    _, why = find("parity_tracker.run:run_parity")
    if why:
        return [missing(NAME, f"deep {d}", why, target) for d in depths]
    import torch

    threads = torch.get_num_threads()
    rows: list[Row] = []
    extras: list[float] = []
    for depth in depths:
        case = f"deep {depth} × 3 ops × {numel * 4 >> 20} MiB"
        plain = _child("plain", depth, numel, threads)
        parity = _child("ops", depth, numel, threads)
        if "unavailable" in parity:
            rows.append(missing(NAME, case, parity["unavailable"], target))
            continue
        captured = 2 * captured_bytes(depth, numel) / GIB
        if "capped" in parity:
            extra = (parity["capped"] - plain["hwm"]) / GIB
            detail = (
                f"killed at {CAP_GIB:g} GiB RSS (figure is a floor); captured {captured:.1f} GiB"
            )
        else:
            extra = (parity["hwm"] - plain["hwm"]) / GIB
            detail = (
                f"peak RSS plain {plain['hwm'] / GIB:.2f} GiB, op-level {parity['hwm'] / GIB:.2f}"
                f" GiB; per-op activations produced, both sides: {captured:.1f} GiB"
            )
        extras.append(extra)
        rows.append(
            judged(
                NAME,
                case,
                extra,
                "GiB",
                LIMIT_GIB,
                detail=detail,
                extra={"plain": plain, "ops": parity, "captured_gib": captured},
            )
        )
    if len(extras) == len(depths) >= 2:
        spread = max(extras) - min(extras)
        rows.append(
            judged(
                f"{NAME}: flat in depth",
                f"depths {depths}",
                spread,
                "GiB",
                FLAT_GIB,
                detail="max − min of the extra peak over the depths",
            )
        )
    return rows
