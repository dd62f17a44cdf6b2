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
from urllib.parse import quote, unquote, urlparse

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

T = TypeVar("T")

PARITY_DIR = ".parity"
#: MLflow tags every parity run carries: its parity run id, and "stored whole" (set last).
TAG_RUN_ID, TAG_COMPLETE = "parity.run_id", "parity.complete"
#: The run's verdict as stored (``"true"`` / ``"false"``: ``run.summary``'s ``passed``, the one
#: verdict: completed, at least one tensor compared, no failing row). Readers decide pass/fail
#: from it with :func:`stored_passed`, never from counts.
TAG_PASSED = "parity.passed"
#: MLflow tag of a run made from a target spec (``parity-tracker run SPEC``): SPEC as given,
#: e.g. ``mypkg.pairs:build``, when the stored ``target`` param is another name (the case's
#: own ``settings["target"]``), so ``history``/``diff --target`` accept that spelling.
TAG_TARGET_SPEC = "parity.target_spec"


def stored_passed(value: str | None) -> bool:
    """True only for the stored verdict ``"true"`` (tag :data:`TAG_PASSED`); absent fails."""
    return value == "true"


#: MLflow statuses of a run whose upload may have stopped half way (see ``is_incomplete``).
UNFINISHED_STATUSES = frozenset({"RUNNING", "KILLED", "SCHEDULED"})


def is_incomplete(status: str | None, complete_tag: str | None) -> bool:
    """True for a stored run whose writer stopped before storing it whole.

    ``log_run`` uploads the artifacts before it sets the final status, and sets
    ``parity.complete = true`` last. A run still RUNNING (or SCHEDULED), or KILLED by
    ``sync`` (``track.owner.reap_stale_runs``), without that tag may lack its tables: history,
    diff selection, report and the nightly's baseline skip it. A FINISHED or FAILED run holds
    its tables even without the tag (runs written by other tools, or killed after the status).
    """
    return complete_tag != "true" and str(status) in UNFINISHED_STATUSES


_KEY_BAD = re.compile(r"[^\w./\- ]")
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
    A relative SQLite URI (``sqlite:///rel/x.db``, three slashes: relative to the working
    directory, as SQLAlchemy and MLflow read it) is made absolute against the current working
    directory, so the database and its artifacts stay together after a chdir
    and a spooled run goes back to the same file.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    if "://" not in uri and uri.endswith(".db"):
        uri = f"sqlite:///{Path(uri).resolve()}"
    db = sqlite_path(uri)
    if db is not None:
        base, sep, query = uri.partition("?")
        scheme = base.split(":", 1)[0]  # sqlite, or sqlite+driver
        uri = f"{scheme}:///{quote(str(db))}{sep}{query}"
    return uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a SQLite URI, read exactly as SQLAlchemy reads it; else None.

    ``sqlite:///rel/x.db`` (three slashes) is ``rel/x.db`` relative to the current working
    directory; ``sqlite:////abs/x.db`` (four) is ``/abs/x.db`` (SQLAlchemy's
    ``engine.make_url(uri).database``; https://docs.sqlalchemy.org/en/20/dialects/sqlite.html
    "Connect Strings"). The result is absolute (resolved against the working directory now).
    None for another scheme and for an in-memory database (``sqlite://``, ``:memory:``).
    """
    if urlparse(uri).scheme.split("+", 1)[0] != "sqlite":
        return None
    from sqlalchemy.engine import make_url

    database = make_url(uri).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).absolute()


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


def local_artifact_dir(run_id: str, uri: str | None = None) -> Path | None:
    """The on-disk artifact folder of run ``run_id``, or None when the artifacts are remote.

    Local means a ``file:`` artifact URI (the embedded store's ``.parity/artifacts/...``) or a
    plain path; ``mlflow-artifacts:``, ``s3:`` and the like are None, as is a run the store
    cannot find (a failure here never hides a nightly's results).
    """
    try:
        art = get_client(resolve_tracking_uri(uri)).get_run(run_id).info.artifact_uri
    except Exception:
        return None
    parsed = urlparse(art or "")
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(unquote(parsed.path))
    return Path(art) if art and parsed.scheme == "" else None


#: MLflow's own run id rule (``mlflow/utils/validation.py``, ``_RUN_ID_REGEX``).
RUN_ID_PATTERN = re.compile(r"^[a-zA-Z0-9][\w\-]{0,255}$")


def check_run_id(run_id: object) -> str:
    """``run_id`` when it is a well-formed MLflow run id (``RUN_ID_PATTERN``).

    Raises:
        InputError: a malformed id (usage error, exit 2), e.g. ``x'``; names it and the rule.
    """
    from parity_tracker.errors import InputError

    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
        raise InputError(
            f"run id {run_id!r} is malformed: an MLflow run id is a letter or digit followed by "
            "up to 255 letters, digits, '_' or '-' (e.g. 0f3c2a...; see `parity-tracker history`)"
        )
    return run_id


def param_key(key: str) -> str:
    """A valid MLflow param key: characters other than word, ``./- `` become ``_``."""
    return _KEY_BAD.sub("_", str(key))[:250]


def is_locked_error(exc: BaseException) -> bool:
    """True for SQLite's transient "database is locked" / "database is busy" errors."""
    text = str(exc).lower()
    return "database is locked" in text or "database is busy" in text


#: Env var: seconds a tracking-server call is retried on transient faults before giving up.
RETRY_WINDOW_ENV = "PARITY_TRACKER_STORE_RETRY_S"
#: Default of ``RETRY_WINDOW_ENV``: rides out a one-minute server restart (measured 17-35 s for
#: MLflow 3.17 on PostgreSQL, issue 18) with margin.
DEFAULT_RETRY_WINDOW_S = 90.0
#: Longest pause between two attempts inside the window (s).
WINDOW_MAX_DELAY_S = 5.0
#: Words of the errors a restarting or overloaded server gives (requests/urllib3 connection
#: errors as MLflow wraps them, and HTTP 429/502/503/504).
_TRANSIENT = (
    "connection refused", "connection aborted", "connection reset", "remote end closed",
    "max retries exceeded", "temporarily unavailable", "timed out", "read timed out",
    "bad gateway", "service unavailable", "gateway timeout", "too many requests",
    "too many 5", "response code 50", "status code 50", "newconnectionerror",
    "remotedisconnected", "connectionerror", "protocolerror", "chunkedencodingerror",
    "incompleteread",
)  # fmt: skip


def retry_window_s() -> float:
    """Seconds ``retry`` keeps retrying transient server faults: ``$PARITY_TRACKER_STORE_RETRY_S``.

    Default ``DEFAULT_RETRY_WINDOW_S`` (90 s). The CLI's ``--store-retry-s`` sets the variable.

    Raises:
        InputError: the variable is not a non-negative number.
    """
    from parity_tracker.errors import InputError

    raw = os.environ.get(RETRY_WINDOW_ENV)
    if raw is None or raw == "":
        return DEFAULT_RETRY_WINDOW_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise InputError(f"${RETRY_WINDOW_ENV}={raw!r}: give a number of seconds >= 0, e.g. 90")
    return value


def is_transient_error(exc: BaseException) -> bool:
    """True for a fault a server restart or overload causes (connection refused/reset, 5xx).

    Connection-level exceptions (``ConnectionError``, ``TimeoutError``) by type; MLflow's
    ``MlflowException`` wrapping of requests' errors by their text (``_TRANSIENT``).
    A 4xx answer (bad request, not found) is not transient.
    """
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(word in text for word in _TRANSIENT)


def retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)``, retrying with exponential backoff on transient faults.

    SQLite's "database is locked": delays start at ``RETRY_FIRST_DELAY_S`` and grow by
    ``RETRY_FACTOR`` up to ``RETRY_MAX_DELAY_S`` with ±50% jitter, over ``RETRY_ATTEMPTS``
    attempts (about 8 s in all). A tracking server's transient faults (``is_transient_error``:
    refused connection during a restart, 5xx): the same growing delays capped at
    ``WINDOW_MAX_DELAY_S``, within ``W = retry_window_s()`` seconds counted from the first
    attempt. Any other exception is raised at once.

    The bound: a pause never reaches past the window's end and no attempt starts after it, so
    one call takes at most ``W`` plus the duration of its last attempt. That attempt is one
    HTTP request, because ``get_client`` turns MLflow's own retries off
    (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` unless set; they multiplied the window: 13.7 s for
    a 1 s window against a refused port): milliseconds for a refused connection, at most
    ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (MLflow's default 120 s) for a server that accepts and
    never answers.
    """
    delay = RETRY_FIRST_DELAY_S
    attempt, window_end, start = 0, None, time.monotonic()
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            attempt += 1
            if is_locked_error(exc):
                if attempt >= RETRY_ATTEMPTS:
                    raise
                pause = delay * random.uniform(0.5, 1.5)
            elif is_transient_error(exc):
                now = time.monotonic()
                window_end = window_end if window_end is not None else start + retry_window_s()
                if now >= window_end:
                    raise
                pause = min(delay * random.uniform(0.5, 1.5), window_end - now)
            else:
                raise
        time.sleep(pause)
        delay = min(delay * RETRY_FACTOR, WINDOW_MAX_DELAY_S if window_end else RETRY_MAX_DELAY_S)


def _file_lock(uri: str):
    """A ``filelock.FileLock`` next to a SQLite database; a no-op lock for other stores."""
    import contextlib

    from filelock import FileLock

    db = sqlite_path(uri)
    if db is None:
        return contextlib.nullcontext()
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(db) + ".lock", timeout=120)


def quiet_mlflow() -> None:
    """Keep MLflow's own prints off stdout (``--json`` prints one document there).

    ``MlflowClient.set_terminated`` writes "🏃 View run … / 🧪 View experiment …" to stdout for
    every run ended on a server (``mlflow/tracking/_tracking_service/client.py``, ``_log_url``,
    MLflow 3.17) unless ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT`` is set; setting it also
    saves the ``get_run`` call made only for that print. Set here, before any client is made.

    Also turns MLflow's own HTTP retries off unless ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` is set:
    :func:`retry` retries every store call within the retry window, and MLflow's retries
    (default 7, backoff factor 2) inside each attempt would stretch one call far past it.
    """
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")


def get_client(uri: str | None = None) -> MlflowClient:
    """An ``MlflowClient`` for ``resolve_tracking_uri(uri)``, the store initialised once.

    For SQLite the database is created and migrated under a file lock, so concurrent first
    users never race on the schema. The registry URI is set to the same store.

    Raises:
        Exception: whatever mlflow raises when the store cannot be reached (callers that must
            not lose a run catch it and spool, see ``parity_tracker.track``).
    """
    from mlflow.tracking import MlflowClient

    quiet_mlflow()
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

    A new experiment gets ``browse.experiment_tags()``: it opens in the UI's classic runs view
    (``mlflow.experimentKind``) and holds the parity saved view of the runs table.

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
        from parity_tracker.track.browse import experiment_tags

        try:
            return retry(
                client.create_experiment, name, artifact_location=location,
                tags=experiment_tags(),
            )  # fmt: skip
        except MlflowException as exc:
            if "already exists" not in str(exc).lower():
                raise
            return retry(client.get_experiment_by_name, name).experiment_id
