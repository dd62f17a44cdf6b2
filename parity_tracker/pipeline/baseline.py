"""Which stored run a nightly cell is diffed against (``--baseline auto`` or a run id).

The policy is :func:`choose_baseline`, a pure function over stored runs. Runs are read through
``track.RunStore`` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from parity_tracker.errors import InputError
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


def resolve_baseline_runs(
    baseline: str, store: Any, cells: Sequence[Any] = ()
) -> dict[str, str] | None:
    """The runs an explicit ``--baseline RUN_ID`` means, as ``{baseline key: run id}``.

    Keys are ``run.mode.baseline_key`` (fingerprint and mode): a cell is paired with the run of
    its own key only.

    A parity run gives itself, a shard's parent run its cells, a night's merged parent run
    the cells of every shard it lists (``track.RunStore.baseline_infos``). ``auto`` gives
    None. Checked before any cell runs (:func:`check_baseline_covers`), so a bad baseline
    costs nothing.

    Args:
        baseline: ``auto`` or a run id (any unique prefix).
        store: a ``track.RunStore``.
        cells: the shard's cells (``pipeline.matrix.Cell``); none: not checked.

    Raises:
        InputError: no run ``RUN_ID`` in the store (names it), or it covers none of ``cells``.
        InfrastructureError: the store could not be reached.
    """
    from parity_tracker.track.query import baseline_map

    if baseline == "auto":
        return None
    infos = store.baseline_infos(baseline)
    check_baseline_covers(baseline, infos, cells)
    return baseline_map(infos)


def _covers(run: Any, cell: Any) -> bool:
    """Whether stored ``run`` is of ``cell``'s configuration, judged before the cell runs.

    The nightly names each cell's run after the cell (``Cell.name``); a run logged otherwise
    matches when its params hold the cell's target and every setting of the cell. (The exact
    pairing, by config fingerprint and mode, is made once the cell ran.)
    """
    from parity_tracker.track.store import param_key

    if run.tags.get("mlflow.runName") == cell.name:
        return True
    params = run.params
    return params.get("target") == cell.target and all(
        params.get(param_key(k)) == str(v) for k, v in cell.settings
    )


def check_baseline_covers(baseline: str, runs: Sequence[Any], cells: Sequence[Any]) -> None:
    """Refuse an explicit baseline that covers none of ``cells``, before any of them runs.

    Args:
        baseline: the ``--baseline`` value, for the message.
        runs: the stored runs it stands for (``track.RunInfo``).
        cells: the shard's cells; none: nothing to check.

    Raises:
        InputError: ``runs`` is empty (a run that is neither a parity run nor a parent of
            any), or none of them is of any cell's configuration (:func:`_covers`); names a
            few of its runs and the fix.
    """
    if not cells:
        return
    fix = ("--baseline auto, a cell run of the same configuration, or the parent run of a "
           "night or shard that ran these cells")  # fmt: skip
    if not runs:
        raise InputError(
            f"--baseline {baseline} stands for no stored parity run (not a parity run, nor a "
            f"nightly or night parent with stored cells); use {fix}"
        )
    if any(_covers(run, cell) for cell in cells for run in runs):
        return
    names = [r.tags.get("mlflow.runName") or r.run_id for r in runs]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    raise InputError(
        f"--baseline {baseline} covers none of this shard's {len(cells)} cells (e.g. "
        f"{cells[0].name}): its {len(runs)} run(s) are {shown}; nothing was run. Use {fix}"
    )
