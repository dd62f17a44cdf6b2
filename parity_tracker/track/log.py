"""Parity runs as MLflow runs: log, load back, find, and never lose one (design.md, "Tracking").

One parity run becomes one MLflow run, written through ``MlflowClient`` with its explicit run id
and batched calls:

- params: every setting (``str(value)``), the environment (``run.environment.ENV_KEYS``), ``mode``,
  ``mode_reason`` and ``config_fingerprint``;
- tags: ``mlflow.source.git.commit`` and ``mlflow.source.git.branch`` (set explicitly),
  ``mlflow.parentRunId`` when nested, ``parity.run_id``, ``parity.status``, ``parity.passed``,
  ``parity.config_fingerprint``; ``parity.complete`` = ``true`` last, once everything is stored;
  the UI's (``track.browse``): ``verdict``, ``first_divergence``, the markdown description
  ``mlflow.note.content`` and ``mlflow.source.name`` / ``mlflow.source.type``;
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
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from parity_tracker.errors import InfrastructureError, InputError
from parity_tracker.files.atomic import atomic_write_json, atomic_write_text
from parity_tracker.files.csvfiles import failing_rows, write_csv
from parity_tracker.files.safe_paths import check_tree_inside, resolve_inside
from parity_tracker.files.tables import read_table, write_table
from parity_tracker.run.environment import ENV_KEYS
from parity_tracker.run.result import RunResult
from parity_tracker.run.summary import RUN_STATUSES
from parity_tracker.track.browse import (
    FAILING_CSV,
    REPORT_FILE,
    SOURCE_LIBRARY,
    Source,
    describe_run,
    ui_tags,
)
from parity_tracker.track.owner import (
    current_owner,
    drop_staging,
    fault_point,
    new_staging,
    recover_staging,
)
from parity_tracker.track.store import (
    TAG_COMPLETE,
    TAG_RUN_ID,
    get_client,
    get_or_create_experiment,
    param_key,
    parity_home,
    resolve_tracking_uri,
    retry,
    sqlite_path,
    write_tag_index,
)

#: The contract's metrics (design.md), then this module's extras.
CONTRACT_METRICS = (
    "tensors_compared",
    "tensors_passing",
    "tensors_failing",
    "first_divergence_order",
    "output_max_abs_diff",
    "output_sqnr_db",
)
EXTRA_METRICS = ("tensors_skipped", "ops_compared", "ops_failing", "worst_error_ratio")
#: Params derived by the run, logged next to the settings and environment.
DERIVED_PARAMS = ("mode", "mode_reason", "config_fingerprint")
_PARAM_MAX = 6000  # MLflow's limit on a param value's length
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
            f"tracking store unreachable ({type(cause).__name__}: {str(cause)[:300]}); "
            f"run spooled to {self.spool_path}; upload it later with `parity-tracker sync` "
            "(parity_tracker.track.sync_spool())"
        )


# ---------------------------------------------------------------------------------------------
# what gets logged


def _param_value(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _PARAM_MAX else text[: _PARAM_MAX - 3] + "..."


def run_params(result: RunResult) -> dict[str, str]:
    """The params of a run: settings, environment, mode, mode_reason, config_fingerprint."""
    r = result.record
    params = {param_key(k): _param_value(v) for k, v in result.settings.items()}
    params.update({k: _param_value(r.environment.get(k)) for k in ENV_KEYS})
    params["mode"] = r.mode
    params["mode_reason"] = _param_value(r.mode_reason)
    params["config_fingerprint"] = r.config_fingerprint
    return params


def run_metrics(result: RunResult) -> dict[str, float]:
    """The metrics of a run; a metric whose value is None is left out (see module docstring)."""
    r = result.record
    values = {
        "tensors_compared": r.tensors_compared,
        "tensors_passing": r.tensors_passing,
        "tensors_failing": r.tensors_failing,
        "first_divergence_order": r.first_divergence and r.first_divergence.exec_order,
        "output_max_abs_diff": r.output_max_abs_diff,
        "output_sqnr_db": r.output_sqnr_db,
        **{k: getattr(r, k) for k in EXTRA_METRICS},
    }
    return {k: float(v) for k, v in values.items() if v is not None}


def run_tags(result: RunResult, parent_run_id: str | None) -> dict[str, str]:
    """The tags of a run (without ``parity.complete``, which is set once all is stored)."""
    r = result.record
    env = r.environment
    tags = {
        TAG_RUN_ID: result.run_id,
        "parity.status": r.status,
        "parity.passed": str(bool(r.passed)).lower(),
        "parity.config_fingerprint": r.config_fingerprint,
        "parity.mode": r.mode,
    }
    if env.get("git_commit"):
        tags["mlflow.source.git.commit"] = str(env["git_commit"])
    if env.get("git_branch"):
        tags["mlflow.source.git.branch"] = str(env["git_branch"])
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    if r.error is not None:
        tags["parity.error"] = f"{r.error.type}: {r.error.message}"[:5000]
    return tags


#: Renders the files a run's artifacts get beside its tables: ``render(result)`` returns
#: ``{artifact_path: text}`` (e.g. ``{"report.html": html}``). The layer above passes one.
Renderer = Callable[[RunResult], Mapping[str, str]]


def legacy_report_renderer(result: RunResult) -> dict[str, str]:
    """TRANSITIONAL default of ``log_run(render=...)``: ``report.html`` from the dashboards.

    Kept only so callers that do not pass ``render`` yet still store a report. It imports the
    presentation layer by name at call time; delete it (and make ``render`` default to None)
    once ``pipeline``/``cli`` pass ``render=`` themselves (issue 12).
    """
    import importlib

    for name in ("parity_tracker.dashboards.report", "dashboards.report"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        return {"report.html": module.render_run_report(result)}
    return {}


def _write_rendered(result: RunResult, art: Path, render: Renderer | None) -> None:
    """Write ``render(result)``'s files under ``art``; a renderer fault only warns."""
    if render is None:
        return
    try:
        files = dict(render(result))
    except Exception as exc:  # a report bug must not lose the run
        warnings.warn(f"rendered artifacts not written: {exc!r}", RuntimeWarning, stacklevel=3)
        return
    for name, text in files.items():
        atomic_write_text(_inside(art, name), text)


def _inside(root: Path, name: str) -> Path:
    """``root / name``, refusing a name that leaves ``root`` (absolute, or with ``..``).

    Raises:
        InputError: the artifact path escapes the artifact root.
    """
    return resolve_inside(root, name, what="artifact path", root_name="artifact root")


def _copy_artifacts(art: Path, artifacts: Mapping[str, str | os.PathLike[str]] | None) -> None:
    """Copy ``{artifact_path: local file}`` under ``art``.

    Raises:
        InputError: a file does not exist, or an artifact path leaves the root.
    """
    for name, local in (artifacts or {}).items():
        if not Path(local).is_file():
            raise InputError(f"artifact file {local} (for {name!r}) does not exist")
        target = _inside(art, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, target)


def _stage_ui(result: RunResult, art: Path, source: Source) -> dict[str, str]:
    """Write ``tables/failing.csv`` (when rows fail) and return the run's UI tags.

    The tags (``browse.ui_tags``) carry the description, which says how many failing rows the
    CSV holds (capped at ``files.csvfiles.FAILING_CSV_MAX_ROWS``) and whether ``report.html``
    is among the artifacts.
    """
    rows, total = failing_rows(result.modules, result.ops)
    if total:
        write_csv(rows, art / FAILING_CSV)
    text = describe_run(
        result.record,
        failing_csv_rows=rows.num_rows if total else 0,
        failing_total=total,
        report=(art / REPORT_FILE).is_file(),
    )
    return ui_tags(result.record, source, text)


def stage_run(
    result: RunResult,
    folder: Path,
    *,
    experiment: str,
    tracking_uri: str,
    parent_run_id: str | None,
    run_name: str | None,
    artifacts: Mapping[str, str | os.PathLike[str]] | None = None,
    render: Renderer | None = None,
    source: Source = SOURCE_LIBRARY,
) -> Path:
    """Write everything ``log_run`` uploads into ``folder`` (the spool's format).

    Layout: ``run.json`` (experiment, run name, parent, params, metrics, tags, status, times)
    and ``artifacts/`` (``tables/modules.parquet``, ``tables/ops.parquet``, ``summary.json``,
    the files of ``artifacts`` and of ``render``, e.g. ``report.html``; ``tables/failing.csv``
    when rows fail). Tensors are not copied here (see ``_spool``). The tags include the UI's
    (``browse.ui_tags``: verdict, first divergence, description, ``source``).
    """
    art = folder / "artifacts"
    write_table(result.modules, art / "tables" / "modules.parquet")
    write_table(result.ops, art / "tables" / "ops.parquet")
    _copy_artifacts(art, artifacts)
    _write_rendered(result, art, render)
    try:
        shown = _stage_ui(result, art, source)
    except Exception as exc:  # a description bug must not lose the run
        warnings.warn(f"UI tags not written: {exc!r}", RuntimeWarning, stacklevel=2)
        shown = {}
    atomic_write_text(art / "summary.json", result.record.to_json())
    fault_point("staging")
    now = int(time.time() * 1000)
    meta = {
        "parity_run_id": result.run_id,
        "experiment": experiment,
        "tracking_uri": tracking_uri,
        "run_name": run_name,
        "parent_run_id": parent_run_id,
        "params": run_params(result),
        "metrics": run_metrics(result),
        "tags": {**shown, **run_tags(result, parent_run_id)},
        "status": RUN_STATUSES[result.record.status],
        "start_time": int(result.record.start_time_ms or now),
        "end_time": now,
    }
    atomic_write_json(folder / "run.json", meta)
    return folder


#: ``run.json`` of a staged or spooled run: key → the types its value may have.
_META_TYPES: dict[str, tuple[type, ...]] = {
    "parity_run_id": (str,), "experiment": (str,), "tracking_uri": (str,),
    "run_name": (str, type(None)), "parent_run_id": (str, type(None)), "params": (dict,),
    "metrics": (dict,), "tags": (dict,), "status": (str,), "start_time": (int,),
    "end_time": (int,),
}  # fmt: skip


def read_meta(folder: Path) -> dict[str, Any]:
    """``folder/run.json`` (a staged or spooled run), checked key by key.

    Raises:
        InputError: the file is missing, not strict JSON, or a key is missing or of the wrong
            type (a spool entry someone else could have written; names the file and key).
    """
    path = folder / "run.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path}: unreadable run record ({type(exc).__name__}: {exc})") from exc
    if not isinstance(meta, dict):
        raise InputError(f"{path}: a run record must be a JSON object")
    for key, types in _META_TYPES.items():
        if not isinstance(meta.get(key), types) or isinstance(meta.get(key), bool):
            allowed = " or ".join(t.__name__ for t in types)
            raise InputError(f"{path}: {key} = {meta.get(key)!r}; expected {allowed}")
    return meta


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
    first = True
    for chunk in _chunks(params, _BATCH) if params else [[]]:
        retry(
            client.log_batch,
            run_id,
            metrics=metrics if first else [],
            params=chunk,
            tags=tags if first else [],
        )
        first = False


def _index_run(uri: str, run_id: str, folder: Path, modules: Any = None) -> None:
    """Add a stored run to the tag-status index (``store.write_tag_index``); warn on failure.

    ``modules`` defaults to the staged ``artifacts/tables/modules.parquet`` (a spooled run).
    The run is already stored: a failure here only costs ``history --tag`` its fast path.
    """
    try:
        if sqlite_path(uri) is None:
            return
        if modules is None:
            modules = read_table(folder / "artifacts" / "tables" / "modules.parquet", "modules")
        write_tag_index(uri, run_id, modules)
    except Exception as exc:
        warnings.warn(
            f"run {run_id} stored, but not added to the tag-status index of {uri} "
            f"({type(exc).__name__}: {exc}); history --tag reads its modules table instead",
            RuntimeWarning,
            stacklevel=3,
        )


def _upload(folder: Path, uri: str, tensors: Path | None = None, modules: Any = None) -> str:
    """Create the MLflow run for a staged/spooled ``folder`` and store it; returns its run id.

    On an embedded store the run is then added to the tag-status index (``_index_run``).
    """
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
    _index_run(uri, run_id, folder, modules)
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
    render: Renderer | None = legacy_report_renderer,
    source: Source = SOURCE_LIBRARY,
) -> str:
    """Record a parity run as one MLflow run (see the module docstring for exactly what).

    Args:
        result: the run from ``run_parity``.
        tracking_uri: the store (default: ``$MLFLOW_TRACKING_URI``, else the embedded
            ``sqlite:///<cwd>/.parity/mlflow.db``).
        experiment: MLflow experiment name, created with an explicit artifact location.
        parent_run_id: nest under this run (tag ``mlflow.parentRunId``), e.g. a nightly run.
        run_name: MLflow run name (default: MLflow's generated name).
        commit: overrides the git commit read at run time: the stored record is a new
            ``RunSummary`` with it in ``environment`` (``result.record`` is not edited; better,
            pass the commit to ``run_parity(environment=...)``).
        branch: overrides the git branch likewise.
        spool_dir: where an unlogged run goes (default ``./.parity/spool``).
        artifacts: extra files to attach, ``{artifact_path: local_path}`` (e.g.
            ``{"report.html": path}``), stored beside the tables and spooled with them.
        render: ``render(result) -> {artifact_path: text}``, called once while staging (a
            fault only warns); None for none. The default is TRANSITIONAL
            (``legacy_report_renderer``: ``report.html`` from the dashboards) until the layer
            above passes its own.
        source: ``(mlflow.source.name, mlflow.source.type)``, the runs table's Source column
            (``browse.SOURCE_RUN`` for the CLI, ``SOURCE_NIGHTLY`` for nightly cells).

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
        )
        fault_point("staged")
        try:
            run_id = _upload(staged, uri, result.dump_dir, result.modules)
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
