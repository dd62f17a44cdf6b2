"""Runs that parity runs nest under (a nightly's parent run), and files attached afterwards."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from parity_tracker.errors import InfrastructureError, InputError
from parity_tracker.track.browse import (
    TAG_DESCRIPTION,
    TAG_SOURCE_NAME,
    TAG_SOURCE_TYPE,
    Source,
    clip,
)
from parity_tracker.track.log import _BATCH, _chunks
from parity_tracker.track.stage import _param_value
from parity_tracker.track.store import (
    get_client,
    get_or_create_experiment,
    param_key,
    resolve_tracking_uri,
    retry,
)

#: Tag of a nightly's parent run: the night it belongs to (all shards of a night share it).
TAG_NIGHT = "parity.night"
#: Tag of a nightly's parent run: ``pipeline.matrix.matrix_hash`` of the whole matrix it was cut
#: from (every shard of one night must carry the same).
TAG_MATRIX = "parity.matrix_hash"
#: Tags of a shard's parent run: the expected-divergence file it applied (absolute path) and
#: the xxh3 of its bytes (``analysis.expected.expected_file_record``); both empty when it
#: applied none. ``nightly-merge`` applies the same file, or refuses.
TAG_EXPECTED_PATH = "parity.expected_path"
TAG_EXPECTED_HASH = "parity.expected_xxh3"
#: Tag of a run that parity runs nest under: which kind of parent it is (``KIND_*``).
TAG_KIND = "parity.kind"
#: ``parity.kind`` of a plain parent run, of a shard's parent run (its cells are its child
#: runs) and of a night's merged parent run (its cells are the children of its shards).
KIND_PARENT, KIND_SHARD, KIND_NIGHT = "parent", "nightly", "night"
#: Tag of a night's merged parent run: its shards' parent run ids, comma-separated (cut at
#: ``SHARD_RUNS_CUT``, below MLflow's 8,000-character tag limit; ``nights.shard_run_ids`` drops
#: a cut id and ``nights`` then falls back to the night's shards started before the parent).
TAG_SHARD_RUNS = "parity.shard_runs"
#: Length ``TAG_SHARD_RUNS`` is cut at: a value this long may be cut (ids of 32 characters
#: joined by commas are 33 k - 1 long, never exactly this).
SHARD_RUNS_CUT = 5000


def start_parent_run(
    *,
    tracking_uri: str | None = None,
    experiment: str = "parity",
    run_name: str | None = None,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
    commit: str | None = None,
    branch: str | None = None,
    source: Source | None = None,
) -> str:
    """Open a run that parity runs nest under (``log_run(parent_run_id=...)``); returns its id.

    The git commit/branch (read with git unless given) are set as ``mlflow.source.git.*``
    tags; ``source`` (``(name, type)``, e.g. ``browse.SOURCE_NIGHTLY``) as
    ``mlflow.source.name`` / ``mlflow.source.type``. Close it with ``end_run``.

    Raises:
        InfrastructureError: the store could not be reached.
    """
    from mlflow.entities import Param, RunTag

    from parity_tracker.run.environment import git_info
    from parity_tracker.track.owner import current_owner

    git = git_info()
    all_tags = {
        "mlflow.source.git.commit": commit or git["git_commit"],
        "mlflow.source.git.branch": branch or git["git_branch"],
        TAG_KIND: KIND_PARENT,
        **({TAG_SOURCE_NAME: source[0], TAG_SOURCE_TYPE: source[1]} if source else {}),
        **current_owner().tags(),  # sync marks it KILLED if this process dies (track.owner)
        **{k: str(v) for k, v in (tags or {}).items()},
    }
    try:
        client = get_client(tracking_uri)
        exp_id = get_or_create_experiment(client, experiment)
        run = retry(client.create_run, exp_id, run_name=run_name)
        run_id = run.info.run_id
        items = [Param(param_key(k), _param_value(v)) for k, v in (params or {}).items()]
        run_tags = [RunTag(k, v) for k, v in all_tags.items() if v is not None]
        retry(client.log_batch, run_id, params=items[:_BATCH], tags=run_tags)
        for chunk in _chunks(items[_BATCH:], _BATCH):
            retry(client.log_batch, run_id, params=chunk)
    except Exception as exc:
        uri = resolve_tracking_uri(tracking_uri)
        raise InfrastructureError(f"cannot open a parent run in {uri}: {exc}") from exc
    return run_id


def end_run(run_id: str, status: str = "FINISHED", *, tracking_uri: str | None = None) -> None:
    """Terminate a run (``FINISHED``, ``FAILED`` or ``KILLED``).

    Raises:
        InfrastructureError: the store could not be reached.
    """
    try:
        retry(get_client(tracking_uri).set_terminated, run_id, status)
    except Exception as exc:
        raise InfrastructureError(f"cannot end run {run_id}: {exc}") from exc


def log_artifact_files(
    run_id: str,
    files: Mapping[str, str | os.PathLike[str]] | Iterable[str | os.PathLike[str]],
    *,
    tracking_uri: str | None = None,
) -> None:
    """Attach local files to a run.

    Args:
        run_id: the MLflow run.
        files: paths (stored at the artifact root under their own names) or a mapping
            ``{artifact_path: local_path}`` (e.g. ``{"dashboards/history.html": p}``).
        tracking_uri: the store.

    Raises:
        InputError: a file does not exist.
        InfrastructureError: the store could not be reached.
    """
    pairs = (
        [(k, Path(v)) for k, v in files.items()]
        if isinstance(files, Mapping)
        else [(Path(p).name, Path(p)) for p in files]
    )
    for _name, path in pairs:
        if not path.is_file():
            raise InputError(f"artifact file {path} does not exist")
    try:
        client = get_client(tracking_uri)
        for name, path in pairs:
            folder = str(Path(name).parent) if Path(name).parent != Path(".") else None
            if Path(name).name == path.name:
                retry(client.log_artifact, run_id, str(path), folder)
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    renamed = Path(tmp) / Path(name).name
                    shutil.copyfile(path, renamed)
                    retry(client.log_artifact, run_id, str(renamed), folder)
    except Exception as exc:
        raise InfrastructureError(f"cannot log artifacts to run {run_id}: {exc}") from exc


#: Tag naming the baseline a stored run was diffed against (``none`` when it had none).
TAG_BASELINE = "parity.baseline_run_id"


def record_diff(
    run_id: str,
    *,
    regressions: int,
    baseline_run_id: str | None,
    tracking_uri: str | None = None,
) -> None:
    """Store the outcome of diffing a logged run against its baseline, on that run.

    Logs the metric ``regressions`` and the tag ``parity.baseline_run_id`` (``none`` when there
    was no baseline); the nightly's history page marks regressions from them.

    Raises:
        InfrastructureError: the store could not be reached.
    """
    try:
        client = get_client(tracking_uri)
        retry(client.log_metric, run_id, "regressions", float(regressions))
        retry(client.set_tag, run_id, TAG_BASELINE, baseline_run_id or "none")
    except Exception as exc:
        raise InfrastructureError(f"cannot record the diff on run {run_id}: {exc}") from exc


def set_description(run_id: str, text: str, *, tracking_uri: str | None = None) -> None:
    """Make ``text`` (markdown) the run's description, shown on its page in the MLflow UI.

    Stored in the tag ``mlflow.note.content``, cut to MLflow's 8,000-character tag limit
    (ending "… (cut; see digest.md)").

    Raises:
        InfrastructureError: the store could not be reached.
    """
    value = clip(text, "\n… (cut; see digest.md)\n")
    try:
        retry(get_client(tracking_uri).set_tag, run_id, TAG_DESCRIPTION, value)
    except Exception as exc:
        raise InfrastructureError(f"cannot set the description of run {run_id}: {exc}") from exc
