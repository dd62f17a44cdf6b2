"""Reading parity runs back from MLflow: ``RunStore``, the one read interface.

Every MLflow read of the package goes through ``RunStore``; the reads themselves live in
``track.load`` (``load_run``), ``track.search`` (``find_runs``, ``find_run_heads``: on the
embedded SQLite store one SQL query on MLflow's own tables, the fast path) and the modules
named by each method. The records are in ``track.records`` (``RunInfo``, ``RunHead``,
``StoredTables``); every name is re-exported here, its old home.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity_tracker.errors import InfrastructureError, InputError, ParityTrackerError
from parity_tracker.run.environment import ENV_KEYS
from parity_tracker.run.mode import SIDE_NAMES, baseline_key
from parity_tracker.track.load import load_run as load_run
from parity_tracker.track.records import RunHead as RunHead
from parity_tracker.track.records import RunInfo as RunInfo
from parity_tracker.track.records import StoredTables as StoredTables
from parity_tracker.track.search import _quote as _quote
from parity_tracker.track.search import find_run_heads as find_run_heads
from parity_tracker.track.search import find_runs as find_runs
from parity_tracker.track.store import TAG_RUN_ID, get_client, resolve_tracking_uri, retry

if TYPE_CHECKING:
    from parity_tracker.run.result import RunResult


class RunStore:
    """Every read of stored parity runs, over one tracking store and experiment.

    History, diff, the nightly and the CLI read runs through this class only; the fast paths
    (MLflow's SQLite tables read directly, per-tag statuses in run tags, parquet scans) live
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

    def target_names(self, spec: str | None = None) -> list[str]:
        """Distinct stored ``target`` names, newest first; ``spec``: of runs given as that spec.

        See ``search.stored_target_names`` (for messages: reads at most 5,000 runs).

        Raises:
            InfrastructureError: the store could not be reached (names the URI).
        """
        from parity_tracker.track.search import stored_target_names

        return self._search(stored_target_names, None, {"spec": spec})

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

    def run_tag_statuses(self, heads: list[Any]) -> list[dict[str, str]]:
        """Every tag's status in each run (``tag_status.run_tag_statuses``).

        Raises:
            InfrastructureError: the store could not be reached or a run has no modules table.
        """
        from parity_tracker.track.tag_status import run_tag_statuses

        return run_tag_statuses(heads, self.uri)

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
            InputError: no such run (or ambiguous prefix), or a night/shard parent run (names
                some of its cells' run ids). InfrastructureError: unreachable.
        """
        from parity_tracker.track.nights import parent_error

        full = self.resolve_run_id(run_id)
        run = self._get(full)
        error = parent_error(self.uri, run)  # a night/shard parent holds no tables: say so
        if error is not None:
            raise error
        info = RunInfo.from_mlflow(run)
        return StoredTables(self.modules_tables([full], [info.artifact_uri])[0],
                            dict(info.settings), full)  # fmt: skip

    def _one(self, run_id: str) -> RunInfo:
        return RunInfo.from_mlflow(self._get(run_id))

    def _get(self, run_id: str, missing: str = "no run {id!r} in {uri}") -> Any:
        """The ``mlflow.entities.Run`` of a full run id (``missing``: the no-such-run error)."""
        from mlflow.exceptions import MlflowException

        try:
            return retry(get_client(self.uri).get_run, run_id)
        except MlflowException as exc:
            if "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower():
                raise InputError(missing.format(id=run_id, uri=self.uri)) from exc
            raise InfrastructureError(f"cannot read run {run_id} from {self.uri}: {exc}") from exc
        except Exception as exc:
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
        shorter than 40 characters, as an abbreviated SHA (a prefix, as git prints it), which
        must then name one commit (as ``git rev-parse`` refuses an ambiguous one).

        Raises:
            InputError: no such run (names the commit, settings and experiment), or the prefix
                matches runs of several commits (names them).
            InfrastructureError: the store could not be reached.
        """
        runs = [r for r in self.find(**settings, git_commit=commit) if not r.incomplete]
        if not runs and len(commit) < 40:
            runs = [
                r for r in self.find(**settings)
                if str(r.commit or "").startswith(commit) and not r.incomplete
            ]  # fmt: skip
            _one_commit(commit, runs, settings)
        if not runs:
            raise InputError(
                f"no run matching {dict(settings)} on commit {commit!r} in experiment "
                f"{self.experiment!r} of {self.uri}"
            )
        return runs[0]

    def baseline_runs(self, run_id: str) -> dict[str, str]:
        """The runs a baseline run id stands for, as ``{baseline key: run id}``.

        ``baseline_map(baseline_infos(run_id))``.

        Raises:
            InputError: no run ``run_id`` in the store (names it).
            InfrastructureError: the store could not be reached.
        """
        return baseline_map(self.baseline_infos(run_id))

    def baseline_infos(self, run_id: str) -> list[RunInfo]:
        """The stored runs a baseline run id stands for, oldest first.

        A parity run stands for itself; a parent run for its cells (``nights.cell_runs``): a
        shard's parent for its child runs, a night's merged parent for the child runs of every
        shard it lists (tag ``parity.shard_runs``), so one night covers every cell whatever
        the sharding. Runs whose writer stopped (``store.is_incomplete``) are left out.

        Raises:
            InputError: no run ``run_id`` in the store (names it).
            InfrastructureError: the store could not be reached.
        """
        from parity_tracker.track.nights import cell_runs, parent_kind

        run = self._get(self.resolve_run_id(run_id), "baseline {id}: no such run in {uri}")
        if run.data.params.get("config_fingerprint") and parent_kind(run.data.tags) is None:
            info = RunInfo.from_mlflow(run)
            return [] if info.incomplete else [info]
        try:
            return cell_runs(self.uri, run)
        except Exception as exc:
            raise InfrastructureError(f"cannot read the cells of run {run_id}: {exc}") from exc

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
            skip = {*ENV_KEYS, "mode_reason", "config_fingerprint", "mode", *SIDE_NAMES}
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


def _one_commit(prefix: str, runs: list[RunInfo], settings: dict[str, Any]) -> None:
    """Refuse an abbreviated SHA that ``runs`` (the runs it matched) show on several commits.

    Raises:
        InputError: names the commits (up to 10) and the fix.
    """
    commits = sorted({str(r.commit) for r in runs})
    if len(commits) > 1:  # never pick one commit of several silently
        raise InputError(
            f"commit {prefix!r} is ambiguous: runs matching {settings} are on commits "
            f"{', '.join(commits[:10])}; give more digits of the commit"
        )


def baseline_map(infos: list[RunInfo]) -> dict[str, str]:
    """``{baseline key: run id}`` of stored runs (``run.mode.baseline_key``: fingerprint and mode).

    A cell is only ever paired with a run of its own key. When several runs share a key (a
    cell re-run under one parent) the newest wins; runs without a key are left out.
    """
    out: dict[str, str] = {}
    for info in sorted(infos, key=lambda r: (r.start_time, r.run_id)):
        key = baseline_key(info.fingerprint, info.params.get("mode"))
        if key:
            out[key] = info.run_id
    return out
