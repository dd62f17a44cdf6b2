"""The histogram of |candidate − reference| of one tensor pair, for the run record.

Computed in the run stage, where the tensors are (or from the run's local dump), so a failing
run always records the histogram of its worst tensor (``RunSummary.worst_tensor_histogram``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def _float64(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, without importing torch
        x = x.detach().cpu()
        if x.is_complex():
            x = x.abs()
        x = x.double().numpy()
    return np.asarray(x, dtype=np.float64)


def diff_histogram(
    reference: Any,
    candidate: Any,
    *,
    tag: str | None = None,
    step: int | None = None,
    bins: int = 48,
) -> dict[str, Any]:
    """Histogram of the elementwise absolute differences ``|candidate - reference|``.

    Computed in float64 numpy. Exact zeros are counted apart (a log axis cannot show them);
    non-zero differences go into ``bins`` bins equally wide in log10 between the smallest and
    the largest non-zero difference. Elements where either side is NaN or inf are counted in
    ``nonfinite`` and left out of the bins.

    Args:
        reference: the reference tensor (numpy array, torch tensor, or array-like).
        candidate: the candidate tensor, same shape as ``reference``.
        tag: the tensor's tag, shown as the chart's subject.
        step: its step in a multi-step run.
        bins: number of log-spaced bins (≥ 1).

    Returns:
        ``{"tag", "step", "numel", "zero_count", "nonfinite", "edges", "counts", "scale"}``
        with ``edges`` (``len(counts) + 1`` floats, ascending) and ``counts`` (ints), ``scale``
        ``"log"``.

    Raises:
        ValueError: the shapes differ or ``bins`` < 1.
    """
    r, c = _float64(reference), _float64(candidate)
    if r.shape != c.shape:
        raise ValueError(
            f"diff_histogram: reference shape {r.shape} != candidate shape {c.shape}; "
            "a histogram of elementwise differences needs equal shapes"
        )
    if bins < 1:
        raise ValueError(f"diff_histogram: bins must be >= 1, got {bins}")
    ok = np.isfinite(r) & np.isfinite(c)
    d = np.abs(c[ok] - r[ok])
    nonzero = d[d > 0]
    out: dict[str, Any] = {
        "tag": tag,
        "step": step,
        "numel": int(r.size),
        "zero_count": int(d.size - nonzero.size),
        "nonfinite": int(r.size - d.size),
        "scale": "log",
        "edges": [],
        "counts": [],
    }
    if nonzero.size:
        lo, hi = float(nonzero.min()), float(nonzero.max())
        if hi <= lo * (1 + 1e-9):
            lo, hi = lo / 3.0, hi * 3.0
        edges = np.logspace(np.log10(lo), np.log10(hi), bins + 1)
        edges[0], edges[-1] = lo, hi  # exact ends: every value lands in a bin
        counts, _ = np.histogram(nonzero, bins=edges)
        out["edges"] = [float(e) for e in edges]
        out["counts"] = [int(n) for n in counts]
    return out


def histogram_from_dump(folder: Any, worst: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``diff_histogram`` of ``worst`` (``tag``, ``step``) read from one check's dump folder.

    Reads ``index.json`` (``files.dump`` format: entries with ``tag``, ``step``, ``side``
    0 = reference / 1 = candidate, ``file``); quantized entries (stored as their integer
    representation) are not used. Returns None when the folder, either side, or a readable
    pair of equal shape is missing: a histogram is never guessed.
    """
    if not folder or not worst:
        return None
    folder = Path(folder)
    try:
        entries = json.loads((folder / "index.json").read_text())["files"]
        step = worst.get("step") or 0
        mine = {
            e.get("side"): e
            for e in entries
            if e.get("tag") == worst.get("tag")
            and (e.get("step") or 0) == step
            and "file" in e
            and "qscheme" not in e
        }
        if 0 not in mine or 1 not in mine:
            return None
        ref = np.load(folder / mine[0]["file"], allow_pickle=False)
        cand = np.load(folder / mine[1]["file"], allow_pickle=False)
        return diff_histogram(ref, cand, tag=worst.get("tag"), step=worst.get("step"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
