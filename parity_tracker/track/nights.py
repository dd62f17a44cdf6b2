"""One night's runs: the parent run of every shard carrying a night id, and their cells.

Every shard of one nightly tags its parent run ``parity.night = <night id>``
(``parents.TAG_NIGHT``) and attaches ``cells.json`` (the cells it plans to run) before running
any. ``night_runs`` finds them all again, whichever machine ran which shard.
"""

from __future__ import annotations

from typing import Any

from parity_tracker.track.parents import TAG_NIGHT
from parity_tracker.track.records import RunInfo
from parity_tracker.track.search import _quote
from parity_tracker.track.store import get_client, retry

#: ``parity.kind`` of a shard's parent run and of the night's merged parent run.
KIND_SHARD, KIND_NIGHT = "nightly", "night"


def _search_all(client: Any, exp_id: str, filt: str) -> list[RunInfo]:
    out, token = [], None
    while True:
        page = retry(client.search_runs, [exp_id], filt, max_results=1000, page_token=token)
        out += [RunInfo.from_mlflow(r) for r in page]
        token = page.token
        if not token:
            return out


def night_runs(uri: str, experiment: str, night: str) -> tuple[list[RunInfo], list[RunInfo]]:
    """``(shard parent runs, their child runs)`` of night ``night``, newest first.

    Parents: runs tagged ``parity.night = night`` and ``parity.kind = nightly``; children: runs
    whose ``mlflow.parentRunId`` is one of them. Both empty when the experiment is absent.

    Raises:
        Exception: whatever MLflow raises when the store cannot be reached (``RunStore``
            turns it into ``InfrastructureError``).
    """
    client = get_client(uri)
    exp = retry(client.get_experiment_by_name, experiment)
    if exp is None:
        return [], []
    parents = _search_all(
        client,
        exp.experiment_id,
        f"tags.`{TAG_NIGHT}` = {_quote(night)} and tags.`parity.kind` = '{KIND_SHARD}'",
    )
    children: list[RunInfo] = []
    for parent in parents:  # MLflow's tag filters have no IN: one search per shard
        filt = f"tags.`mlflow.parentRunId` = {_quote(parent.run_id)}"
        children += _search_all(client, exp.experiment_id, filt)
    return parents, children
