"""Synthetic parity results shaped like real ones, for previews, size/speed checks and tests.

``python -m dashboards.samples OUT_DIR`` writes ``report.html``, ``matrix.html`` and
``history.html`` built from these, so the pages can be looked at without running a model.
The numbers follow a typical broken run: every tensor equal up to one module of one step, then
differences that grow along the execution order (and steps), one root-cause op, cache hits on
alternate steps.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from parity_tracker.capture.tags import output_tag
from parity_tracker.files.tables import MODULES_SCHEMA, OPS_SCHEMA, rows_to_table

_BLOCK_MODULES = ("norm1", "attn.to_q", "attn.to_k", "attn.to_v", "attn", "norm2", "ff", "")


def synthetic_run(
    rows: int = 2000, steps: int = 20, *, diverge_step: int = 2, seed: int = 0
) -> SimpleNamespace:
    """A duck-typed ``RunResult`` with ``rows`` module rows over ``steps`` steps.

    Returns:
        ``SimpleNamespace(modules, ops, summary, settings)``; ``modules``/``ops`` follow
        ``MODULES_SCHEMA``/``OPS_SCHEMA``.
    """
    rng = np.random.default_rng(seed)
    per_step = max(1, rows // steps)
    out: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None
    err = 0.0
    # grow from 3e-7 to about 0.3 over the diverging rows: a random walk with drift
    diverging_rows = max(1, rows - per_step * diverge_step - per_step // 3)
    growth = math.exp(math.log(1e6) / diverging_rows)
    for step in range(steps):
        cached = step % 2 == 1
        for order in range(per_step):
            block, sub = divmod(order, len(_BLOCK_MODULES))
            module = f"transformer_blocks.{block}" + (
                f".{_BLOCK_MODULES[sub]}" if _BLOCK_MODULES[sub] else ""
            )
            kind = "output"
            tag = output_tag(module)
            if order == 0:
                kind, tag, module = "input", "checker_model_input_0", "model"
            diverging = step > diverge_step or (step == diverge_step and order >= per_step // 3)
            if diverging:
                err = err * growth if err else 3e-7
                err *= float(np.exp(rng.normal(0, 0.15)))
            mism = diverging and kind == "output"
            row = _row(rng, step, order, module, kind, tag, err if mism else 0.0, cached)
            out.append(row)
    out = out[:rows]
    bad = next((r for r in out if r["status"] == "mismatch"), None)
    if bad is not None:
        first = {k: bad[k] for k in ("tag", "module", "step", "exec_order")}
    ops, roots = _ops(first, rng)
    modules = rows_to_table(out, MODULES_SCHEMA)
    last = out[-1]
    settings = {
        "target": "tiny_dit",
        "candidate": "tiny_dit[first_block_cache]",
        "quantization": "none",
        "cache": "first_block",
        "device": "cpu",
        "dtype": "float32",
        "distributed": "none",
    }
    summary = {
        "run_id": "0123456789abcdef0123456789abcdef",
        "first_divergence": first,
        "root_causes": roots,
        "output_max_abs_diff": last["max_abs_diff"],
        "output_sqnr_db": last["sqnr_db"],
        "mode": "allclose",
        "mode_reason": "cache=first_block (some computation is skipped or reused)",
        "settings": settings,
        "environment": {"git_commit": "4f2a9c1d0e", "git_branch": "main", "git_dirty": False},
        "error": None,
        "passed": first is None,
    }
    return SimpleNamespace(
        modules=modules, ops=rows_to_table(ops, OPS_SCHEMA), summary=summary, settings=settings
    )


def _row(
    rng: np.random.Generator,
    step: int,
    order: int,
    module: str,
    kind: str,
    tag: str,
    err: float,
    cached: bool,
) -> dict[str, Any]:
    shape = [2, 64, 320]
    numel = math.prod(shape)
    signal = 1.0 + float(rng.random())
    row: dict[str, Any] = {
        "run_id": "0123456789abcdef0123456789abcdef",
        "tag": tag,
        "module": module,
        "kind": kind,
        "slot": "output" if kind == "output" else "input_0",
        "call_index": 0,
        "exec_order": order,
        "step": step,
        "mode": "allclose",
        "numel": numel,
        "ref_shape": shape,
        "cand_shape": shape,
        "ref_dtype": "float32",
        "cand_dtype": "float32",
        "rtol": 1.3e-6,
        "atol": 1e-5,
        "cache_hit": cached if kind == "output" else None,
    }
    if err == 0.0:
        row.update(status="equal", mismatch_count=0, max_abs_diff=0.0, max_rel_diff=0.0)
        row.update(mean_abs_diff=0.0, cosine=1.0, sqnr_db=None)
        return row
    over = err > row["atol"] + row["rtol"] * signal
    row.update(
        status="mismatch" if over else "close",
        mismatch_count=int(numel * min(1.0, err * 1e3)) if over else 0,
        max_abs_diff=err,
        max_rel_diff=err / signal,
        mean_abs_diff=err / 5,
        cosine=1.0 - err**2,
        sqnr_db=20 * math.log10(signal / err),
        dump_path=f"tensors/step{step}/{tag}.npy" if over else None,
        message=f"{int(numel * min(1.0, err * 1e3))} of {numel} elements differ" if over else "",
    )
    return row


def _ops(
    first: dict[str, Any] | None, rng: np.random.Generator
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if not first:
        return [], []
    names = ["aten::layer_norm", "aten::linear", "aten::view", "aten::softmax", "aten::matmul"]
    ops = []
    for i, op in enumerate(names):
        bad = i >= 3
        ops.append(
            {
                "tag": f"{first['tag']}.op{i}",
                "module": first["module"],
                "kind": "op",
                "step": first["step"],
                "exec_order": first["exec_order"],
                "status": "mismatch" if bad else "equal",
                "max_abs_diff": float(rng.uniform(1e-7, 1e-6)) if bad else 0.0,
                "ref_shape": [2, 64, 320],
                "cand_shape": [2, 64, 320],
                "ref_dtype": "float32",
                "cand_dtype": "float32",
                "op": op,
                "op_index": i,
                "inputs_status": "failing" if i > 3 else "passing",
                "root_cause": i == 3,
                "cause": "A" if i == 3 else None,
                "message": "softmax computed in a different order" if i == 3 else "",
            }
        )
    return ops, [o for o in ops if o["root_cause"]]


def synthetic_nightly(
    commits: int = 12, *, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Matrix cells for the last commit, history runs, and tag statuses for the heatmap."""
    rng = np.random.default_rng(seed)
    configs = [
        (t, {"quantization": q, "cache": c})
        for t in ("tiny_dit", "tiny_llama", "silero_vad")
        for q in ("none", "fp16", "int8")
        for c in ("off", "first_block")
    ]
    runs, tag_status, cells = [], [], []
    for ci, (target, settings) in enumerate(configs):
        fp = f"{ci:02d}{abs(hash((target, tuple(settings.items())))) % 10**8:08d}"
        exact = settings["quantization"] == "none" and settings["cache"] == "off"
        base = 0.0 if exact else 10 ** rng.uniform(-5, -2)
        for k in range(commits):
            broke = target == "tiny_llama" and exact and k >= commits - 3
            failing = 7 if broke else 0
            diff = 2e-3 if broke else base * float(np.exp(rng.normal(0, 0.1)))
            commit = f"{(0xA1B2C3D + k * 7919):07x}e{k:02d}"
            run = {
                "fingerprint": fp,
                "target": target,
                "settings": dict(settings),
                "commit": commit,
                "run_id": f"run{ci:02d}{k:02d}",
                "start_time": 1_764_000_000_000 + k * 86_400_000 + ci * 1000,
                "tensors_failing": failing,
                "output_max_abs_diff": diff,
                "regression": broke and k == commits - 3,
                "url": f"#run{ci:02d}{k:02d}",
                "first_divergence": "checker_layers.3.mlp" if broke else None,
            }
            runs.append(run)
            if broke or (target == "tiny_llama" and exact):
                for t in range(10):
                    status = "mismatch" if broke and t >= 3 else "equal"
                    tag_status.append(
                        {"tag": f"checker_layers.{t}.mlp", "commit": commit, "status": status}
                    )
        last = runs[-1]
        status = "regression" if last["tensors_failing"] and exact else "pass"
        if not exact:
            status = "expected" if settings["quantization"] == "int8" else "pass"
        if (
            target == "silero_vad"
            and settings["quantization"] == "int8"
            and settings["cache"] == "first_block"
        ):
            status = "error"
        cells.append(
            {
                "target": target,
                "settings": dict(settings),
                "run_id": last["run_id"],
                "status": status,
                "tensors_failing": last["tensors_failing"] if status != "error" else None,
                "output_max_abs_diff": last["output_max_abs_diff"] if status != "error" else None,
                "url": last["url"],
                "first_divergence": last["first_divergence"],
                "message": "cache not supported with int8" if status == "error" else None,
                "commit": last["commit"],
            }
        )
    return cells, runs, tag_status


def main(argv: list[str] | None = None) -> int:
    """Write the three sample pages into the folder given as the first argument."""
    from .nightly import render_history, render_matrix
    from .report import render_run_report

    out = Path((argv or sys.argv[1:] or ["dashboards-preview"])[0])
    out.mkdir(parents=True, exist_ok=True)
    cells, runs, tag_status = synthetic_nightly()
    (out / "report.html").write_text(render_run_report(synthetic_run()), encoding="utf-8")
    (out / "matrix.html").write_text(render_matrix(cells), encoding="utf-8")
    (out / "history.html").write_text(render_history(runs, tag_status), encoding="utf-8")
    print(f"wrote {out}/report.html, matrix.html, history.html")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
