"""Run ids as people type them: any unique prefix of an MLflow run id (as git takes SHAs).

``history`` and the digest print 12-character ids; every command that takes a run id resolves
it here (``RunStore.resolve_run_id``). A full 32-digit id is taken as is.
"""

from __future__ import annotations

import re
from typing import Any

from parity_tracker.errors import InfrastructureError, InputError, ParityTrackerError

#: MLflow run ids: 32 lowercase hex digits (``uuid.uuid4().hex``).
RUN_ID_LENGTH = 32
_HEX = re.compile(r"[0-9a-f]+")
#: Candidates listed in the "ambiguous" error.
_SHOWN = 10


def _sqlite_candidates(db: Any, prefix: str) -> list[str]:
    import sqlite3

    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    try:
        rows = con.execute(
            "SELECT run_uuid FROM runs WHERE run_uuid LIKE ? AND lifecycle_stage = 'active' "
            "ORDER BY run_uuid LIMIT ?",
            (prefix + "%", _SHOWN + 1),
        ).fetchall()
    finally:
        con.close()
    return [r[0] for r in rows]


def _server_candidates(uri: str, prefix: str) -> list[str]:
    """Run ids starting with ``prefix`` in every experiment (MLflow's ``LIKE`` on run_id)."""
    from parity_tracker.track.store import get_client, retry

    client = get_client(uri)
    exp_ids, token = [], None
    while True:
        page = retry(client.search_experiments, max_results=1000, page_token=token)
        exp_ids += [e.experiment_id for e in page]
        token = page.token
        if not token:
            break
    found: list[str] = []
    for k in range(0, len(exp_ids), 100):  # MLflow searches at most 100 experiments per call
        runs = retry(
            client.search_runs,
            exp_ids[k : k + 100],
            f"attributes.run_id LIKE '{prefix}%'",
            max_results=_SHOWN + 1,
        )
        found += [r.info.run_id for r in runs]
    return sorted(set(found))


def resolve_run_id(uri: str, run_id: str) -> str:
    """The full MLflow run id that ``run_id`` (a full id or any unique prefix) names.

    Args:
        uri: the resolved tracking URI.
        run_id: a run id, or 1 to 31 leading hex digits of one.

    Returns:
        The full run id (a 32-character or non-hex id is returned unchecked).

    Raises:
        InputError: a malformed id (``store.check_run_id``), no run starts with it, or several
            do (the message lists up to 10 candidates; give more digits).
        InfrastructureError: the store could not be reached.
    """
    from parity_tracker.track.store import check_run_id, retry, sqlite_path

    check_run_id(run_id)
    text = run_id.strip().lower()
    if len(text) >= RUN_ID_LENGTH or not _HEX.fullmatch(text):
        return run_id  # a whole id (MLflow's own are 32 hex digits; others are taken as given)
    db = sqlite_path(uri)
    try:
        if db is not None and db.is_file():
            found = retry(_sqlite_candidates, db, text)
        else:
            found = _server_candidates(uri, text)
    except ParityTrackerError:
        raise
    except Exception as exc:
        raise InfrastructureError(f"cannot look up run id {run_id!r} in {uri}: {exc}") from exc
    if text in found:
        return text
    if not found:
        raise InputError(f"no run id starts with {run_id!r} in {uri}")
    if len(found) > 1:
        shown = ", ".join(found[:_SHOWN]) + (" …" if len(found) > _SHOWN else "")
        raise InputError(f"run id prefix {run_id!r} is ambiguous; candidates: {shown}")
    return found[0]
