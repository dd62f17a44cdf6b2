"""Parity runs as MLflow runs: log, load back, find, and never lose one (design.md, "Tracking").

One parity run becomes one MLflow run, written through ``MlflowClient`` with its explicit run id
and batched calls:

- params: every setting (``str(value)``), the environment (``run.environment.ENV_KEYS``), ``mode``,
  ``mode_reason`` and ``config_fingerprint``;
- tags: ``mlflow.source.git.commit`` and ``mlflow.source.git.branch`` (set explicitly),
  ``mlflow.parentRunId`` when nested, ``parity.run_id``, ``parity.status``, ``parity.passed``,
  ``parity.config_fingerprint``; ``parity.complete`` = ``true`` last, once everything is stored;
  the UI's (``track.browse``): ``verdict``, ``first_divergence``, the markdown description
  ``mlflow.note.content`` and ``mlflow.source.name`` / ``mlflow.source.type``; the per-tag
  statuses ``parity.tag_codes`` and ``parity.tag_codes.<k>`` (``track.tag_codes``), which
  ``history --tag`` reads instead of the modules table;
- metrics (step 0): ``tensors_compared``, ``tensors_passing``, ``tensors_failing``,
  ``first_divergence_order``, ``output_max_abs_diff``, ``output_sqnr_db``, plus
  ``tensors_skipped``, ``ops_compared``, ``ops_failing`` and ``worst_error_ratio`` (budget
  runs, issue 15; None when infinite: see ``summary.json``). A metric whose value is None is
  not logged: ``first_divergence_order`` when nothing diverged, ``output_*`` when no root
  output was compared, and ``output_sqnr_db`` when the outputs are identical (infinite SQNR;
  MLflow's SQL store cannot keep inf — the summary says ``output_equal: true``);
- artifacts: ``tables/modules.parquet``, ``tables/ops.parquet``, ``tables/failing.csv`` (the
  failing rows, capped; only when rows fail), ``summary.json``
  (``RunSummary.to_json()``), the files the caller passes (``artifacts=``, ``render=``: e.g.
  ``report.html``; this package never renders) and the dumped tensors with their index under
  ``tensors/`` (one ``log_artifacts`` call per folder).

The run ends FINISHED, FAILED when a forward raised (``RunSummary.status == "failed"``), or
KILLED when the run was interrupted.

Nothing lost: everything to be logged is first written to a staging folder inside the spool
(``<spool>/.staging/<parity run id>.<pid>/``, with its owner, see ``track.owner``). When the store
cannot be reached, that folder is moved whole to ``./.parity/spool/<parity run id>/`` and
``log_run`` raises ``SpooledError`` (an ``InfrastructureError``, CLI exit 3) carrying
``spool_path``. ``sync_spool()`` uploads spooled runs later, exactly once: a run already in the
store with the same ``parity.run_id`` and ``parity.complete`` tag is not uploaded again. A writer
killed mid-upload (SIGKILL) leaves its staging folder: ``sync_spool()`` finishes it once the
owner is gone (``track.owner.recover_staging``), replacing the half-uploaded run.

The params, metrics, tags and staging folder are built in ``track.stage`` (``run_params``,
``run_metrics``, ``run_tags``, ``stage_run``, ``read_meta``; re-exported here); this module
uploads, spools and syncs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from parity_tracker.errors import InfrastructureError, brief
from parity_tracker.files.atomic import atomic_write_json
from parity_tracker.files.safe_paths import check_tree_inside
from parity_tracker.run.result import RunResult
from parity_tracker.track.browse import SOURCE_LIBRARY, Source
from parity_tracker.track.owner import (
    current_owner,
    drop_staging,
    fault_point,
    new_staging,
    recover_staging,
)
from parity_tracker.track.stage import CONTRACT_METRICS as CONTRACT_METRICS
from parity_tracker.track.stage import DERIVED_PARAMS as DERIVED_PARAMS
from parity_tracker.track.stage import EXTRA_METRICS as EXTRA_METRICS
from parity_tracker.track.stage import Renderer as Renderer
from parity_tracker.track.stage import _param_value as _param_value
from parity_tracker.track.stage import read_meta as read_meta
from parity_tracker.track.stage import run_metrics as run_metrics
from parity_tracker.track.stage import run_params as run_params
from parity_tracker.track.stage import run_tags as run_tags
from parity_tracker.track.stage import stage_run as stage_run
from parity_tracker.track.store import (
    TAG_COMPLETE,
    TAG_RUN_ID,
    get_client,
    get_or_create_experiment,
    parity_home,
    resolve_tracking_uri,
    retry,
)

_BATCH = 100  # MLflow's log_batch limit on params (and tags) per call


class SpooledError(InfrastructureError):
    """The tracking store could not be reached; the run was written whole to the local spool.

    Attributes:
        spool_path: the folder holding the run (upload it later with ``sync_spool()``).
        cause: the exception the store raised.
    """

    def __init__(self, spool_path: Path, cause: BaseException) -> None:
        self.spool_path = Path(spool_path)
        self.cause = cause
        super().__init__(
            f"tracking store unreachable ({type(cause).__name__}: {brief(cause)}); "
            f"run spooled to {self.spool_path}; upload it later with `parity-tracker sync` "
            "(parity_tracker.track.sync_spool())"
        )


# ---------------------------------------------------------------------------------------------
# upload


def _chunks(items: list[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _log_batch(client: Any, run_id: str, meta: Mapping[str, Any]) -> None:
    """Params, metrics and tags in as few ``log_batch`` calls as MLflow's limits allow."""
    from mlflow.entities import Metric, Param, RunTag

    ts = int(meta["end_time"])
    params = [Param(k, v) for k, v in meta["params"].items()]
    tags = [RunTag(k, v) for k, v in meta["tags"].items()]
    metrics = [Metric(k, v, ts, 0) for k, v in meta["metrics"].items()]
    p_chunks, t_chunks = list(_chunks(params, _BATCH)), list(_chunks(tags, _BATCH))
    for k in range(max(len(p_chunks), len(t_chunks), 1)):
        retry(
            client.log_batch,
            run_id,
            metrics=metrics if k == 0 else [],
            params=p_chunks[k] if k < len(p_chunks) else [],
            tags=t_chunks[k] if k < len(t_chunks) else [],
        )


def _upload(folder: Path, uri: str, tensors: Path | None = None) -> str:
    """Create the MLflow run for a staged/spooled ``folder`` and store it; returns its run id."""
    meta = read_meta(folder)
    owner = current_owner().tags()  # who writes it (track.owner), set at creation with the id
    meta["tags"] = {**meta["tags"], **owner}
    client = get_client(uri)
    exp_id = get_or_create_experiment(client, meta["experiment"])
    run = retry(
        client.create_run,
        exp_id,
        start_time=meta["start_time"],
        tags={TAG_RUN_ID: meta["parity_run_id"], **owner},
        run_name=meta.get("run_name"),
    )
    run_id = run.info.run_id
    fault_point("created")
    _log_batch(client, run_id, meta)
    fault_point("logged")
    retry(client.log_artifacts, run_id, str(folder / "artifacts"))
    if tensors is not None and Path(tensors).is_dir() and any(Path(tensors).iterdir()):
        retry(client.log_artifacts, run_id, str(tensors), "tensors")
    fault_point("artifacts")
    retry(client.set_terminated, run_id, meta["status"], meta["end_time"])
    fault_point("terminated")
    retry(client.set_tag, run_id, TAG_COMPLETE, "true")
    return run_id


def spool_root(spool_dir: str | os.PathLike[str] | None = None) -> Path:
    """The spool folder: ``spool_dir`` or ``./.parity/spool``."""
    return Path(spool_dir) if spool_dir is not None else parity_home() / "spool"


def _spool(staged: Path, tensors: Path | None, root: Path, run_id: str, cause: str) -> Path:
    """Move a staged run (and a copy of its tensors) to ``root/<run_id>`` atomically."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / run_id
    if final.exists():  # the same parity run was already spooled
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".{run_id}.", suffix=".tmp", dir=root))
    shutil.copytree(staged, tmp, dirs_exist_ok=True)
    if tensors is not None and Path(tensors).is_dir():
        shutil.copytree(tensors, tmp / "artifacts" / "tensors", dirs_exist_ok=True)
    meta = read_meta(tmp)
    meta["spool_reason"] = cause
    atomic_write_json(tmp / "run.json", meta)
    os.replace(tmp, final)
    return final


def _with_git(result: RunResult, commit: str | None, branch: str | None) -> RunResult:
    """``result`` with a new record whose environment names ``commit`` / ``branch``."""
    if commit is None and branch is None:
        return result
    env = dict(result.record.environment)
    if commit is not None:
        env["git_commit"] = commit
    if branch is not None:
        env["git_branch"] = branch
    return result.with_record(result.record.replace(environment=env))


def log_run(
    result: RunResult,
    *,
    tracking_uri: str | None = None,
    experiment: str = "parity",
    parent_run_id: str | None = None,
    run_name: str | None = None,
    commit: str | None = None,
    branch: str | None = None,
    spool_dir: str | os.PathLike[str] | None = None,
    artifacts: Mapping[str, str | os.PathLike[str]] | None = None,
    render: Renderer | None = None,
    source: Source = SOURCE_LIBRARY,
    tags: Mapping[str, str] | None = None,
) -> str:
    """Record a parity run as one MLflow run (see the module docstring for exactly what).

    Args:
        result: the run from ``run_parity``.
        tracking_uri: the store (default: ``$MLFLOW_TRACKING_URI``, else the embedded
            ``sqlite:///<cwd>/.parity/mlflow.db``).
        experiment: MLflow experiment name, created with an explicit artifact location.
        parent_run_id: nest under this run (tag ``mlflow.parentRunId``), e.g. a nightly run.
        run_name: MLflow run name (default: ``track.stage.default_run_name``, e.g.
            ``tiny-1a2b3c4d``: target and parity run id, never MLflow's seeded random name).
        commit: overrides the git commit read at run time: the stored record is a new
            ``RunSummary`` with it in ``environment`` (``result.record`` is not edited; better,
            pass the commit to ``run_parity(environment=...)``).
        branch: overrides the git branch likewise.
        spool_dir: where an unlogged run goes (default ``./.parity/spool``).
        artifacts: extra files to attach, ``{artifact_path: local_path}`` (e.g.
            ``{"report.html": path}``), stored beside the tables and spooled with them.
        render: ``render(result) -> {artifact_path: text}``, called once while staging (a
            fault only warns); None (default) for none. This package never renders: the CLI
            passes the dashboards' ``report.html`` renderer.
        source: ``(mlflow.source.name, mlflow.source.type)``, the runs table's Source column
            (``browse.SOURCE_RUN`` for the CLI, ``SOURCE_NIGHTLY`` for nightly cells).
        tags: more MLflow tags of the run (e.g. ``store.TAG_TARGET_SPEC``), staged and
            spooled with the others; they never replace a tag the tracker sets.

    Returns:
        The MLflow run id (also set on ``result.tracking_run_id``, the one field of the
        result the tracker fills).

    Raises:
        SpooledError: the store could not be reached (or failed mid-upload); the run is whole
            under ``err.spool_path`` and ``sync_spool()`` uploads it later. An
            ``InfrastructureError``: the CLI exits 3.
        KeyboardInterrupt: interrupted mid-upload; the run was spooled first.
    """
    stored = _with_git(result, commit, branch)
    uri = resolve_tracking_uri(tracking_uri)
    root = spool_root(spool_dir)
    tensors = str(Path(result.dump_dir).resolve()) if result.dump_dir is not None else None
    tmp = new_staging(root, result.run_id, {"tracking_uri": uri, "tensors_dir": tensors})
    try:
        staged = stage_run(
            stored,
            tmp,
            experiment=experiment,
            tracking_uri=uri,
            parent_run_id=parent_run_id,
            run_name=run_name,
            artifacts=artifacts,
            render=render,
            source=source,
            tags=tags,
        )
        fault_point("staged")
        try:
            run_id = _upload(staged, uri, result.dump_dir)
        except BaseException as exc:
            cause = f"{type(exc).__name__}: {exc}"
            path = _spool(staged, result.dump_dir, root, result.run_id, cause)
            if not isinstance(exc, Exception):
                raise  # Ctrl-C mid-upload: the run is spooled, the interruption passes on
            warnings.warn(
                f"parity run {result.run_id} not logged to {uri}: spooled to {path}",
                RuntimeWarning,
                stacklevel=2,
            )
            raise SpooledError(path, exc) from exc
    finally:
        drop_staging(tmp)
    result.tracking_run_id = run_id
    return run_id


# ---------------------------------------------------------------------------------------------
# spool sync


def _find_by_parity_id(client: Any, experiment: str, parity_run_id: str) -> list[Any]:
    exp = retry(client.get_experiment_by_name, experiment)
    if exp is None:
        return []
    return retry(
        client.search_runs,
        [exp.experiment_id],
        f"tags.`{TAG_RUN_ID}` = '{parity_run_id}'",
    )


def _sync_one(entry: Path, tracking_uri: str | None) -> str:
    """Upload one spool entry unless the store already holds it complete; returns the run id."""
    meta = read_meta(entry)
    check_tree_inside(entry)
    uri = resolve_tracking_uri(tracking_uri or meta["tracking_uri"])
    client = get_client(uri)
    existing = _find_by_parity_id(client, meta["experiment"], meta["parity_run_id"])
    for run in existing:
        if run.data.tags.get(TAG_COMPLETE) == "true":
            return run.info.run_id
    for run in existing:  # a half-uploaded attempt: remove it, then upload whole
        retry(client.delete_run, run.info.run_id)
    return _upload(entry, uri)


def _discard(entry: Path) -> None:
    """Remove a synced spool entry: rename first (atomic), then delete."""
    gone = entry.with_name(f".{entry.name}.synced-{os.getpid()}")
    os.replace(entry, gone)
    shutil.rmtree(gone, ignore_errors=True)


def sync_spool(
    tracking_uri: str | None = None, *, spool_dir: str | os.PathLike[str] | None = None
) -> dict[str, str]:
    """Upload every spooled run, exactly once, and remove it from the spool.

    Each entry is locked (``filelock``) while synced, so two concurrent syncs never upload it
    twice; a run already in the store (same ``parity.run_id`` tag, ``parity.complete`` set) is
    not uploaded again, so a sync interrupted after the upload but before the removal is safe.

    Args:
        tracking_uri: the store to upload to; default: the URI each run was meant for.
        spool_dir: the spool (default ``./.parity/spool``).

    Returns:
        ``{parity_run_id: mlflow_run_id}`` for every entry now in the store (empty when the
        spool is empty).

    Raises:
        InfrastructureError: some entries could not be uploaded (they stay in the spool; the
            message lists them); the others were uploaded and removed.
    """
    from filelock import FileLock, Timeout

    root = spool_root(spool_dir)
    done: dict[str, str] = {}
    failed: list[str] = []
    if not root.is_dir():
        return done
    recover_staging(root)  # may remove an emptied spool
    entries = sorted(
        p for p in root.glob("*")
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
    )  # fmt: skip
    for entry in entries:
        try:
            with FileLock(str(root / f".{entry.name}.lock"), timeout=0):
                if not (entry / "run.json").exists():
                    continue  # removed by a concurrent sync
                try:
                    done[entry.name] = _sync_one(entry, tracking_uri)
                except Exception as exc:
                    failed.append(f"{entry} ({type(exc).__name__}: {str(exc)[:200]})")
                    continue
                _discard(entry)
        except Timeout:
            continue  # another process is syncing this entry
    if failed:
        raise InfrastructureError("could not upload spooled runs: " + "; ".join(failed))
    return done
