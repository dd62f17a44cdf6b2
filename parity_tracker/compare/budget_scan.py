"""The budget's error pass in one compiled loop, when ``numba`` is there (issue 19).

:func:`parity_tracker.compare.budget.max_abs_err` widens a side into float64 chunks and
subtracts the golden with torch ops (four passes over each chunk, ≈ 1.8 ns per element on a
bfloat16 side at 8×512). :func:`fast_scan` does the same in one loop
(:mod:`parity_tracker.compare._scan_kernel`): the same float64 differences (the side widened
exactly, then ``side − golden`` rounded once), the same maxima. It answers only for a real
float32, float64 or bfloat16 side against a float64 golden, both CPU, and only when every
difference and golden value is finite; anything else returns ``None`` and the torch path
(with the module's non-finite rule) measures it. Optional like ``compare.fused``'s loop:
without numba, or with ``PARITY_NO_KERNEL`` set, or if the loop fails, ``None`` always.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from parity_tracker.compare.fused import give_up, kernel_loaded
from parity_tracker.compare.hashing import array_in_place

_STATE: dict = {"fn": None, "built": False}
_NP = {torch.float32: np.float32, torch.float64: np.float64, torch.bfloat16: np.uint16}


def _load():
    """The compiled scan, or ``None`` (no numba, ``PARITY_NO_KERNEL``, a broken install)."""
    if not _STATE["built"]:
        _STATE["built"] = True
        if not os.environ.get("PARITY_NO_KERNEL"):
            try:
                from parity_tracker.compare._scan_kernel import scan

                _STATE["fn"] = scan
            except ImportError:
                pass
            except Exception as exc:  # a broken numba install: the torch path is the same
                _give_up(exc)
    return _STATE["fn"]


def _give_up(exc: BaseException) -> None:
    give_up(_STATE, "compiled budget scan", "torch ops", exc)


def loaded() -> bool:
    """Whether the scan can run without a new import: loaded, or loadable at once.

    Loadable at once: the comparison's compiled loop (:func:`parity_tracker.compare.fused.
    kernel_loaded`) has already imported numba, so loading the scan (cached next to the
    package) costs ≈ 5 ms once per process. Small sides (``budget.SMALL``) use the scan only
    then: a process that never loads numba never imports it for them.
    """
    if not _STATE["built"] and kernel_loaded():
        _load()
    return _STATE["fn"] is not None


def _array(s: torch.Tensor) -> np.ndarray | None:
    """The side's elements as numpy (bfloat16 as its ``uint16`` bits), or ``None``.

    Read in place (``hashing.array_in_place``), never through ``numpy()``: that marks a
    model's own tensor's storage not resizable for good (its later ``resize_`` raised), and
    gives a copy-on-write tensor (``torch._lazy_clone``: the checker's snapshots of large
    captures) a private copy of all its bytes first, ≈ 8 ms per 8 MiB float64 golden at 8×512
    (issue 19, wave 6). Writable only so that the loop's compiled signature is that of a
    writable array (it only reads); the caller keeps ``s`` unresized while it reads.
    """
    if s.dtype not in _NP:
        return None
    try:
        return array_in_place(s, _NP[s.dtype], writeable=True)
    except ValueError:  # not a strided CPU tensor, or a conjugate/negative bit
        return None


def fast_scan(s: torch.Tensor, g: torch.Tensor) -> tuple[float, float] | None:
    """``(max |s − g|, max |g|)`` of 1-D contiguous CPU tensors, or ``None`` (module docstring).

    Args:
        s: the side, float32, float64 or bfloat16.
        g: the golden, float64, of ``s``'s length.
    """
    fn = _load()
    if fn is None or g.dtype != torch.float64 or s.device.type != "cpu" or g.device.type != "cpu":
        return None
    if s.numel() != g.numel() or s.numel() == 0:
        return None
    a, b = _array(s), _array(g)
    if a is None or b is None:
        return None
    try:
        worst, top_g, flag = fn(a, b)
    except Exception as exc:  # numba cannot compile here: never lose the scan
        _give_up(exc)
        return None
    if flag != 0.0 or not (math.isfinite(worst) and math.isfinite(top_g)):
        return None
    return float(worst), float(top_g)
