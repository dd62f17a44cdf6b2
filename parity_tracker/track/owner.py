"""Who writes a run, whether that writer still lives, and what is left when it does not.

A ``log_run`` (or a nightly's parent run) records its owner — host name, PID and the process's
start time — twice: as MLflow tags on the run (``parity.owner.host``, ``parity.owner.pid``,
``parity.owner.start``) and in ``owner.json`` of its staging folder
(``<spool>/.staging/<parity run id>.<pid>/``). A writer killed by SIGKILL or a power cut leaves
both behind; ``parity-tracker sync`` then:

- finishes a staged run whose owner is gone (:func:`recover_staging`: a complete staging folder
  becomes a spool entry and is uploaded; a half-written one held nothing uploaded and is
  removed);
- marks KILLED every RUNNING run whose owner is gone (:func:`reap_stale_runs`): on this host
  when no process has that PID and start time; on another host (or with no owner recorded)
  once the run started more than ``STALE_RUN_TIMEOUT_S`` ago.

The PID and start time come from psutil (https://psutil.readthedocs.io, ``Process.create_time``;
the pair names one process even after the PID is reused).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity_tracker.errors import InputError
from parity_tracker.files.atomic import atomic_write_json
from parity_tracker.track.store import TAG_COMPLETE, get_client, retry

#: MLflow tags naming a run's writer.
TAG_OWNER_HOST, TAG_OWNER_PID, TAG_OWNER_START = (
    "parity.owner.host",
    "parity.owner.pid",
    "parity.owner.start",
)
#: A RUNNING run written from another host (or with no owner recorded) is marked KILLED by
#: ``sync`` once it started this long ago (24 h: longer than any nightly).
STALE_RUN_TIMEOUT_S = 24 * 3600.0
#: Folder of the spool where runs are staged while they upload.
STAGING_DIR = ".staging"
OWNER_FILE = "owner.json"
_START_SLACK_S = 1.0  # create_time is rounded differently across calls on some platforms


@dataclass(frozen=True)
class Owner:
    """A process: host name, PID and start time (seconds since the epoch, psutil's)."""

    host: str
    pid: int
    start: float

    def tags(self) -> dict[str, str]:
        """The owner as MLflow tags."""
        return {
            TAG_OWNER_HOST: self.host,
            TAG_OWNER_PID: str(self.pid),
            TAG_OWNER_START: f"{self.start:.3f}",
        }

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> Owner | None:
        """The owner recorded in a run's tags, or None when absent or malformed."""
        try:
            return cls(
                str(tags[TAG_OWNER_HOST]), int(tags[TAG_OWNER_PID]), float(tags[TAG_OWNER_START])
            )
        except (KeyError, TypeError, ValueError):
            return None

    def alive(self) -> bool | None:
        """True/False when the owner is on this host; None for another host (unknowable)."""
        import psutil

        if self.host != socket.gethostname():
            return None
        try:
            started = psutil.Process(self.pid).create_time()
        except psutil.NoSuchProcess:
            return False
        except psutil.Error:  # AccessDenied, ...: assume it lives
            return True
        return abs(started - self.start) <= _START_SLACK_S


def current_owner() -> Owner:
    """This process as an :class:`Owner`."""
    import psutil

    pid = os.getpid()
    return Owner(socket.gethostname(), pid, psutil.Process(pid).create_time())


def fault_point(step: str) -> None:
    """Test hook: SIGKILL this process at ``step`` when ``$PARITY_TRACKER_FAULT`` names it.

    Steps of ``log_run``: ``staging`` (tables written, ``run.json`` not yet), ``staged``,
    ``created`` (MLflow run created), ``logged`` (params/metrics/tags), ``artifacts``,
    ``terminated`` (status set, ``parity.complete`` not yet). Used by the crash tests only.
    """
    if os.environ.get("PARITY_TRACKER_FAULT") == step:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# staging


def new_staging(root: Path, parity_run_id: str, extra: dict[str, Any]) -> Path:
    """A fresh staging folder ``root/.staging/<parity_run_id>.<pid>/`` holding ``owner.json``.

    ``extra`` (the tracking URI, the tensors folder) is stored with the owner, for
    :func:`recover_staging`.
    """
    owner = current_owner()
    folder = root / STAGING_DIR / f"{parity_run_id}.{owner.pid}"
    if folder.exists():
        shutil.rmtree(folder)
    for attempt in range(3):  # a concurrent drop_staging may remove an empty parent
        try:
            folder.mkdir(parents=True)
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    record = {"host": owner.host, "pid": owner.pid, "start": owner.start,
              "parity_run_id": parity_run_id, **extra}  # fmt: skip
    atomic_write_json(folder / OWNER_FILE, record)
    return folder


def drop_staging(folder: Path) -> None:
    """Remove a staging folder, then its parents ``.staging`` and the spool when left empty."""
    shutil.rmtree(folder, ignore_errors=True)
    for parent in (folder.parent, folder.parent.parent):
        try:
            parent.rmdir()
        except OSError:  # not empty (another run staged, or a spool entry): keep it
            return


def _staging_owner(folder: Path) -> tuple[Owner | None, dict[str, Any]]:
    try:
        record = json.loads((folder / OWNER_FILE).read_text(encoding="utf-8"))
        if not isinstance(record, dict):
            return None, {}
        return Owner(str(record["host"]), int(record["pid"]), float(record["start"])), record
    except (OSError, ValueError, KeyError, TypeError):
        return None, {}


def _abandoned(folder: Path, owner: Owner | None, now: float) -> bool:
    alive = owner.alive() if owner is not None else None
    if alive is not None:
        return not alive
    try:
        age = now - folder.stat().st_mtime
    except OSError:
        return False
    return age > STALE_RUN_TIMEOUT_S


def _copy_tensors(folder: Path, tensors: Any) -> None:
    """Copy the killed writer's dump folder into the staged run, if it is still there.

    Only a folder of the same owner (uid) as the staging folder is read: ``owner.json`` names
    it, and a spool writable by others must not make sync read another user's files.
    """
    if not isinstance(tensors, str) or not tensors:
        return
    src = Path(tensors)
    dst = folder / "artifacts" / "tensors"
    try:
        same_user = src.is_dir() and src.stat().st_uid == folder.stat().st_uid
    except OSError:
        return
    if same_user and not dst.exists():
        shutil.copytree(src, dst, symlinks=True)


def recover_staging(root: Path, *, now: float | None = None) -> list[str]:
    """Turn the staging folders of dead writers into spool entries (or remove them).

    A folder with ``run.json`` was staged whole: it becomes ``root/<parity run id>`` (its
    tensors copied in from the recorded tensors folder when that still exists), so the spool
    sync uploads it and replaces any half-uploaded MLflow run of the same parity run id. A
    folder without ``run.json`` was killed while staging, before anything was uploaded: it is
    removed. Folders of live writers are left alone.

    Returns:
        The names of the staging folders handled.
    """
    from parity_tracker.files.safe_paths import resolve_inside

    staging = root / STAGING_DIR
    if not staging.is_dir():
        return []
    now = time.time() if now is None else now
    handled = []
    for folder in sorted(p for p in staging.iterdir() if p.is_dir() and not p.is_symlink()):
        owner, record = _staging_owner(folder)
        if not _abandoned(folder, owner, now):
            continue
        handled.append(folder.name)
        parity_id = str(record.get("parity_run_id") or "")
        try:
            final = resolve_inside(root, parity_id, what="parity run id")
        except InputError:
            final = None
        if not (folder / "run.json").is_file() or final is None or final.exists():
            drop_staging(folder)
            continue
        _copy_tensors(folder, record.get("tensors_dir"))
        os.replace(folder, final)
    with contextlib.suppress(OSError):  # live writers' folders remain
        staging.rmdir()
    return handled


# ---------------------------------------------------------------------------------------------
# stale RUNNING runs


def _running_runs(client: Any) -> list[Any]:
    exps = retry(client.search_experiments)
    if not exps:
        return []
    return retry(
        client.search_runs,
        [e.experiment_id for e in exps],
        "attributes.status = 'RUNNING'",
        max_results=5000,
    )


def reap_stale_runs(
    tracking_uri: str | None = None, *, now: float | None = None, timeout_s: float | None = None
) -> list[str]:
    """Mark KILLED every RUNNING run of the store whose writer is gone (see module docstring).

    Args:
        tracking_uri: the store (default: ``store.resolve_tracking_uri``).
        now: the current time in seconds since the epoch (tests pass one).
        timeout_s: the other-host timeout (default ``STALE_RUN_TIMEOUT_S``).

    Returns:
        The MLflow run ids marked KILLED (tagged ``parity.killed_by = sync``).

    Raises:
        Exception: whatever the store raises when it cannot be reached.
    """
    client = get_client(tracking_uri)
    now = time.time() if now is None else now
    timeout_s = STALE_RUN_TIMEOUT_S if timeout_s is None else timeout_s
    killed = []
    for run in _running_runs(client):
        tags = dict(run.data.tags)
        if tags.get(TAG_COMPLETE) == "true":
            continue
        owner = Owner.from_tags(tags)
        alive = owner.alive() if owner is not None else None
        started = (run.info.start_time or 0) / 1000.0
        if alive is True or (alive is None and now - started <= timeout_s):
            continue
        reason = "owner process gone" if alive is False else f"no update for {timeout_s:.0f} s"
        retry(client.set_tag, run.info.run_id, "parity.killed_by", f"sync: {reason}")
        retry(client.set_terminated, run.info.run_id, "KILLED", int(now * 1000))
        killed.append(run.info.run_id)
    return killed
