"""Folders of a run's artifacts: download one, log one (issue 20: reproducers).

The reproducer code above this layer never imports mlflow; it moves folders through here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from parity_tracker.errors import InfrastructureError, InputError
from parity_tracker.track.store import get_client, resolve_tracking_uri, retry


def download_folder(
    run_id: str,
    artifact_path: str,
    dest: str | os.PathLike[str],
    *,
    tracking_uri: str | None = None,
) -> Path | None:
    """Copy the run's ``artifact_path`` folder into ``dest`` (created); None when it is absent.

    Raises:
        InputError: no run ``run_id``.
        InfrastructureError: the store could not be reached.
    """
    from mlflow.exceptions import MlflowException

    uri = resolve_tracking_uri(tracking_uri)
    try:
        client = get_client(uri)
        retry(client.get_run, run_id)
    except MlflowException as exc:
        raise InputError(f"no run {run_id!r} in {uri}: {exc}") from exc
    parent, _, name = artifact_path.rstrip("/").rpartition("/")
    try:
        listed = [a.path for a in retry(client.list_artifacts, run_id, parent or None)]
    except Exception as exc:
        raise InfrastructureError(f"cannot list artifacts of run {run_id} in {uri}: {exc}") from exc
    if artifact_path.rstrip("/") not in listed:
        return None
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="parity-art-") as tmp:
        try:
            got = retry(client.download_artifacts, run_id, artifact_path, tmp)
        except Exception as exc:
            raise InfrastructureError(
                f"cannot download {artifact_path} of run {run_id}: {exc}"
            ) from exc
        shutil.copytree(got, dest / name, dirs_exist_ok=True)
    return dest / name


def log_folder(
    run_id: str,
    folder: str | os.PathLike[str],
    artifact_path: str,
    *,
    tracking_uri: str | None = None,
) -> str:
    """Log ``folder``'s files under the run's ``artifact_path``; returns that path.

    Raises:
        InputError: ``folder`` is not a folder.
        InfrastructureError: the store could not be reached.
    """
    if not Path(folder).is_dir():
        raise InputError(f"{folder} is not a folder")
    try:
        client = get_client(tracking_uri)
        retry(client.log_artifacts, run_id, str(folder), artifact_path)
    except Exception as exc:
        raise InfrastructureError(f"cannot log {folder} to run {run_id}: {exc}") from exc
    return artifact_path
