"""Where parity runs are tracked: the MLflow store's URI, its client, and safe concurrent use.

Embedded default (design.md, "Tracking store"): a SQLite MLflow store at
``<cwd>/.parity/mlflow.db`` with artifacts under ``<cwd>/.parity/artifacts``. An explicit URI,
then ``MLFLOW_TRACKING_URI``, wins over it. Experiments are always created with an explicit
artifact location, so no stray ``mlruns/`` folder appears.

Two processes may log to the same SQLite file at once: the store is created (schema migrated)
once under a file lock next to the database, and every store call made through ``retry`` is
retried with exponential backoff while SQLite answers "database is locked".

mlflow is imported inside functions only, so importing this module stays cheap.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

T = TypeVar("T")

PARITY_DIR = ".parity"
_INITIALISED: set[str] = set()
_INIT_GUARD = threading.Lock()

#: Backoff schedule of ``retry``: attempts, first delay (s), growth factor, cap (s).
RETRY_ATTEMPTS, RETRY_FIRST_DELAY_S, RETRY_FACTOR, RETRY_MAX_DELAY_S = 8, 0.05, 2.0, 2.0


def parity_home(cwd: str | os.PathLike[str] | None = None) -> Path:
    """``<cwd>/.parity``: the embedded store, artifacts, spool and cache live here."""
    return (Path(cwd) if cwd is not None else Path.cwd()).resolve() / PARITY_DIR


def default_tracking_uri(cwd: str | os.PathLike[str] | None = None) -> str:
    """``sqlite:///<cwd>/.parity/mlflow.db`` (absolute path, so it does not move with chdir)."""
    return f"sqlite:///{parity_home(cwd) / 'mlflow.db'}"


def resolve_tracking_uri(uri: str | None = None) -> str:
    """The tracking URI to use: ``uri`` if given, else ``$MLFLOW_TRACKING_URI``, else the default.

    A bare filesystem path ending in ``.db`` is taken as a SQLite file.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    if "://" not in uri and uri.endswith(".db"):
        uri = f"sqlite:///{Path(uri).resolve()}"
    return uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, or None for any other scheme."""
    parsed = urlparse(uri)
    if parsed.scheme != "sqlite":
        return None
    return Path(unquote(parsed.path))


def artifact_root(uri: str) -> str | None:
    """Artifact location for experiments created in the store at ``uri``.

    A SQLite store keeps artifacts in ``artifacts/`` next to its database file (for the
    default store: ``<cwd>/.parity/artifacts``). For a server (``http(s)://``) this is None: the
    server decides (with ``--serve-artifacts`` it proxies ``mlflow-artifacts:/``).
    """
    db = sqlite_path(uri)
    if db is None:
        return None
    return (db.parent / "artifacts").resolve().as_uri()


def is_locked_error(exc: BaseException) -> bool:
    """True for SQLite's transient "database is locked" / "database is busy" errors."""
    text = str(exc).lower()
    return "database is locked" in text or "database is busy" in text


def retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)``, retrying with exponential backoff on "database is locked".

    Delays start at ``RETRY_FIRST_DELAY_S`` and grow by ``RETRY_FACTOR`` up to
    ``RETRY_MAX_DELAY_S`` with ±50% jitter, over ``RETRY_ATTEMPTS`` attempts (about 8 s in all).
    Any other exception is raised at once.
    """
    delay = RETRY_FIRST_DELAY_S
    for attempt in range(RETRY_ATTEMPTS):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not is_locked_error(exc) or attempt == RETRY_ATTEMPTS - 1:
                raise
        time.sleep(delay * random.uniform(0.5, 1.5))
        delay = min(delay * RETRY_FACTOR, RETRY_MAX_DELAY_S)
    raise AssertionError("unreachable")  # pragma: no cover


def _file_lock(uri: str):
    """A ``filelock.FileLock`` next to a SQLite database; a no-op lock for other stores."""
    import contextlib

    from filelock import FileLock

    db = sqlite_path(uri)
    if db is None:
        return contextlib.nullcontext()
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(db) + ".lock", timeout=120)


def get_client(uri: str | None = None) -> MlflowClient:
    """An ``MlflowClient`` for ``resolve_tracking_uri(uri)``, the store initialised once.

    For SQLite the database is created and migrated under a file lock, so concurrent first
    users never race on the schema. The registry URI is set to the same store.

    Raises:
        Exception: whatever mlflow raises when the store cannot be reached (callers that must
            not lose a run catch it and spool, see ``parity_tracker.track``).
    """
    from mlflow.tracking import MlflowClient

    uri = resolve_tracking_uri(uri)
    with _INIT_GUARD:
        if uri not in _INITIALISED:
            # MlflowClient() itself opens the store (and migrates a new SQLite file): under lock.
            with _file_lock(uri):
                client = retry(MlflowClient, tracking_uri=uri, registry_uri=uri)
                retry(client.search_experiments, max_results=1)
            _INITIALISED.add(uri)
            return client
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def get_or_create_experiment(client: MlflowClient, name: str) -> str:
    """Id of experiment ``name``, creating it with an explicit artifact location if missing.

    Creation is serialised by the store's file lock (SQLite) and tolerates another process
    creating the same experiment at the same moment.
    """
    from mlflow.exceptions import MlflowException

    uri = client.tracking_uri
    exp = retry(client.get_experiment_by_name, name)
    if exp is not None:
        return exp.experiment_id
    root = artifact_root(uri)
    with _file_lock(uri):
        exp = retry(client.get_experiment_by_name, name)
        if exp is not None:
            return exp.experiment_id
        location = f"{root}/{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}" if root else None
        try:
            return retry(client.create_experiment, name, artifact_location=location)
        except MlflowException as exc:
            if "already exists" not in str(exc).lower():
                raise
            return retry(client.get_experiment_by_name, name).experiment_id
