"""Finding stored parity runs: ``find_runs`` (full records) and ``find_run_heads`` (heads).

On the embedded SQLite store ``find_run_heads`` reads MLflow's own tables with one SQL query
(the fast path); elsewhere both go through ``MlflowClient.search_runs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from parity_tracker.track.records import RunHead, RunInfo
from parity_tracker.track.store import (
    TAG_COMPLETE,
    TAG_PASSED,
    TAG_RUN_ID,
    TAG_TARGET_SPEC,
    get_client,
    is_incomplete,
    param_key,
    resolve_tracking_uri,
    retry,
    stored_passed,
)
from parity_tracker.track.tag_codes import TAG_CODES, code_tags


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


def stored_target_names(
    *,
    tracking_uri: str | None = None,
    experiment: str = "parity",
    spec: str | None = None,
    max_results: int | None = None,
) -> list[str]:
    """The distinct ``target`` params of stored runs, newest first.

    Args:
        tracking_uri: the store.
        experiment: the experiment searched.
        spec: only runs made from this target spec (tag ``store.TAG_TARGET_SPEC``, e.g.
            ``mypkg.pairs:build`` whose case stores the name ``my-net``).
        max_results: read at most this many runs, newest first (default 5,000: the list is
            for messages).
    """
    client = get_client(tracking_uri)
    exp = retry(client.get_experiment_by_name, experiment)
    if exp is None:
        return []
    filt = f"tags.`{TAG_TARGET_SPEC}` = {_quote(spec)}" if spec is not None else ""
    names: dict[str, None] = {}
    token, seen = None, 0
    while seen < (max_results or 5000):
        page = retry(client.search_runs, [exp.experiment_id], filt, max_results=1000,
                     order_by=["attributes.start_time DESC"], page_token=token)  # fmt: skip
        for run in page:
            if run.data.params.get(param_key("target")):
                names.setdefault(run.data.params[param_key("target")], None)
        seen, token = seen + len(page), page.token
        if not token:
            break
    return list(names)


_HEADS_SQL = """
SELECT r.run_uuid, r.start_time, r.status, r.artifact_uri,
  (SELECT t.value FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ?),
  (SELECT p.value FROM params p WHERE p.run_uuid = r.run_uuid AND p.key = 'config_fingerprint'),
  (SELECT p.value FROM params p WHERE p.run_uuid = r.run_uuid AND p.key = 'mode'),
  (SELECT t.value FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ?),
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

    One query for the runs (``runs`` + ``tags`` + ``params``), two per 500 runs for
    ``latest_metrics`` and the tags holding per-tag statuses (``track.tag_codes``).
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
        args: list[Any] = ["mlflow.source.git.commit", TAG_COMPLETE, TAG_PASSED, exp[0]]
        for key, value in settings.items():
            args += [param_key(key), str(value)]
        sql = _HEADS_SQL.format(
            where=_PARAM_SQL * len(settings), limit=" LIMIT ?" if max_results else ""
        )
        rows = con.execute(sql, [*args, *([max_results] if max_results else [])]).fetchall()
        metrics: dict[str, dict[str, float]] = {row[0]: {} for row in rows}
        codes: dict[str, dict[str, str]] = {row[0]: {} for row in rows}
        ids = list(metrics)
        for k in range(0, len(ids), _SQL_CHUNK):
            chunk = ids[k : k + _SQL_CHUNK]
            query = (
                "SELECT run_uuid, key, value, is_nan FROM latest_metrics "
                f"WHERE run_uuid IN ({','.join('?' * len(chunk))})"
            )
            for run_id, key, value, is_nan in con.execute(query, chunk):
                metrics[run_id][key] = math.nan if is_nan else float(value)
            query = (  # a key range ('/' follows '.'): MLflow's (key, run_uuid) primary key
                "SELECT run_uuid, key, value FROM tags WHERE ((key >= ? AND key < ?) OR key = ?) "
                f"AND run_uuid IN ({','.join('?' * len(chunk))})"
            )  # the codes and the parity.run_id they are bound to (tag_codes.code_tags)
            keys = [TAG_CODES, TAG_CODES + "/", TAG_RUN_ID]
            for run_id, key, value in con.execute(query, [*keys, *chunk]):
                codes[run_id][key] = value
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
            code_tags(codes[rid]),
            stored_passed(passed),
            mode,
        )
        for rid, start, status, artifact_uri, commit, fingerprint, mode, complete, passed in rows
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

    from parity_tracker.track.store import is_locked_error, sqlite_path

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
