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
    directory, so the database, its artifacts and the tag index stay together after a chdir
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
    ``WINDOW_MAX_DELAY_S``, until ``retry_window_s()`` seconds have passed since the first
    failure. Any other exception is raised at once.
    """
    delay = RETRY_FIRST_DELAY_S
    attempt, window_end = 0, None
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
                window_end = window_end if window_end is not None else now + retry_window_s()
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
    """
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


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


# ---------------------------------------------------------------------------------------------
# tag-status index (embedded stores only)

#: File of the tag-status index, next to a SQLite store's database.
TAG_INDEX_FILE = "parity_index.db"
_INDEX_READY: set[str] = set()
_INDEX_SCHEMA = """
CREATE TABLE IF NOT EXISTS indexed_runs (run_id TEXT PRIMARY KEY, n_rows INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tag_status (
    run_id TEXT NOT NULL, tag TEXT NOT NULL, step INTEGER, status TEXT, ord INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS tag_status_tag_run ON tag_status (tag, run_id);
"""
#: Bound parameters per ``IN (...)`` query, under SQLite's historical 999-variable limit.
_IN_CHUNK = 900


def tag_index_path(uri: str) -> Path | None:
    """Where the tag-status index of the store at ``uri`` lives.

    ``<dir of mlflow.db>/parity_index.db`` for a ``sqlite:///`` store (filled by ``log_run``);
    for any other store a local copy kept by its readers,
    ``<run cache root>/tag_index/<sha256(uri)[:16]>.db`` (``track.cache.cache_root``), filled
    from the modules tables they fetch: stored runs never change, so their rows stay true.
    """
    import hashlib

    uri = resolve_tracking_uri(uri)
    db = sqlite_path(uri)
    if db is not None:
        return db.parent / TAG_INDEX_FILE
    from parity_tracker.track.cache import cache_root

    return cache_root() / "tag_index" / f"{hashlib.sha256(uri.encode()).hexdigest()[:16]}.db"


def _connect_index(path: Path):
    import sqlite3

    return sqlite3.connect(str(path), timeout=10)


def _create_index(uri: str, path: Path) -> None:
    """Create the index's tables once per process, under the store's file lock."""
    key = str(path)
    if key in _INDEX_READY:
        return
    with _file_lock(uri):
        con = retry(_connect_index, path)
        try:
            retry(con.executescript, _INDEX_SCHEMA)
        finally:
            con.close()
    _INDEX_READY.add(key)


def _insert_run(path: Path, run_id: str, rows: list[tuple[Any, ...]]) -> None:
    """One transaction: mark ``run_id`` indexed and insert its rows (nothing if already there)."""
    con = _connect_index(path)
    try:
        with con:
            cur = con.execute(
                "INSERT OR IGNORE INTO indexed_runs (run_id, n_rows) VALUES (?, ?)",
                (run_id, len(rows)),
            )
            if cur.rowcount == 1:
                con.executemany(
                    "INSERT INTO tag_status (run_id, tag, step, status, ord) "
                    "VALUES (?, ?, ?, ?, ?)",
                    rows,
                )
    finally:
        con.close()


def write_tag_index_many(uri: str, runs: list[tuple[str, Any]]) -> None:
    """``write_tag_index`` for many ``(run_id, modules table)`` at once (one transaction each).

    Raises:
        sqlite3.Error: the index could not be written.
    """
    path = tag_index_path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    _create_index(uri, path)
    if len(runs) == 1:
        retry(_insert_run, path, runs[0][0], _index_rows(*runs[0]))
    else:
        retry(_insert_many, path, runs)


def _insert_many(path: Path, runs: list[tuple[str, Any]]) -> None:
    """One transaction for many runs (each marked indexed with its rows; present ones skipped).

    Measured: 1,000 runs × 2,000 rows in one transaction take seconds, one transaction per
    run minutes (a commit each).
    """
    con = _connect_index(path)
    con.execute("PRAGMA synchronous = OFF")  # a cache of immutable rows: a crash loses nothing
    try:
        with con:
            have = set()
            ids = [r for r, _ in runs]
            for k in range(0, len(ids), _IN_CHUNK):
                chunk = ids[k : k + _IN_CHUNK]
                marks = ",".join("?" * len(chunk))
                sql = f"SELECT run_id FROM indexed_runs WHERE run_id IN ({marks})"
                have |= {row[0] for row in con.execute(sql, chunk)}
            for run_id, modules in runs:
                if run_id in have:
                    continue
                have.add(run_id)
                rows = _index_rows(run_id, modules)
                con.execute(
                    "INSERT INTO indexed_runs (run_id, n_rows) VALUES (?, ?)", (run_id, len(rows))
                )
                con.executemany(
                    "INSERT INTO tag_status (run_id, tag, step, status, ord) "
                    "VALUES (?, ?, ?, ?, ?)",
                    rows,
                )
    finally:
        con.close()


def _index_rows(run_id: str, modules: Any) -> list[tuple[Any, ...]]:
    n = modules.num_rows
    step = modules.column("step").to_pylist() if "step" in modules.column_names else [0] * n
    return list(
        zip(
            [run_id] * n,
            modules.column("tag").to_pylist(),
            step,
            modules.column("status").to_pylist(),
            range(n),
            strict=True,
        )
    )


def write_tag_index(uri: str, run_id: str, modules: Any) -> bool:
    """Record a stored run's ``(tag, step, status)`` rows in the store's tag-status index.

    Only for embedded (``sqlite:///``) stores: the index is ``<dir of mlflow.db>/parity_index.db``
    (tables ``indexed_runs`` and ``tag_status``, indexed on ``(tag, run_id)``), so that
    ``history --tag`` answers with one indexed query instead of opening every run's
    ``tables/modules.parquet``. Rows keep the modules table's row order (column ``ord``); the
    run is marked indexed in the same transaction, so a run is either wholly indexed or absent.
    Writing a run twice is a no-op. Retried on "database is locked" (``retry``).

    Args:
        uri: the tracking URI.
        run_id: the MLflow run id.
        modules: the run's ``modules`` table (``tables.MODULES_SCHEMA``; columns ``tag``,
            ``step``, ``status`` are read).

    Returns:
        True when written (or already there), False for a non-SQLite store.

    Raises:
        sqlite3.Error: the index could not be written (``track.log_run`` only warns).
    """
    if sqlite_path(resolve_tracking_uri(uri)) is None:
        return False
    write_tag_index_many(uri, [(run_id, modules)])
    return True


def _read_index(path: Path, run_ids: list[str], tag: str) -> dict[str, list[str]] | None:
    import sqlite3

    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    try:
        found = 0
        out: dict[str, list[tuple[int, str]]] = {}
        for k in range(0, len(run_ids), _IN_CHUNK):
            chunk = run_ids[k : k + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            (n,) = con.execute(
                f"SELECT COUNT(*) FROM indexed_runs WHERE run_id IN ({marks})", chunk
            ).fetchone()
            found += n
            if found < k + len(chunk):
                return None  # a run logged before the index existed (or elsewhere)
            for rid, status, ord_ in con.execute(
                f"SELECT run_id, status, ord FROM tag_status WHERE tag = ? AND run_id IN ({marks})",
                [tag, *chunk],
            ):
                out.setdefault(rid, []).append((ord_, status))
        return {rid: [s for _, s in sorted(rows)] for rid, rows in out.items()}
    finally:
        con.close()


def read_tag_index(uri: str, run_ids: list[str], tag: str) -> dict[str, list[str]] | None:
    """``{run_id: tag's statuses in row order}`` from the tag-status index, or None.

    None (the caller reads the modules tables instead) when the store is not SQLite, the index
    does not exist, any of ``run_ids`` is not in it (a run logged before the index existed), or
    the index cannot be read. Runs without ``tag`` are absent from the dict.
    """
    import sqlite3

    path = tag_index_path(uri)
    if path is None or not path.is_file():
        return None
    unique = list(dict.fromkeys(run_ids))
    try:
        return retry(_read_index, path, unique, tag)
    except sqlite3.Error:
        return None
