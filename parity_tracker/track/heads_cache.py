"""``find_run_heads`` on a tracking server: stored runs' heads kept locally, keyed by run id.

``MlflowClient.search_runs`` makes the server build every param, tag and metric of every
matching run: 0.8 s for 300 runs on PostgreSQL (issue 18), growing with the runs. A stored
parity run (tag ``parity.complete``) never changes the fields ``history`` reads (status, start
time, commit, fingerprint, the run's own metrics), so its head is kept in a local file and only
the runs not kept yet are asked for, with ``attributes.run_id NOT IN (<kept ids>)``.

Kept heads are checked against the server on every call, so a run deleted (and perhaps
garbage-collected with ``mlflow gc``) since, or a fresh server behind the same URL, is never
shown:

- the file records the experiment's id and creation time; another experiment behind the same
  URL and name (a fresh server, a re-created experiment) discards every kept head;
- the kept ids (2,000 per filter) are probed with ONE tiny search: ``run_id IN (<ids>)`` among
  active runs, ordered by run id, ``max_results=1`` from offset ``len(ids) - 1`` (MLflow's
  own page token, ``SearchUtils.create_page_token``). It returns exactly the largest kept id,
  and no next page, only when every kept id is still an active run; the server builds one
  run, not thousands;
- anything else (a run deleted or gone, a server that refuses or reads the token otherwise, an
  ordering that differs) falls back to searching those ids in full: the active ones are kept
  (refreshed), the others dropped. Slower, never wrong.

So a history call is three small searches whatever the number of stored runs.

The file: ``<cache root>/heads/<sha256(uri, experiment)[:16]>.json`` (``track.cache.cache_root``),
``{"experiment": [id, creation time], "runs": {run_id: RunInfo fields}}``, written atomically;
a lost or corrupt file only costs a full search. A metric logged on a run after it was stored
(the nightly's ``regressions``) is not in its kept head; ``RunStore.find`` (the nightly's pages)
always searches the server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from parity_tracker.track.records import RunInfo
from parity_tracker.track.search import _quote
from parity_tracker.track.store import TAG_COMPLETE, get_client, param_key, retry

#: Run ids per ``IN`` / ``NOT IN`` list of one search filter.
_IDS_PER_FILTER = 2000


def _path(uri: str, experiment: str) -> Path:
    from parity_tracker.track.cache import cache_root

    key = hashlib.sha256(f"{uri}\n{experiment}".encode()).hexdigest()[:16]
    return cache_root() / "heads" / f"{key}.json"


def _identity(exp: Any) -> list[Any]:
    """What tells one experiment from another created later under the same name and URL."""
    return [str(exp.experiment_id), int(getattr(exp, "creation_time", None) or 0)]


def _load(path: Path, identity: list[Any]) -> dict[str, RunInfo]:
    try:
        raw = json.loads(path.read_text())
        if raw.get("experiment") != identity:  # another server or experiment: nothing kept
            return {}
        out = {}
        for rid, fields in raw["runs"].items():
            fields["metrics"] = {k: float.fromhex(v) for k, v in fields["metrics"].items()}
            out[rid] = RunInfo(**fields)
        return out
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def _save(path: Path, kept: Mapping[str, RunInfo], identity: list[Any]) -> None:
    from parity_tracker.files.atomic import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    data = {}
    for rid, info in kept.items():
        fields = dataclasses.asdict(info)  # metrics as float.hex: exact, NaN/inf in strict JSON
        fields["metrics"] = {k: float(v).hex() for k, v in info.metrics.items()}
        data[rid] = fields
    atomic_write_text(path, json.dumps({"experiment": identity, "runs": data}, allow_nan=False))


def _matches(info: RunInfo, settings: Mapping[str, Any]) -> bool:
    return all(info.params.get(param_key(k)) == str(v) for k, v in settings.items())


def _search(client: Any, exp_id: str, filt: str, view: Any = None) -> list[RunInfo]:
    out, token = [], None
    kwargs = {} if view is None else {"run_view_type": view}
    while True:
        page = retry(client.search_runs, [exp_id], filt, max_results=1000, page_token=token,
                     **kwargs)  # fmt: skip
        out += [RunInfo.from_mlflow(r) for r in page]
        token = page.token
        if not token:
            return out


def _id_list(ids: list[str]) -> str:
    return "(" + ", ".join(_quote(i) for i in ids) + ")"


def _all_active(client: Any, exp_id: str, ids: list[str]) -> bool:
    """True only when every run of ``ids`` is an active run of the experiment (one tiny search).

    Any doubt (an error, another answer than the largest id alone) is False.
    """
    from mlflow.entities import ViewType
    from mlflow.utils.search_utils import SearchUtils

    last = max(ids)
    token = None if len(ids) == 1 else SearchUtils.create_page_token(len(ids) - 1).decode()
    try:
        page = retry(client.search_runs, [exp_id], f"attributes.run_id IN {_id_list(ids)}",
                     run_view_type=ViewType.ACTIVE_ONLY, max_results=1,
                     order_by=["attributes.run_id ASC"], page_token=token)  # fmt: skip
    except Exception:  # a server reading the token otherwise: check in full
        return False
    return [r.info.run_id for r in page] == [last] and not page.token


def _check_kept(client: Any, exp_id: str, ids: list[str]) -> tuple[set[str], list[RunInfo]]:
    """``(ids no longer active, fresh heads of the active ones when re-read)`` (docstring)."""
    if _all_active(client, exp_id, ids):
        return set(), []
    alive = _search(client, exp_id, f"attributes.run_id IN {_id_list(ids)}")
    return set(ids) - {r.run_id for r in alive}, alive


def server_run_infos(uri: str, experiment: str, settings: Mapping[str, Any]) -> list[RunInfo]:
    """Every active run of ``experiment`` whose params match ``settings``, newest first.

    The same runs, in the same order, as ``query.find_runs`` (tested for equality, also after
    runs were deleted, garbage-collected, or the server replaced); read through the kept heads
    (module docstring).

    Raises:
        Exception: whatever MLflow raises when the server cannot be reached.
    """
    client = get_client(uri)
    exp = retry(client.get_experiment_by_name, experiment)
    if exp is None:
        return []
    path, identity = _path(uri, experiment), _identity(exp)
    kept = _load(path, identity)
    known = sorted(rid for rid, info in kept.items() if _matches(info, settings))
    base = " and ".join(f"params.`{param_key(k)}` = {_quote(v)}" for k, v in settings.items())
    chunks = [known[k : k + _IDS_PER_FILTER] for k in range(0, len(known), _IDS_PER_FILTER)]
    parts = [f"attributes.run_id NOT IN {_id_list(c)}" for c in chunks] or [""]
    new = _search(client, exp.experiment_id, " and ".join(p for p in [base, *parts] if p))
    gone: set[str] = set()
    reread: list[RunInfo] = []
    for chunk in chunks:
        lost, alive = _check_kept(client, exp.experiment_id, chunk)
        gone |= lost
        reread += alive
    for rid in gone:
        kept.pop(rid, None)
    fresh = {r.run_id: r for r in [*reread, *new] if r.tags.get(TAG_COMPLETE) == "true"}
    if fresh or gone or not path.is_file():
        kept.update(fresh)
        with contextlib.suppress(OSError):  # a read-only cache folder: the next call searches
            _save(path, kept, identity)
    runs = [kept.get(rid) for rid in known if rid not in gone] + new
    runs = [r for r in runs if r is not None]
    runs.sort(key=lambda r: (r.start_time, r.run_id), reverse=True)
    return runs
