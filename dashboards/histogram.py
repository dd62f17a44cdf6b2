"""The worst tensor's histogram of elementwise differences, and why a report may lack it.

The tables hold one row of metrics per tensor, not the elements, so the histogram needs the
tensors themselves. It is computed where they are: by the run stage (stored as
``summary["worst_tensor_histogram"]``, the dict :func:`diff_histogram` returns) or, failing
that, from the run's local dump folder (:func:`histogram_from_dump`). When neither gives it,
:func:`missing_reason` says exactly why and how to get it.

The worst tensor is :func:`parity_tracker.compare.verdict.worst_tensor`'s: the one rule the
CLI, the JSON summary and the report share.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from parity_tracker.compare.verdict import worst_tensor
from parity_tracker.statuses import is_failing


def pick_worst(modules: Any) -> dict[str, Any] | None:
    """The worst failing tensor of a run, when it has elementwise differences to histogram.

    The row :func:`parity_tracker.compare.verdict.worst_tensor` names (lowest ``sqnr_db``
    among ``mismatch`` rows, ties and null SQNR broken by the largest ``max_abs_diff``), if
    its status is ``mismatch``; a worst row of another failing status (shape mismatch, missing,
    error) has no elementwise difference, so None.

    Args:
        modules: the ``modules`` table (``pyarrow.Table``) or a list of row dicts.

    Returns:
        That row as a dict (``tag``, ``step``, ...), or None.
    """
    if modules is None:
        return None
    worst = worst_tensor(modules)
    return dict(worst) if worst is not None and worst.get("status") == "mismatch" else None


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
    non-zero differences go into ``bins`` bins equally wide in log10 between the smallest and the
    largest non-zero difference. Elements where either side is NaN or inf are counted in
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
        ``"log"``. Store it as ``summary["worst_tensor_histogram"]``.

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


def worst_tensor_histogram(result: Any) -> dict | None:
    """:func:`diff_histogram` of the worst tensor (:func:`pick_worst`) read from the run's dump.

    Returns None when the run has no local dump or the worst tensor was not dumped.
    """
    hist, _ = histogram_from_dump(getattr(result, "dump_dir", None), pick_worst(result.modules))
    return hist


def histogram_from_dump(
    dump_dir: Any, worst: Mapping[str, Any] | None
) -> tuple[dict | None, str | None]:
    """:func:`diff_histogram` of ``worst`` read back from a dump folder, or why not.

    Reads ``index.json`` (``parity_tracker.dump`` format: entries with ``tag``, ``step``,
    ``side`` 0 = reference / 1 = candidate, ``file``); quantized entries (stored as their
    integer representation) are not used. Never raises: the report never fails on a missing or
    partial dump.

    Returns:
        ``(histogram, None)``, or ``(None, problem)`` with ``problem`` one line of text when the
        folder was given but could not serve the histogram (None when there is no folder or no
        worst tensor: :func:`missing_reason` explains those).
    """
    if not dump_dir or not worst:
        return None, None
    folder = Path(dump_dir)
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
            return None, f"the dump folder {folder} holds no unquantized pair of that tensor"
        ref = np.load(folder / mine[0]["file"], allow_pickle=False)
        cand = np.load(folder / mine[1]["file"], allow_pickle=False)
        return diff_histogram(ref, cand, tag=worst.get("tag"), step=worst.get("step")), None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"the dump folder {folder} could not be read ({type(exc).__name__}: {exc})"


def missing_reason(
    rows: Sequence[Mapping[str, Any]],
    worst: Mapping[str, Any] | None,
    *,
    dump_dir: Any,
    dump_mode: str | None,
    problem: str | None,
) -> tuple[str, bool]:
    """Why a run report has no histogram: ``(sentence, rerun_with_dump)``.

    Never says "no tensor failed" when one did. ``rerun_with_dump`` is True when rerunning with
    a dump mode that keeps the failing tensors (``--dump-mode not_equal``) would give the
    histogram; the report then says so.

    Args:
        rows: the run's module rows.
        worst: :func:`pick_worst` of those rows.
        dump_dir: the run's local dump folder, or None.
        dump_mode: the run's ``DumpMode`` value when the run recorded it, else None.
        problem: what :func:`histogram_from_dump` reported, if anything.
    """
    failing = [r for r in rows if is_failing(r.get("status"))]
    if not failing:
        return "no tensor failed, so there is no worst tensor to show.", False
    if worst is None:
        statuses = ", ".join(sorted({str(r.get("status")) for r in failing}))
        return (
            f"{len(failing)} tensor(s) failed, none with a value mismatch ({statuses}): a shape "
            "mismatch, a missing tensor or an error has no elementwise difference to histogram.",
            False,
        )
    step = "" if worst.get("step") is None else f" (step {worst['step']})"
    head = f"{len(failing)} tensor(s) failed; the worst is {worst.get('tag')}{step}, but "
    mode = f"dump mode {dump_mode}" if dump_mode else "the run's dump mode"
    dumped = [r for r in rows if r.get("dump_path")]
    if not worst.get("dump_path") and not dumped:
        return head + f"this run dumped no tensor ({mode}).", True
    if not worst.get("dump_path"):
        return (
            head + f"it was not dumped: {mode} kept only {len(dumped)} other tensor(s) "
            f"(e.g. {dumped[0].get('tag')}).",
            True,
        )
    if problem:
        return head + problem + ".", True
    if not dump_dir:
        return (
            head + f"its dump ({worst.get('dump_path')}) is not on this machine: the report was "
            "built from the stored tables, and the run record holds no worst_tensor_histogram. "
            "The dumped tensors are linked in the module table below.",
            False,
        )
    return head + f"its dump in {dump_dir} could not be read.", True


def _float64(x: Any) -> np.ndarray:
    """A numpy float64 array of ``x`` (a torch tensor, complex → magnitude, or array-like)."""
    if hasattr(x, "detach"):  # torch tensor, without importing torch
        x = x.detach().cpu()
        if x.is_complex():
            x = x.abs()
        x = x.double().numpy()
    return np.asarray(x, dtype=np.float64)
