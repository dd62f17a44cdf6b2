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

from parity_tracker.compare.verdict import worst_key


def _float64(x: Any) -> np.ndarray:
    """A numpy float64 array of ``x`` (a torch tensor, complex → magnitude, or array-like)."""
    if hasattr(x, "detach"):  # a torch tensor, without importing torch
        from parity_tracker.compare.hashing import numpy_in_place

        x = x.detach().cpu()
        if x.is_complex():
            x = x.abs()
        # read in place: .numpy() of a float64 input (.double() returns it as it is) would
        # mark the caller's storage not resizable for good (w9trust)
        x = numpy_in_place(x.double().resolve_neg())
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

    Returns None when the folder, either side, or a readable pair of equal shape is missing:
    a histogram is never guessed. :func:`read_dump_histogram` also says why.
    """
    return read_dump_histogram(folder, worst)[0]


def read_dump_histogram(
    folder: Any, worst: Mapping[str, Any] | None
) -> tuple[dict[str, Any] | None, str | None]:
    """``diff_histogram`` of ``worst`` read back from a dump folder, or why not.

    Reads ``index.json`` (``files.dump`` format: entries with ``tag``, ``step``, ``side``
    0 = reference / 1 = candidate, ``file``); quantized entries (stored as their integer
    representation) are not used. Never raises: a missing or partial dump only loses the
    histogram.

    Returns:
        ``(histogram, None)``, or ``(None, problem)`` with ``problem`` one line of text when the
        folder was given but could not serve the histogram (``(None, None)`` when there is no
        folder or no worst tensor).
    """
    if not folder or not worst:
        return None, None
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
            return None, f"the dump folder {folder} holds no unquantized pair of that tensor"
        ref = np.load(folder / mine[0]["file"], allow_pickle=False)
        cand = np.load(folder / mine[1]["file"], allow_pickle=False)
        return diff_histogram(ref, cand, tag=worst.get("tag"), step=worst.get("step")), None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"the dump folder {folder} could not be read ({type(exc).__name__}: {exc})"


def _private_copy(t: Any) -> Any:
    """A dense CPU copy of ``t`` that no later write to ``t`` reaches (quantized: dequantized)."""
    from parity_tracker.compare.convert import dense_cpu  # torch: not at import (read-only CLI)

    t = dense_cpu(t)
    return t.dequantize() if t.is_quantized else t.clone()


class WorstPair:
    """``on_compared`` callback of the checker: keeps the worst value mismatch seen so far.

    The ordering is :func:`parity_tracker.compare.verdict.worst_key` (the one rule the run
    summary's ``worst_tensor`` follows). Only pairs of status ``mismatch`` are kept (the other
    failing statuses have no elementwise difference to draw); a pair that beats the current
    worst replaces it, a pair that ties it is kept beside it (the summary breaks ties by row
    order, which only the finished table knows). Both tensors are copied when kept: the
    candidate is the live tensor on the eager path and may be written afterwards. Tied pairs
    with the same content hashes share one copy. No second check, no dump is needed
    (issue 13, item 6).
    """

    #: the statuses this callback acts on: the checker need not report pairs of other statuses
    #: (``compare.pairing.PairComparer``'s ``on_compared``; issue 19, the bulk path)
    statuses = frozenset({"mismatch"})

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._kept: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._by_hash: dict[tuple[str | None, str | None], tuple[Any, Any]] = {}

    def __call__(self, tag: str, step: int, reference: Any, candidate: Any, comparison) -> None:
        """Consider one compared pair (signature of ``PairComparer``'s ``on_compared``)."""
        if comparison.status not in self.statuses:
            return
        row = {
            "status": comparison.status,
            "sqnr_db": comparison.sqnr_db,
            "max_abs_diff": comparison.max_abs_diff,
        }
        key = worst_key(row)
        if self._key is not None and key > self._key:
            return
        if self._key is None or key < self._key:
            self._key, self._kept, self._by_hash = key, {}, {}
        hashes = (comparison.ref_hash, comparison.cand_hash)
        pair = self._by_hash.get(hashes) if None not in hashes else None
        if pair is None:
            try:
                pair = (_private_copy(reference), _private_copy(candidate))
            except Exception:  # no readable data (meta, fake): no histogram, never a crash
                return
            self._by_hash[hashes] = pair
        self._kept[(tag, int(step or 0))] = pair

    def histogram(self, worst: Mapping[str, Any] | None, **kwargs: Any) -> dict[str, Any] | None:
        """``diff_histogram`` of the ``worst`` row (``tag``, ``step``) when its pair was kept."""
        if not worst:
            return None
        pair = self._kept.get((worst.get("tag"), int(worst.get("step") or 0)))
        if pair is None:
            return None
        return diff_histogram(*pair, tag=worst.get("tag"), step=worst.get("step"), **kwargs)
