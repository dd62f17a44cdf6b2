"""Which stored run a nightly cell is diffed against (``--baseline auto`` or a run id).

The policy is :func:`choose_baseline`, a pure function over stored runs. Runs are read through
``track.RunStore`` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from parity_tracker.run.mode import baseline_params


def choose_baseline(candidates: Sequence[Any], *, head_run_id: str, head_commit: str | None) -> Any:
    """The baseline among stored runs of one baseline key (``track.RunInfo``, newest first).

    The candidates are the runs of the head's fingerprint and mode (``run.mode.baseline_params``).

    Rule (``--baseline auto``): finished, complete runs (``track.store.is_incomplete``) other
    than the head, started before it, on another
    commit; among those the newest on branch ``main`` if any is on main, else the newest. When
    no other commit has a run, the newest earlier run of the same commit (a re-run) is used.

    Returns:
        The chosen run, or None.
    """
    usable = [r for r in candidates if r.status == "FINISHED" and not getattr(r, "incomplete", 0)]
    earlier = [r for r in usable if r.run_id != head_run_id]
    head = next((r for r in candidates if r.run_id == head_run_id), None)
    if head is not None:
        earlier = [r for r in earlier if r.start_time <= head.start_time]
    other = [r for r in earlier if head_commit is None or r.commit != head_commit]
    on_main = [r for r in other if r.branch == "main"]
    pool = on_main or other or earlier
    return pool[0] if pool else None


def baseline_modules(
    baseline: str,
    *,
    head_run_id: str,
    head_commit: str | None,
    fingerprint: str,
    mode: str,
    store: Any,
) -> tuple[str | None, pa.Table | None]:
    """``(baseline run id, its modules table)`` for one cell, or ``(None, None)``.

    Args:
        baseline: ``auto`` (:func:`choose_baseline` among the runs of the cell's baseline key:
            ``fingerprint`` and ``mode``, ``run.mode.baseline_params``) or a run id.
        head_run_id: the cell's own run (never its own baseline).
        head_commit: the commit under test.
        fingerprint: the cell's ``config_fingerprint``.
        mode: the cell's judged mode (a run of another mode is never its baseline).
        store: a ``track.RunStore``.
    """
    if baseline == "auto":
        runs = store.find(**baseline_params(fingerprint, mode))
        chosen = choose_baseline(runs, head_run_id=head_run_id, head_commit=head_commit)
        if chosen is None:
            return None, None
        baseline = chosen.run_id
    return baseline, store.modules_tables([baseline])[0]


def resolve_baseline_runs(baseline: str, store: Any) -> dict[str, str] | None:
    """The runs an explicit ``--baseline RUN_ID`` means, as ``{baseline key: run id}``.

    Keys are ``run.mode.baseline_key`` (fingerprint and mode): a cell is paired with the run of
    its own key only.

    A nightly parent run gives its children; a parity run gives itself
    (``track.RunStore.baseline_runs``). ``auto`` gives None.

    Raises:
        InputError: no run ``RUN_ID`` in the store (names it).
        InfrastructureError: the store could not be reached.
    """
    return None if baseline == "auto" else store.baseline_runs(baseline)
