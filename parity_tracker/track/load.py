"""Loading one logged parity run back as a ``RunResult`` (``load_run``).

The run's ``tables/`` and ``summary.json`` are downloaded once into a local cache
(``./.parity/cache/runs/<run_id>/``) and read from there.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity_tracker.errors import (
    IncompleteRunError,
    InfrastructureError,
    InputError,
    StoreDamagedError,
)
from parity_tracker.files.safe_paths import check_tree_inside
from parity_tracker.files.tables import read_table
from parity_tracker.track.store import (
    TAG_COMPLETE,
    TAG_RUN_ID,
    check_run_id,
    get_client,
    is_incomplete,
    parity_home,
    resolve_tracking_uri,
    retry,
)

if TYPE_CHECKING:
    from parity_tracker.run.result import RunResult


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

    ``run_id``: the MLflow run id or any unique prefix of it (``track.ids.resolve_run_id``).

    Artifacts are downloaded once and cached under ``./.parity/cache/runs/<run_id>/``;
    ``dump_dir`` is None (the tensors stay in the store under ``tensors/``).

    Raises:
        InputError: a malformed run id, no such run, an ambiguous prefix (lists the
            candidates), a night or shard parent run (names some
            of its cells, ``nights.parent_error``), or not a parity run (not logged by
            ``log_run``).
        IncompleteRunError: the run's writer stopped before storing it whole (exit 3).
        StoreDamagedError: a table or ``summary.json`` is missing, truncated or unreadable
            (exit 3; names the run and the file).
        InfrastructureError: the store could not be reached.
    """
    from mlflow.exceptions import MlflowException

    from parity_tracker.track.ids import resolve_run_id

    check_run_id(run_id)
    uri = resolve_tracking_uri(tracking_uri)
    run_id = resolve_run_id(uri, run_id)  # any unique prefix, as the CLI takes it
    try:
        client = get_client(uri)
        run = retry(client.get_run, run_id)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc.error_code) or "not found" in str(exc).lower():
            raise InputError(f"no run {run_id!r} in {uri}") from exc
        raise InfrastructureError(f"cannot read run {run_id!r} from {uri}: {exc}") from exc
    from parity_tracker.track.nights import parent_error

    error = parent_error(uri, run)  # a night/shard parent: name it and some of its cells
    if error is not None:
        raise error
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
