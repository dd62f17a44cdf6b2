"""One night's runs: the parent run of every shard carrying a night id, and their cells.

Every shard of one nightly tags its parent run ``parity.night = <night id>``
(``parents.TAG_NIGHT``) and attaches ``cells.json`` (the cells it plans to run) before running
any. ``night_runs`` finds them all again, whichever machine ran which shard.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parity_tracker.errors import InputError
from parity_tracker.track.parents import KIND_NIGHT as KIND_NIGHT
from parity_tracker.track.parents import (
    KIND_PARENT,
    KIND_SHARD,
    SHARD_RUNS_CUT,
    TAG_KIND,
    TAG_NIGHT,
    TAG_SHARD_RUNS,
)
from parity_tracker.track.records import RunInfo
from parity_tracker.track.search import _quote
from parity_tracker.track.store import get_client, retry

#: How each kind of parent run is named in messages.
_KIND_WORDS = {KIND_NIGHT: "night parent run", KIND_SHARD: "nightly shard parent run",
               KIND_PARENT: "parent run"}  # fmt: skip


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
        f"tags.`{TAG_NIGHT}` = {_quote(night)} and tags.`{TAG_KIND}` = '{KIND_SHARD}'",
    )
    children: list[RunInfo] = []
    for parent in parents:  # MLflow's tag filters have no IN: one search per shard
        filt = f"tags.`mlflow.parentRunId` = {_quote(parent.run_id)}"
        children += _search_all(client, exp.experiment_id, filt)
    return parents, children


def parent_kind(tags: Mapping[str, str]) -> str | None:
    """``KIND_NIGHT``, ``KIND_SHARD`` or ``KIND_PARENT`` for a run parity runs nest under.

    From the run's tag ``parity.kind`` (``parents.TAG_KIND``); None for any other run (a cell,
    a single parity run).
    """
    kind = tags.get(TAG_KIND)
    return kind if kind in _KIND_WORDS else None


def shard_run_ids(tags: Mapping[str, str]) -> list[str]:
    """The shard parent run ids a night parent's ``parity.shard_runs`` tag lists.

    The tag is cut at ``SHARD_RUNS_CUT`` characters (``pipeline.night.merge_night``): an id
    shorter than the first one (MLflow run ids have one length) is a cut one and left out.
    """
    ids = [i for i in (tags.get(TAG_SHARD_RUNS) or "").split(",") if i]
    return [i for i in ids if len(i) == len(ids[0])]


def _cut(value: str) -> bool:
    """Whether a ``parity.shard_runs`` value was cut (``SHARD_RUNS_CUT``).

    As long as the cut, or its last id shorter than its first: a cut at 5,000 characters always
    ends inside an id (k ids of 32 joined by commas are 33 k - 1 long).
    """
    ids = value.split(",")
    return len(value) >= SHARD_RUNS_CUT or len(ids[-1]) < len(ids[0])


def _night_shards(client: Any, exp_id: str, tags: Mapping[str, str], started: int) -> list[str]:
    """A night parent's shard parent run ids: the shards its merge used, oldest first.

    The ``parity.shard_runs`` tag lists them (:func:`shard_run_ids`): a shard of the night
    reported again after the merge (a retried job, a reused ``--night``) or a retry the merge
    ignored is not what the night parent's digest shows, so it is never part of it. When the
    tag was cut (a night of more than ~150 shards), the shards tagged with its night
    (``TAG_NIGHT``, ``TAG_KIND`` = ``KIND_SHARD``) started before the night parent (``started``,
    ms) stand in for it; a night parent without a night tag has only its tag.
    """
    listed = shard_run_ids(tags)
    night = tags.get(TAG_NIGHT)
    if not night or not _cut(tags.get(TAG_SHARD_RUNS) or ""):
        return listed
    filt = f"tags.`{TAG_NIGHT}` = {_quote(night)} and tags.`{TAG_KIND}` = {_quote(KIND_SHARD)}"
    found = _search_all(client, exp_id, filt)
    before = [r for r in found if r.run_id in listed or r.start_time <= started]
    return [r.run_id for r in sorted(before, key=lambda r: (r.start_time, r.run_id))] or listed


def cell_runs(uri: str, run: Any, limit: int | None = None) -> list[RunInfo]:
    """The cell runs a parent run (an ``mlflow.entities.Run``) stands for, oldest first.

    A night parent: the child runs of the shards its merge used (:func:`_night_shards`); any other
    run: its own child runs (tag ``mlflow.parentRunId``). Incomplete runs are left out
    (``store.is_incomplete``: they have no tables to diff). With ``limit``, the shards are
    searched only until that many cells are found (for a message).

    Raises:
        Exception: whatever MLflow raises when the store cannot be reached.
    """
    tags = dict(run.data.tags)
    client, exp_id = get_client(uri), run.info.experiment_id
    if parent_kind(tags) == KIND_NIGHT:
        parents = _night_shards(client, exp_id, tags, run.info.start_time)
    else:
        parents = [run.info.run_id]
    out: list[RunInfo] = []
    for parent in parents:  # MLflow's tag filters have no IN: one search per parent
        found = _search_all(client, exp_id, f"tags.`mlflow.parentRunId` = {_quote(parent)}")
        out += [r for r in found if not r.incomplete]
        if limit is not None and len(out) >= limit:
            break
    return sorted(out, key=lambda r: (r.start_time, r.run_id))


def describe_parent(run: Any) -> str:
    """``night parent run (night N1)`` for messages; '' when ``run`` is no parent."""
    tags = dict(run.data.tags)
    kind = parent_kind(tags)
    if kind is None:
        return ""
    night = f" (night {tags[TAG_NIGHT]})" if tags.get(TAG_NIGHT) else ""
    return f"{_KIND_WORDS[kind]}{night}"


def parent_error(uri: str, run: Any, what: str = "tables") -> InputError | None:
    """The error for a parent run given where a cell run is needed; None for other runs.

    Names the run as a night/shard parent and lists up to 4 of its cells' run ids (one
    search per shard; a store fault while listing them only leaves them out).
    """
    name = describe_parent(run)
    if not name:
        return None
    try:
        cells = cell_runs(uri, run, limit=4)  # a few: one search per shard until found
    except Exception:  # the listing is a courtesy: the error stays an input error
        cells = None
    if cells:
        shown = ", ".join(
            f"{c.run_id} ({c.tags.get('mlflow.runName') or c.settings})" for c in cells[:4]
        )
        hint = f"; pass a cell's run id, e.g. {shown}"
    else:
        hint = "; pass a cell's run id (it has no stored cell run)" if cells == [] else (
            "; pass one of its cells' run ids")  # fmt: skip
    return InputError(f"run {run.info.run_id} is a {name}: it holds no parity {what}, only its "
                      f"cells do{hint}")  # fmt: skip
