"""Reading parity runs back from MLflow: load one run, find runs, list run heads.

Every MLflow read of the package lives here (``RunStore`` gathers them); on the embedded SQLite
store ``find_run_heads`` reads MLflow's own tables with one SQL query (the fast path).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity_tracker.errors import (
    IncompleteRunError,
    InfrastructureError,
    InputError,
    ParityTrackerError,
    StoreDamagedError,
)
from parity_tracker.files.safe_paths import check_tree_inside
from parity_tracker.files.tables import read_table
from parity_tracker.run.environment import ENV_KEYS
from parity_tracker.track.store import (
    TAG_COMPLETE,
    TAG_RUN_ID,
    check_run_id,
    get_client,
    is_incomplete,
    param_key,
    parity_home,
    resolve_tracking_uri,
    retry,
)

if TYPE_CHECKING:
    from parity_tracker.run.result import RunResult


@dataclass(frozen=True)
class RunInfo:
    """One stored parity run as ``find_runs`` lists it.

    Attributes:
        run_id: the MLflow run id.
        start_time: milliseconds since the epoch (MLflow's unit).
        commit: ``mlflow.source.git.commit`` tag (None if unknown).
        branch: ``mlflow.source.git.branch`` tag (None if unknown).
        settings: the params minus the environment, ``mode_reason`` and
            ``config_fingerprint`` (``mode`` is kept: it is a setting of the contract).
        fingerprint: the ``config_fingerprint`` param.
        metrics: the logged metrics (latest values).
        status: MLflow run status (FINISHED, FAILED, KILLED, RUNNING).
        parity_run_id: the ``parity.run_id`` tag (the ``run_id`` column of the tables).
        params: every param, as stored (strings).
        artifact_uri: the run's artifact root (``mlflow-artifacts:/...``, ``s3://...``,
            ``file:///...``), None when unknown.
        tags: every tag, as stored.
        incomplete: its writer stopped before storing it whole (``store.is_incomplete``).
    """

    run_id: str
    start_time: int
    commit: str | None
    branch: str | None
    settings: dict[str, str]
    fingerprint: str | None
    metrics: dict[str, float]
    status: str
    parity_run_id: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    artifact_uri: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    incomplete: bool = False

    @classmethod
    def from_mlflow(cls, run: Any) -> RunInfo:
        """Build from an ``mlflow.entities.Run``."""
        params, tags = dict(run.data.params), dict(run.data.tags)
        skip = {*ENV_KEYS, "mode_reason", "config_fingerprint"}
        return cls(
            run_id=run.info.run_id,
            start_time=int(run.info.start_time or 0),
            commit=tags.get("mlflow.source.git.commit"),
            branch=tags.get("mlflow.source.git.branch"),
            settings={k: v for k, v in params.items() if k not in skip},
            fingerprint=params.get("config_fingerprint"),
            metrics=dict(run.data.metrics),
            status=run.info.status,
            parity_run_id=tags.get(TAG_RUN_ID),
            params=params,
            artifact_uri=run.info.artifact_uri,
            tags=tags,
            incomplete=is_incomplete(run.info.status, tags.get(TAG_COMPLETE)),
        )


# ---------------------------------------------------------------------------------------------
# read back


def _cache_dir(run_id: str) -> Path:
    return parity_home() / "cache" / "runs" / run_id


def _download(client: Any, run_id: str, cache: Path) -> Path:
    """Fetch ``tables/`` and ``summary.json`` of a run into ``cache`` (atomic, once)."""
    if (cache / ".complete").exists():
        return cache
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no tqdm noise
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{run_id}.", dir=cache.parent))
    try:
        retry(client.download_artifacts, run_id, "tables", str(tmp))
        retry(client.download_artifacts, run_id, "summary.json", str(tmp))
        check_tree_inside(tmp)  # a symlink out of the run's folder is never followed
        (tmp / ".complete").touch()
        try:
            os.replace(tmp, cache)
        except OSError:  # a concurrent loader cached it first
            if not (cache / ".complete").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cache


def load_run(run_id: str, *, tracking_uri: str | None = None) -> Any:
    """The ``RunResult`` of a logged run, equal to the one logged (tables, summary, settings).

    Artifacts are downloaded once and cached under ``./.parity/cache/runs/<run_id>/``;
    ``dump_dir`` is None (the tensors stay in the store under ``tensors/``).

    Raises:
        InputError: a malformed run id, no such run, or not a parity run (not logged by
            ``log_run``).
        IncompleteRunError: the run's writer stopped before storing it whole (exit 3).
        StoreDamagedError: a table or ``summary.json`` is missing, truncated or unreadable
            (exit 3; names the run and the file).
        InfrastructureError: the store could not be reached.
    """
    from mlflow.exceptions import MlflowException

    check_run_id(run_id)
    uri = resolve_tracking_uri(tracking_uri)
    try:
        client = get_client(uri)
        run = retry(client.get_run, run_id)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc.error_code) or "not found" in str(exc).lower():
            raise InputError(f"no run {run_id!r} in {uri}") from exc
        raise InfrastructureError(f"cannot read run {run_id!r} from {uri}: {exc}") from exc
    if TAG_RUN_ID not in run.data.tags:
        raise InputError(f"run {run_id!r} in {uri} is not a parity run (no {TAG_RUN_ID} tag)")
    if is_incomplete(run.info.status, run.data.tags.get(TAG_COMPLETE)):
        raise IncompleteRunError(run_id, f"status {run.info.status}, no {TAG_COMPLETE} tag")
    cache = _cache_dir(run_id)
    try:
        _download(client, run_id, cache)
    except (MlflowException, OSError) as exc:
        what = "tables/ or summary.json"
        raise StoreDamagedError(run_id, what, f"cannot download: {str(exc)[:300]}") from exc
    try:
        return _read_cached(cache, run_id)
    except StoreDamagedError:
        shutil.rmtree(cache, ignore_errors=True)  # re-downloaded next time (the copy may be bad)
        raise


def _read_cached(cache: Path, run_id: str) -> RunResult:
    """The ``RunResult`` of a downloaded run folder.

    Raises:
        StoreDamagedError: a file is missing, truncated, not strict JSON, or of a malformed
            schema (names the run and the file).
        InputError: a table of a newer schema version (upgrade parity_tracker).
    """
    import pyarrow as pa

    from parity_tracker.run.result import RunResult
    from parity_tracker.run.summary import RunSummary

    def damaged(name: str, exc: BaseException) -> StoreDamagedError:
        return StoreDamagedError(run_id, name, f"{type(exc).__name__}: {str(exc)[:300]}")

    try:
        summary = json.loads((cache / "summary.json").read_text(encoding="utf-8"))
        if not isinstance(summary, dict) or not isinstance(summary.get("settings"), dict):
            raise ValueError("not a summary object with a settings table")
        record = RunSummary.from_dict(summary)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        if isinstance(exc, InputError):
            raise
        raise damaged("summary.json", exc) from exc
    tables = {}
    for kind in ("modules", "ops"):
        name = f"tables/{kind}.parquet"
        try:
            tables[kind] = read_table(cache / name, kind)
        except InputError:
            raise
        except (OSError, ValueError, TypeError, KeyError, pa.ArrowException) as exc:
            raise damaged(name, exc) from exc
    return RunResult(
        run_id=record.run_id,
        modules=tables["modules"],
        ops=tables["ops"],
        summary=record,
        settings=dict(record.settings),
        dump_dir=None,
        tracking_run_id=run_id,
    )


def _quote(value: Any) -> str:
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def find_runs(
    *,
    tracking_uri: str | None = None,
    experiment: str = "parity",
    max_results: int | None = None,
    **settings: Any,
) -> list[RunInfo]:
    """Parity runs whose params match ``settings``, newest first.

    Args:
        tracking_uri: the store (default as in ``log_run``).
        experiment: the experiment searched.
        max_results: stop after this many (default: all).
        **settings: param filters, compared as strings: any setting (``target="tiny_mlp"``,
            ``quantization="int8"``), environment key (``git_commit=...``) or
            ``config_fingerprint=...``.

    Returns:
        ``RunInfo`` records sorted by start time, newest first (ties: by run id).
    """
    client = get_client(tracking_uri)
    exp = retry(client.get_experiment_by_name, experiment)
    if exp is None:
        return []
    filt = " and ".join(f"params.`{param_key(k)}` = {_quote(v)}" for k, v in settings.items())
    out: list[RunInfo] = []
    token = None
    while True:
        page = retry(
            client.search_runs,
            [exp.experiment_id],
            filt,
            max_results=min(max_results or 1000, 1000),
            order_by=["attributes.start_time DESC", "attributes.run_id DESC"],
            page_token=token,
        )
        out.extend(RunInfo.from_mlflow(r) for r in page)
        token = page.token
        if not token or (max_results and len(out) >= max_results):
            break
    return out[:max_results] if max_results else out


@dataclass(frozen=True)
class RunHead:
    """The few fields of a stored run that ``history`` needs, as ``find_run_heads`` lists them.

    Attributes:
        run_id: the MLflow run id.
        start_time: milliseconds since the epoch (MLflow's unit).
        status: MLflow run status (FINISHED, FAILED, KILLED, RUNNING).
        commit: ``mlflow.source.git.commit`` tag (None if unknown).
        fingerprint: the ``config_fingerprint`` param (None if absent).
        metrics: every logged metric's latest value (as ``RunInfo.metrics``).
        artifact_uri: the run's artifact root (``file:///...`` for the embedded store), or None
            when it was not read (runs found through MLflow's search).
        incomplete: its writer stopped before storing it whole (``store.is_incomplete``).
    """

    run_id: str
    start_time: int
    status: str
    commit: str | None
    fingerprint: str | None
    metrics: dict[str, float]
    artifact_uri: str | None = None
    incomplete: bool = False

    @classmethod
    def from_info(cls, info: RunInfo) -> RunHead:
        """The head of a ``RunInfo``."""
        return cls(
            run_id=info.run_id,
            start_time=info.start_time,
            status=info.status,
            commit=info.commit,
            fingerprint=info.fingerprint,
            metrics=dict(info.metrics),
            artifact_uri=info.artifact_uri,
            incomplete=info.incomplete,
        )


_HEADS_SQL = """
SELECT r.run_uuid, r.start_time, r.status, r.artifact_uri,
  (SELECT t.value FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ?),
  (SELECT p.value FROM params p WHERE p.run_uuid = r.run_uuid AND p.key = 'config_fingerprint'),
  (SELECT t.value FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ?)
FROM runs r
WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active'{where}
ORDER BY r.start_time DESC, r.run_uuid DESC{limit}
"""
_PARAM_SQL = "\n  AND r.run_uuid IN (SELECT run_uuid FROM params WHERE key = ? AND value = ?)"
_SQL_CHUNK = 500  # run ids per ``IN (...)`` of the metrics query (SQLite allows 32,766 variables)


def _sqlite_heads(
    db: Path, experiment: str, settings: Mapping[str, Any], max_results: int | None
) -> list[RunHead]:
    """``find_run_heads`` on MLflow's own SQLite tables, opened read-only.

    One query for the runs (``runs`` + ``tags`` + ``params``), one per 500 runs for
    ``latest_metrics``.
    """
    import math
    import sqlite3

    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    try:
        exp = con.execute(
            "SELECT experiment_id FROM experiments WHERE name = ? AND workspace = 'default'",
            (experiment,),
        ).fetchone()
        if exp is None:
            return []
        args: list[Any] = ["mlflow.source.git.commit", TAG_COMPLETE, exp[0]]
        for key, value in settings.items():
            args += [param_key(key), str(value)]
        sql = _HEADS_SQL.format(
            where=_PARAM_SQL * len(settings), limit=" LIMIT ?" if max_results else ""
        )
        rows = con.execute(sql, [*args, *([max_results] if max_results else [])]).fetchall()
        metrics: dict[str, dict[str, float]] = {row[0]: {} for row in rows}
        ids = list(metrics)
        for k in range(0, len(ids), _SQL_CHUNK):
            chunk = ids[k : k + _SQL_CHUNK]
            query = (
                "SELECT run_uuid, key, value, is_nan FROM latest_metrics "
                f"WHERE run_uuid IN ({','.join('?' * len(chunk))})"
            )
            for run_id, key, value, is_nan in con.execute(query, chunk):
                metrics[run_id][key] = math.nan if is_nan else float(value)
    finally:
        con.close()
    return [
        RunHead(
            rid,
            int(start or 0),
            status,
            commit,
            fingerprint,
            metrics[rid],
            artifact_uri,
            is_incomplete(status, complete),
        )
        for rid, start, status, artifact_uri, commit, fingerprint, complete in rows
    ]


def find_run_heads(
    *,
    tracking_uri: str | None = None,
    experiment: str = "parity",
    max_results: int | None = None,
    **settings: Any,
) -> list[RunHead]:
    """Like ``find_runs`` (same matching, same order) but only the fields ``history`` needs.

    On a SQLite store (the embedded default) it reads MLflow's tables directly with one
    read-only SQL query (``runs``, ``tags``, ``params``, then ``latest_metrics``; schema of
    MLflow 3's ``mlflow/store/tracking/dbmodels/models.py``), which is about 100× faster than
    ``MlflowClient.search_runs`` building every param, tag and metric of each run. Any other
    store — or a SQLite schema this query does not fit — goes through ``find_runs``; on a
    tracking server through ``heads_cache.server_run_infos`` (stored runs' heads kept locally,
    only new runs searched).

    Args:
        tracking_uri: the store (default as in ``log_run``).
        experiment: the experiment searched.
        max_results: stop after this many (default: all).
        **settings: param filters, compared as strings (as ``find_runs``).

    Returns:
        ``RunHead`` records, newest first (ties: by run id descending).

    Raises:
        Exception: whatever the store raises when it cannot be reached (SQLite "database is
            locked" is retried first, see ``store.retry``).
    """
    import sqlite3

    from parity_tracker.store import is_locked_error, sqlite_path

    uri = resolve_tracking_uri(tracking_uri)
    db = sqlite_path(uri)
    if db is not None and db.is_file():
        try:
            return retry(_sqlite_heads, db, experiment, settings, max_results)
        except sqlite3.DatabaseError as exc:
            if is_locked_error(exc):
                raise
            # a schema this query does not fit (another MLflow version): MLflow's own search
    if uri.startswith(("http://", "https://")) and max_results is None:
        from parity_tracker.track.heads_cache import server_run_infos

        infos = server_run_infos(uri, experiment, settings)  # stored runs' heads kept locally
    else:
        infos = find_runs(
            tracking_uri=uri, experiment=experiment, max_results=max_results, **settings
        )
    return [RunHead.from_info(info) for info in infos]


# ---------------------------------------------------------------------------------------------
# the one read interface


@dataclass(frozen=True)
class StoredTables:
    """A stored run's ``modules`` table and settings (``RunStore.load_tables``).

    Attributes:
        modules: the ``modules`` table (``files.tables.MODULES_SCHEMA``).
        settings: the run's settings (``RunInfo.settings``).
        tracking_run_id: the full MLflow run id.
    """

    modules: Any
    settings: dict[str, str]
    tracking_run_id: str


class RunStore:
    """Every read of stored parity runs, over one tracking store and experiment.

    History, diff, the nightly and the CLI read runs through this class only; the fast paths
    (MLflow's SQLite tables read directly, the tag-status index, in-place parquet scans) live
    behind it. Writing stays with ``track.log`` (``log_run``, ``sync_spool``).

    Args:
        tracking_uri: the store (default: ``store.resolve_tracking_uri``: explicit URI, else
            ``$MLFLOW_TRACKING_URI``, else the embedded ``sqlite:///<cwd>/.parity/mlflow.db``).
        experiment: the MLflow experiment searched.

    Attributes:
        uri: the resolved tracking URI.
        experiment: the experiment name.
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str = "parity") -> None:
        self.uri = resolve_tracking_uri(tracking_uri)
        self.experiment = experiment

    def __repr__(self) -> str:
        return f"RunStore({self.uri!r}, experiment={self.experiment!r})"

    def load(self, run_id: str) -> RunResult:
        """The ``RunResult`` of a logged run (``load_run``; cached locally).

        Raises:
            InputError: no such run, or not a parity run. InfrastructureError: unreachable.
        """
        return load_run(self.resolve_run_id(run_id), tracking_uri=self.uri)

    def _search(self, find: Any, max_results: int | None, settings: Mapping[str, Any]) -> list:
        try:
            return find(
                tracking_uri=self.uri, experiment=self.experiment, max_results=max_results,
                **settings,
            )  # fmt: skip
        except ParityTrackerError:
            raise
        except Exception as exc:
            raise InfrastructureError(
                f"cannot search runs in {self.uri}: {type(exc).__name__}: {exc}"
            ) from exc

    def find(self, *, max_results: int | None = None, **settings: Any) -> list[RunInfo]:
        """Runs whose params match ``settings`` (strings), newest first (``find_runs``).

        Raises:
            InfrastructureError: the store could not be reached (names the URI).
        """
        return self._search(find_runs, max_results, settings)

    def heads(self, *, max_results: int | None = None, **settings: Any) -> list[RunHead]:
        """Like ``find`` but only ``RunHead`` fields; one SQL query on a SQLite store.

        Raises:
            InfrastructureError: the store could not be reached (names the URI).
        """
        return self._search(find_run_heads, max_results, settings)

    def modules_tables(
        self, run_ids: list[str], artifact_uris: list[str | None] | None = None
    ) -> list[Any]:
        """The ``modules`` table of each run (only that artifact), through the run cache.

        Raises:
            InfrastructureError: the store could not be reached or a run has no modules table.
        """
        from parity_tracker.track.tag_status import modules_tables

        return modules_tables(run_ids, self.uri, artifact_uris or ())

    def tag_statuses(self, heads: list[Any], tag: str) -> tuple[list[str | None], list[str]]:
        """``tag``'s status in each run, and sample tags when it is in none of them.

        See ``tag_status.tag_statuses``: the sample is up to 8 tags of the newest run (for an
        error message).

        Raises:
            InfrastructureError: the store could not be reached or a run has no modules table.
        """
        from parity_tracker.track.tag_status import tag_statuses

        return tag_statuses(heads, tag, self.uri)

    def resolve_run_id(self, run_id: str) -> str:
        """The full run id of ``run_id`` or of any unique prefix of it (``track.ids``).

        Raises:
            InputError: no run, or an ambiguous prefix (lists candidates).
            InfrastructureError: the store could not be reached.
        """
        from parity_tracker.track.ids import resolve_run_id

        return resolve_run_id(self.uri, run_id)

    def load_tables(self, run_id: str) -> StoredTables:
        """A stored run's modules table and settings, without building a ``RunResult``.

        What ``diff`` needs; cheap to import (no torch). ``run_id`` may be a unique prefix.

        Raises:
            InputError: no such run (or ambiguous prefix). InfrastructureError: unreachable.
        """
        full = self.resolve_run_id(run_id)
        info = self._one(full)
        return StoredTables(self.modules_tables([full], [info.artifact_uri])[0],
                            dict(info.settings), full)  # fmt: skip

    def _one(self, run_id: str) -> RunInfo:
        from mlflow.exceptions import MlflowException

        try:
            return RunInfo.from_mlflow(retry(get_client(self.uri).get_run, run_id))
        except MlflowException as exc:
            if "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower():
                raise InputError(f"no run {run_id!r} in {self.uri}") from exc
            raise InfrastructureError(f"cannot read run {run_id} from {self.uri}: {exc}") from exc

    def fetch(self, runs: list[tuple[str, str | None]], path: str) -> list[Path]:
        """Local copies of artifact ``path`` of each ``(run id, artifact uri)`` (``track.cache``).

        Raises:
            InfrastructureError: the store could not be reached or a file is missing.
        """
        from parity_tracker.track.cache import fetch_files

        return fetch_files(runs, path, self.uri)

    def night(self, night: str) -> tuple[list[RunInfo], list[RunInfo]]:
        """``(shard parent runs, their cell runs)`` of night ``night`` (``track.nights``).

        Raises:
            InfrastructureError: the store could not be reached.
        """
        from parity_tracker.track.nights import night_runs

        return self._search(lambda **kw: night_runs(self.uri, self.experiment, night), None, {})

    def run_for_commit(self, commit: str, **settings: Any) -> RunInfo:
        """The newest run of ``commit`` matching ``settings``.

        ``commit`` is matched exactly (the ``git_commit`` param); when nothing matches and it is
        shorter than 40 characters, as an abbreviated SHA (a prefix, as git prints it).

        Raises:
            InputError: no such run (names the commit, settings and experiment).
            InfrastructureError: the store could not be reached.
        """
        runs = [r for r in self.find(**settings, git_commit=commit) if not r.incomplete]
        if not runs and len(commit) < 40:
            runs = [
                r for r in self.find(**settings)
                if str(r.commit or "").startswith(commit) and not r.incomplete
            ]  # fmt: skip
        if not runs:
            raise InputError(
                f"no run matching {dict(settings)} on commit {commit!r} in experiment "
                f"{self.experiment!r} of {self.uri}"
            )
        return runs[0]

    def baseline_runs(self, run_id: str) -> dict[str, str]:
        """The runs a baseline run id stands for, as ``{config fingerprint: run id}``.

        A parity run stands for itself; a nightly parent run for its children (every child
        with a ``config_fingerprint`` param).

        Raises:
            InputError: no run ``run_id`` in the store (names it).
            InfrastructureError: the store could not be reached.
        """
        from mlflow.exceptions import MlflowException

        run_id = self.resolve_run_id(run_id)
        try:
            client = get_client(self.uri)
            run = retry(client.get_run, run_id)
        except MlflowException as exc:
            if "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower():
                raise InputError(f"baseline {run_id}: no such run in {self.uri}") from exc
            raise InfrastructureError(f"cannot read run {run_id} from {self.uri}: {exc}") from exc
        except Exception as exc:
            raise InfrastructureError(f"cannot read run {run_id} from {self.uri}: {exc}") from exc
        fp = run.data.params.get("config_fingerprint")
        if fp:
            return {fp: run_id}
        children = retry(
            client.search_runs,
            [run.info.experiment_id],
            f"tags.`mlflow.parentRunId` = '{run_id}'",
            max_results=5000,
        )
        return {
            c.data.params["config_fingerprint"]: c.info.run_id
            for c in children
            if "config_fingerprint" in c.data.params
        }

    # -- the MLflow UI (``track.browse``)
    def experiment_id(self) -> str | None:
        """The experiment's id, None when it does not exist yet.

        Raises:
            InfrastructureError: the store could not be reached.
        """
        try:
            exp = retry(get_client(self.uri).get_experiment_by_name, self.experiment)
        except Exception as exc:
            raise InfrastructureError(f"cannot read experiments of {self.uri}: {exc}") from exc
        return None if exp is None else exp.experiment_id

    def run_url(self, run_id: str | None, base: str | None = None) -> str | None:
        """The run's page in the MLflow UI at ``base`` (default: the store, when it is a server).

        None when there is no address (an embedded store and no ``base``), no run id, or no
        experiment.
        """
        from parity_tracker.track.browse import run_url, server_base

        base = base or server_base(self.uri)
        exp_id = self.experiment_id() if base and run_id else None
        return run_url(base, exp_id, run_id) if base and run_id and exp_id else None

    def experiment_url(self, base: str | None = None) -> str | None:
        """The experiment's runs table (parity view) in the MLflow UI at ``base`` (as run_url)."""
        from parity_tracker.track.browse import runs_url, server_base

        base = base or server_base(self.uri)
        exp_id = self.experiment_id() if base else None
        return runs_url(base, exp_id) if base and exp_id else None

    def experiment_names(self) -> list[str]:
        """Names of the store's active experiments that hold at least one run.

        Raises:
            InfrastructureError: the store could not be reached.
        """
        try:
            client = get_client(self.uri)
            exps = retry(client.search_experiments, max_results=1000)
            return [
                e.name for e in exps if retry(client.search_runs, [e.experiment_id], max_results=1)
            ]
        except Exception as exc:
            raise InfrastructureError(f"cannot read experiments of {self.uri}: {exc}") from exc

    def prepare_ui(self) -> str | None:
        """Make the experiment ready for the UI; returns its id (None when it does not exist).

        Sets ``mlflow.experimentKind`` (classic runs view) when the experiment has none, and
        rewrites the parity saved view with the setting params its runs use (newest 1000 runs).

        Raises:
            InfrastructureError: the store could not be reached.
        """
        from parity_tracker.track import browse

        try:
            client = get_client(self.uri)
            exp = retry(client.get_experiment_by_name, self.experiment)
            if exp is None:
                return None
            runs = retry(client.search_runs, [exp.experiment_id], max_results=1000)
            skip = {*ENV_KEYS, "mode_reason", "config_fingerprint", "mode"}
            keys = browse.setting_keys(
                (r.data.params for r in runs if TAG_RUN_ID in r.data.tags), skip
            )
            tags = browse.experiment_tags(keys)
            if exp.tags.get(browse.TAG_EXPERIMENT_KIND):
                tags.pop(browse.TAG_EXPERIMENT_KIND)
            for key, value in tags.items():
                retry(client.set_experiment_tag, exp.experiment_id, key, value)
        except Exception as exc:
            raise InfrastructureError(
                f"cannot prepare {self.experiment!r} in {self.uri}: {exc}"
            ) from exc
        return exp.experiment_id
