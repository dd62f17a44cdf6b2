"""History of one configuration across commits: counts, output error, and the first bad commit.

The stored nightlies become a bisection without re-running anything: per commit, the run's
headline metrics come from ``track.find_run_heads`` (on the embedded SQLite store one SQL query
over MLflow's tables; elsewhere one paged MLflow ``search_runs``), no artifact download.
``--tag`` on the embedded store is one indexed query of the tag-status index that
``track.log_run`` fills (``store.write_tag_index``) when every run is in it; otherwise it reads
each run's ``tables/modules.parquet``: in place, in one filtered ``pyarrow.dataset`` scan of the
``tag`` and ``status`` columns, when the artifacts are on a local path, else downloaded through
MLflow (in parallel threads).

"First bad commit" is the first commit of the *current* failing streak: walking commits from
newest to oldest while the tag (or the run) keeps failing, the oldest one reached.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.compute as pc

from parity_tracker.errors import InfrastructureError, InputError, ParityTrackerError
from parity_tracker.statuses import PASSING, is_passing

__all__ = ["PASSING"]  # re-exported for old readers; the owner is parity_tracker.statuses


def _is_failing(run: Any) -> bool:
    """A run fails when it did not finish or reported a failing tensor."""
    return run.status != "FINISHED" or run.metrics.get("tensors_failing", 0) > 0


def search_runs(
    settings: Mapping[str, Any],
    *,
    tracking_uri: str | None = None,
    experiment: str = "parity",
) -> list[Any]:
    """``track.find_runs`` (params, tags and metrics from one paged search), newest first.

    Raises:
        InfrastructureError: the store could not be reached (names the URI).
    """
    from parity_tracker.track.query import find_runs

    return _search(find_runs, settings, tracking_uri, experiment)


def search_heads(
    settings: Mapping[str, Any],
    *,
    tracking_uri: str | None = None,
    experiment: str = "parity",
) -> list[Any]:
    """``track.find_run_heads`` (only the fields history needs), newest first.

    Raises:
        InfrastructureError: the store could not be reached (names the URI).
    """
    from parity_tracker.track.query import find_run_heads

    return _search(find_run_heads, settings, tracking_uri, experiment)


def _search(find: Any, settings: Mapping[str, Any], tracking_uri: str | None, experiment: str):
    """Call a ``track`` finder; a store fault becomes an ``InfrastructureError`` naming the URI."""
    from parity_tracker.track.store import resolve_tracking_uri

    try:
        return find(tracking_uri=tracking_uri, experiment=experiment, **settings)
    except ParityTrackerError:
        raise
    except Exception as exc:
        uri = resolve_tracking_uri(tracking_uri)
        raise InfrastructureError(
            f"cannot search runs in {uri}: {type(exc).__name__}: {exc}"
        ) from exc


def latest_per_commit(runs: Sequence[Any]) -> list[Any]:
    """The newest run of each commit, ordered oldest commit first (by that run's start time)."""
    newest: dict[str, Any] = {}
    for run in runs:
        key = run.commit or f"(no commit) {run.run_id}"
        if key not in newest or run.start_time > newest[key].start_time:
            newest[key] = run
    return sorted(newest.values(), key=lambda r: r.start_time)


def first_bad(failing: Sequence[bool | None]) -> int | None:
    """Index of the first element of the trailing failing streak, or None when the last passes.

    ``None`` entries (unknown, e.g. the tag absent at that commit) are skipped: they neither
    extend nor break the streak.

    >>> first_bad([False, True, False, True, None, True])
    3
    """
    start = None
    for i in range(len(failing) - 1, -1, -1):
        if failing[i] is None:
            continue
        if not failing[i]:
            break
        start = i
    return start


def _tag_status(table: Any, tag: str) -> str | None:
    """The tag's status in one modules table: the first failing status over steps, else passing."""
    rows = table.filter(pc.equal(table.column("tag"), tag))
    if rows.num_rows == 0:
        return None
    statuses = rows.column("status").to_pylist()
    return next((s for s in statuses if not is_passing(s)), statuses[0])


def _download_modules(client: Any, run_id: str, dst: Path) -> Any:
    from parity_tracker.files.tables import read_table
    from parity_tracker.track.store import retry

    local = retry(client.download_artifacts, run_id, "tables/modules.parquet", str(dst / run_id))
    return read_table(local, "modules")


def _modules_tables(run_ids: Sequence[str], tracking_uri: str | None) -> list[Any]:
    """The ``modules`` table of each run (only that artifact), downloaded in 8 threads.

    Raises:
        InfrastructureError: the store could not be reached or a run has no modules table.
    """
    from parity_tracker.track.store import get_client

    try:
        client = get_client(tracking_uri)
        with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(lambda r: _download_modules(client, r, Path(tmp)), run_ids))
    except ParityTrackerError:
        raise
    except Exception as exc:
        raise InfrastructureError(
            f"cannot download tables/modules.parquet of runs {list(run_ids)[:5]}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def local_modules_path(artifact_uri: str | None) -> Path | None:
    """``<artifact root>/tables/modules.parquet`` when the root is a local path, else None.

    Local: a ``file:`` URI (the embedded store's ``file:///.../.parity/artifacts/...``) or a
    plain path; anything else (``mlflow-artifacts:``, ``s3:``, ``http(s):``) is remote.
    """
    if not artifact_uri:
        return None
    parsed = urlparse(artifact_uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        root = Path(unquote(parsed.path))
    elif parsed.scheme == "":
        root = Path(artifact_uri)
    else:
        return None
    return root / "tables" / "modules.parquet"


def _statuses_by_file(paths: Sequence[Path], tag: str) -> dict[str, list[str]]:
    """Each file's statuses of ``tag`` in row order, from one filtered scan of all files."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from parity_tracker.files.tables import MODULES_SCHEMA

    schema = pa.schema([MODULES_SCHEMA.field("tag"), MODULES_SCHEMA.field("status")])
    # pre_buffer off: each file is small (one row group), coalescing reads only adds work
    # (measured: 1.05 s vs 1.21 s of CPU over 1,000 files of 2,000 rows)
    options = ds.ParquetFragmentScanOptions(pre_buffer=False)
    fmt = ds.ParquetFileFormat(default_fragment_scan_options=options)
    dataset = ds.dataset([str(p) for p in paths], schema=schema, format=fmt)
    rows = dataset.to_table(
        columns=["status", "__filename"], filter=pc.field("tag") == tag, use_threads=False
    )
    out: dict[str, list[str]] = {}
    for name, status in zip(
        rows.column("__filename").to_pylist(), rows.column("status").to_pylist(), strict=True
    ):
        out.setdefault(name, []).append(status)
    return out


def _first_failing(statuses: Sequence[str]) -> str | None:
    """The first failing status over steps, else the first (passing) one; None when empty."""
    if not statuses:
        return None
    return next((s for s in statuses if not is_passing(s)), statuses[0])


def _local_tag_statuses(paths: Sequence[Path], tag: str) -> list[str | None]:
    """``tag``'s status in each local ``modules.parquet`` (None where the tag is absent).

    Raises:
        InfrastructureError: a run's modules table is missing or unreadable.
    """
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise InfrastructureError(
            f"cannot read tables/modules.parquet of {len(missing)} runs, e.g. {missing[:3]}: "
            "no such file (artifacts moved or deleted?)"
        )
    try:
        found = _statuses_by_file(paths, tag)
    except Exception as exc:
        raise InfrastructureError(
            f"cannot read tables/modules.parquet of runs {[str(p) for p in paths[:3]]}...: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return [_first_failing(found.get(str(p), [])) for p in paths]


def _indexed_statuses(
    heads: Sequence[Any], tag: str, tracking_uri: str | None
) -> list[str | None] | None:
    """``tag``'s status per run from the store's tag-status index, or None to scan instead.

    Used only when the store is embedded (``sqlite:///``) and every run is in the index
    (``store.read_tag_index``); runs logged before the index existed, and http stores, fall
    back to reading the modules tables.
    """
    from parity_tracker.track.store import read_tag_index, resolve_tracking_uri

    if not heads:
        return None
    found = read_tag_index(resolve_tracking_uri(tracking_uri), [h.run_id for h in heads], tag)
    if found is None:
        return None
    return [_first_failing(found.get(h.run_id, [])) for h in heads]


def _sample_tags(head: Any, path: Path | None, table: Any, tracking_uri: str | None) -> list[str]:
    """Up to 8 tags of one run's modules table (for the "tag in none of the runs" error)."""
    if table is None:
        if path is None:
            table = _modules_tables([head.run_id], tracking_uri)[0]
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(path, columns=["tag"])
    return table.column("tag").to_pylist()[:8]


def tag_statuses(
    heads: Sequence[Any], tag: str, tracking_uri: str | None
) -> tuple[list[str | None], list[str]]:
    """``tag``'s status in each run's modules table, and up to 8 tags of the newest run's table.

    On an embedded store whose tag-status index holds every run, one indexed query answers
    (``store.read_tag_index``, same result as reading the tables). Otherwise runs whose
    artifacts are on a local path are read in place (one scan); the others are downloaded
    (``_modules_tables``). The sample tags (for an error message) are read only when the tag
    is in none of the runs.

    Raises:
        InfrastructureError: the store could not be reached or a run has no modules table.
    """
    paths = [local_modules_path(getattr(h, "artifact_uri", None)) for h in heads]
    indexed = _indexed_statuses(heads, tag, tracking_uri)
    tables: list[Any] = []
    if indexed is not None:
        out = indexed
    else:
        local = [i for i, p in enumerate(paths) if p is not None]
        remote = [i for i, p in enumerate(paths) if p is None]
        out = [None] * len(heads)
        if local:
            found = _local_tag_statuses([paths[i] for i in local], tag)
            for i, status in zip(local, found, strict=True):
                out[i] = status
        tables = _modules_tables([heads[i].run_id for i in remote], tracking_uri) if remote else []
        for i, table in zip(remote, tables, strict=True):
            out[i] = _tag_status(table, tag)
    sample: list[str] = []
    if heads and all(s is None for s in out):
        newest = tables[-1] if tables and paths[-1] is None else None
        sample = _sample_tags(heads[-1], paths[-1], newest, tracking_uri)
    return out, sample


@dataclass
class CommitPoint:
    """One commit of a history: its newest run's headline numbers (and the tag's status)."""

    commit: str | None
    run_id: str
    start_time: int
    status: str
    tensors_compared: float | None
    tensors_failing: float | None
    output_max_abs_diff: float | None
    output_sqnr_db: float | None
    tag_status: str | None = None


@dataclass
class History:
    """A configuration's history across commits, oldest first.

    Attributes:
        target: the target name.
        settings: the settings filter used.
        fingerprint: the config fingerprint followed (the newest matching run's).
        points: one per commit, oldest first.
        tag: the tag followed, or None.
        first_bad_commit: first commit of the current failing streak (of the tag when given,
            else of the run: failing tensors or an unfinished run), None when the newest passes.
    """

    target: str
    settings: dict[str, str]
    fingerprint: str | None
    points: list[CommitPoint]
    tag: str | None = None
    first_bad_commit: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def _point(run: Any) -> CommitPoint:
    m = run.metrics
    return CommitPoint(
        commit=run.commit,
        run_id=run.run_id,
        start_time=run.start_time,
        status=run.status,
        tensors_compared=m.get("tensors_compared"),
        tensors_failing=m.get("tensors_failing"),
        output_max_abs_diff=m.get("output_max_abs_diff"),
        output_sqnr_db=m.get("output_sqnr_db"),
    )


def build_history(
    target: str,
    settings: Mapping[str, Any] | None = None,
    *,
    tracking_uri: str | None = None,
    experiment: str = "parity",
    tag: str | None = None,
    last: int | None = None,
) -> History:
    """The history of ``target`` with ``settings`` across commits.

    Runs are matched on the ``target`` param and every given setting; when they carry several
    config fingerprints (e.g. another device), the newest run's fingerprint is followed.

    Args:
        target: the target name (the ``target`` param).
        settings: settings the runs must have (``{"quantization": "int8"}``).
        tracking_uri: the store (default: ``store.resolve_tracking_uri``).
        experiment: the MLflow experiment.
        tag: also report this tag's status per commit (reads each run's modules table: in
            place when the artifacts are local, else downloaded).
        last: keep only the newest ``last`` commits.

    Raises:
        InputError: no run matches (names the target and settings), or ``tag`` is in none of
            the runs (shows some tags).
        InfrastructureError: the store could not be reached.
    """
    wanted = {"target": target, **{str(k): str(v) for k, v in (settings or {}).items()}}
    runs = search_heads(wanted, tracking_uri=tracking_uri, experiment=experiment)
    if not runs:
        raise InputError(f"no stored run of {target} matches {wanted} in experiment {experiment!r}")
    fingerprint = runs[0].fingerprint
    runs = [r for r in runs if r.fingerprint == fingerprint]
    chosen = latest_per_commit(runs)
    if last is not None:
        chosen = chosen[-last:] if last > 0 else []
    points = [_point(r) for r in chosen]
    if tag is None:
        failing = [_is_failing(r) for r in chosen]
    else:
        statuses, sample = tag_statuses(chosen, tag, tracking_uri)
        for point, status in zip(points, statuses, strict=True):
            point.tag_status = status
        if points and all(p.tag_status is None for p in points):
            raise InputError(
                f"tag {tag!r} is in none of the {len(points)} runs; "
                f"tags look like: {', '.join(sample)}"
            )
        failing = [None if p.tag_status is None else not is_passing(p.tag_status) for p in points]
    index = first_bad(failing)
    return History(
        target=target,
        settings=wanted,
        fingerprint=fingerprint,
        points=points,
        tag=tag,
        first_bad_commit=None if index is None else points[index].commit,
    )
