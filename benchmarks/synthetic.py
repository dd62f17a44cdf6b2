"""Synthetic ``modules`` tables and stored runs for the storage and query measurements.

The tables have every column of ``tables.MODULES_SCHEMA`` filled the way an equal-mode run fills
them (statuses, shapes, dtypes, 16-hex xxh64 hashes, metrics), with a small fraction of
mismatching rows carrying non-zero differences, so parquet's compression sees realistic data.
Built with numpy and pyarrow column by column (no per-row Python), so 100,000 rows take
well under a second to make.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

import numpy as np
import pyarrow as pa

LEAVES = (
    "",
    "_input_0",
    ".weight",
    ".bias",
    ".self_attn",
    ".self_attn.out_proj",
    ".linear1",
    ".norm1",
)
SHAPES = ((2, 256, 512), (512, 512), (512,), (2, 256, 2048), (2048, 512))
SHAPE_NUMEL = np.array([int(np.prod(s)) for s in SHAPES], dtype=np.int64)


@functools.lru_cache(maxsize=4)
def _layout(n_rows: int) -> tuple[pa.Array, pa.Array, pa.Array, np.ndarray, pa.Array]:
    """Tags, modules, shapes, numel and reference hashes: the same for every run of n_rows."""
    base = np.random.default_rng(0)
    tags = [f"checker_layers.{i // len(LEAVES)}{LEAVES[i % len(LEAVES)]}" for i in range(n_rows)]
    modules = [t.removeprefix("checker_").split("_input")[0] for t in tags]
    pick = base.integers(0, len(SHAPES), size=n_rows)
    shapes = pa.array([SHAPES[k] for k in pick], pa.list_(pa.int64()))
    ref_hash = pa.array(_hashes(base, n_rows), pa.string())
    return (
        pa.array(tags, pa.string()),
        pa.array(modules, pa.string()),
        shapes,
        SHAPE_NUMEL[pick],
        ref_hash,
    )


def _hashes(rng: np.random.Generator, n: int) -> list[str]:
    return [f"{int(v):016x}" for v in rng.integers(0, 2**63, size=n, dtype=np.int64)]


def _nullable(values: np.ndarray, mask: np.ndarray, typ: pa.DataType) -> pa.Array:
    return pa.array(values, type=typ, mask=~mask)


def modules_table(
    n_rows: int,
    *,
    seed: int = 0,
    run_id: str | None = None,
    failing_fraction: float = 0.02,
) -> pa.Table:
    """A synthetic ``modules`` table of ``n_rows`` unique tags (step 0).

    Args:
        n_rows: rows (one tag each: ``checker_layers.{i // 8}{leaf}``).
        seed: RNG seed; the same seed gives the same tags, shapes and reference hashes, so two
            tables with different seeds for their failures only still join on every tag.
        run_id: the ``run_id`` column (a fresh uuid4 hex when None).
        failing_fraction: share of rows with status ``mismatch`` and non-zero differences.

    Returns:
        A table with exactly ``tables.MODULES_SCHEMA``.
    """
    from parity_tracker.files.tables import MODULES_SCHEMA, conform

    rng = np.random.default_rng(seed)
    tags, modules, shapes, numel, ref_hash = _layout(n_rows)
    idx = np.arange(n_rows)
    kinds = np.array(["output", "input", "param", "param", "output", "output", "output", "output"])
    bad = rng.random(n_rows) < failing_fraction
    cand_hash = pa.array(np.where(bad, _hashes(rng, n_rows), ref_hash.to_numpy(False)), pa.string())
    mad = np.where(bad, rng.lognormal(-12, 2, n_rows), 0.0)
    count = np.where(bad, (numel * rng.random(n_rows)).astype(np.int64) + 1, 0)
    zeros = np.zeros(n_rows, dtype=np.int64)
    cols: dict[str, Any] = {
        "run_id": pa.array([run_id or uuid.uuid4().hex] * n_rows, pa.string()),
        "tag": tags,
        "module": modules,
        "kind": pa.array(kinds[idx % len(LEAVES)], pa.string()),
        "slot": pa.array(np.where(idx % len(LEAVES) == 1, "input_0", "output"), pa.string()),
        "call_index": pa.array(zeros.astype(np.int32)),
        "exec_order": pa.array(idx.astype(np.int32)),
        "step": pa.array(zeros.astype(np.int32)),
        "status": pa.array(np.where(bad, "mismatch", "equal"), pa.string()),
        "mode": pa.array(["equal"] * n_rows, pa.string()),
        "numel": pa.array(numel),
        "ref_shape": shapes,
        "cand_shape": shapes,
        "ref_dtype": pa.array(["float32"] * n_rows, pa.string()),
        "cand_dtype": pa.array(["float32"] * n_rows, pa.string()),
        "ref_device": pa.array(["cpu"] * n_rows, pa.string()),
        "cand_device": pa.array(["cpu"] * n_rows, pa.string()),
        "mismatch_count": pa.array(count),
        "max_abs_diff": pa.array(mad),
        "max_rel_diff": pa.array(np.where(bad, mad * 10, 0.0)),
        "mean_abs_diff": pa.array(np.where(bad, mad / 10, 0.0)),
        "cosine": pa.array(np.where(bad, 1 - mad, 1.0)),
        "sqnr_db": _nullable(rng.uniform(60, 140, n_rows), bad, pa.float64()),
        "max_ulp": pa.array(np.where(bad, rng.integers(1, 64, n_rows), 0).astype(np.float64)),
        "ref_nan": pa.array(zeros),
        "cand_nan": pa.array(zeros),
        "ref_inf": pa.array(zeros),
        "cand_inf": pa.array(zeros),
        "ref_hash": ref_hash,
        "cand_hash": cand_hash,
        "message": pa.array(
            np.where(bad, "max abs diff at the worst element exceeds 0 (equal mode)", ""),
            pa.string(),
        ),
    }
    return conform(pa.table(cols), MODULES_SCHEMA)


def run_result(n_rows: int, *, seed: int, commit: str, target: str) -> Any:
    """A ``RunResult`` around ``modules_table(n_rows, seed=seed)`` (no ops), as run_parity makes.

    The summary comes from ``parity_tracker.run.build_summary``, so params, metrics and tags
    logged from it are exactly those of a real run of the same shape.
    """
    from parity_tracker.files.tables import OPS_SCHEMA
    from parity_tracker.run import RunResult, build_summary

    run_id = uuid.uuid4().hex
    modules = modules_table(n_rows, seed=seed, run_id=run_id)
    ops = OPS_SCHEMA.empty_table()
    settings = {"target": target, "quantization": "none", "cache": "off", "device": "cpu"}
    env = {"git_commit": commit, "git_branch": "main", "git_dirty": False, "num_threads": 1}
    summary = build_summary(
        modules,
        ops,
        run_id=run_id,
        status="completed",
        mode="equal",
        mode_reason="benchmark",
        requested_mode="equal",
        settings=settings,
        environment=env,
    )
    return RunResult(run_id, modules, ops, summary, settings=settings)
