"""The worst tensor's histogram of elementwise differences, and why a report may lack it.

The tables hold one row of metrics per tensor, not the elements, so the histogram needs the
tensors themselves. It is computed where they are: by the run stage (stored as
``summary["worst_tensor_histogram"]``, the dict
:func:`parity_tracker.run.histogram.diff_histogram` returns) or, failing that, from the run's
local dump folder (:func:`parity_tracker.run.histogram.read_dump_histogram`, re-exported here as
``histogram_from_dump``: ``(histogram, problem)``). When neither gives it,
:func:`missing_reason` says exactly why and how to get it.

The worst tensor is :func:`parity_tracker.compare.verdict.worst_tensor`'s: the one rule the
CLI, the JSON summary and the report share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from parity_tracker.compare.verdict import worst_tensor
from parity_tracker.run.histogram import diff_histogram
from parity_tracker.run.histogram import read_dump_histogram as histogram_from_dump
from parity_tracker.statuses import is_failing

__all__ = [
    "diff_histogram",
    "histogram_from_dump",
    "missing_reason",
    "pick_worst",
    "worst_tensor_histogram",
]


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


def worst_tensor_histogram(result: Any) -> dict | None:
    """:func:`diff_histogram` of the worst tensor (:func:`pick_worst`) read from the run's dump.

    Returns None when the run has no local dump or the worst tensor was not dumped.
    """
    hist, _ = histogram_from_dump(getattr(result, "dump_dir", None), pick_worst(result.modules))
    return hist


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
