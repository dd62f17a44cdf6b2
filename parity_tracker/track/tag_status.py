"""A tag's status in stored runs, read the fastest way the store allows (``RunStore`` uses it).

Three paths answer the same question and are tested for equality: the tag-status index of an
embedded store (``store.read_tag_index``, one indexed query) when every run is in it; else the
runs whose artifacts are on a local path are read in place (one filtered ``pyarrow.dataset``
scan of ``tables/modules.parquet``); the others (a tracking server's artifacts) are fetched once
into the local run cache (``track.cache``: one direct GET each, kept for good since a stored run
never changes) and then scanned in place the same way. So the SQLite index is only the fastest
of the backends; every store ends in the same scan of immutable per-run tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.compute as pc

from parity_tracker.errors import InfrastructureError, ParityTrackerError
from parity_tracker.statuses import is_passing

#: Where a run's modules table is among its artifacts (``track.log``).
MODULES_PATH = "tables/modules.parquet"


def tag_status_over_steps(statuses: Sequence[str | None]) -> str | None:
    """A tag's status over its steps (rows in table order).

    The first non-passing status, else the first; None when the tag has no row. The one rule
    for every read path below.
    """
    if not statuses:
        return None
    return next((s for s in statuses if not is_passing(s)), statuses[0])


def _tag_status(table: Any, tag: str) -> str | None:
    """The tag's status in one modules table: the first failing status over steps, else passing."""
    rows = table.filter(pc.equal(table.column("tag"), tag))
    return tag_status_over_steps(rows.column("status").to_pylist())


def modules_tables(
    run_ids: Sequence[str], tracking_uri: str | None, artifact_uris: Sequence[str | None] = ()
) -> list[Any]:
    """The ``modules`` table of each run (only that artifact), through the run cache.

    Each table is fetched once with a direct GET and kept (``track.cache``: runs are
    immutable once stored); ``artifact_uris`` (parallel to ``run_ids``) saves a ``get_run``
    per run when known.

    Raises:
        InfrastructureError: the store could not be reached or a run has no modules table.
    """
    from parity_tracker.files.tables import read_table
    from parity_tracker.track.cache import fetch_files
    from parity_tracker.track.store import resolve_tracking_uri

    uris = list(artifact_uris) or [None] * len(run_ids)
    paths = fetch_files(
        list(zip(run_ids, uris, strict=True)), MODULES_PATH, resolve_tracking_uri(tracking_uri)
    )
    try:
        return [read_table(p, "modules") for p in paths]
    except ParityTrackerError:
        raise
    except Exception as exc:
        raise InfrastructureError(
            f"cannot read {MODULES_PATH} of runs {list(run_ids)[:5]}: {type(exc).__name__}: {exc}"
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
    return [tag_status_over_steps(found.get(str(p), [])) for p in paths]


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
    return [tag_status_over_steps(found.get(h.run_id, [])) for h in heads]


def _index_fetched(run_ids: Sequence[str], paths: Sequence[Path], tracking_uri: str | None) -> None:
    """Add fetched runs of a server to the local tag-status index; a fault only costs speed.

    The next ``--tag`` question over the same runs is then one indexed query
    (``store.tag_index_path``: a server store's index is a local cache of immutable rows).
    """
    import contextlib

    import pyarrow.parquet as pq

    from parity_tracker.track.store import resolve_tracking_uri, sqlite_path, write_tag_index_many

    uri = resolve_tracking_uri(tracking_uri)
    if sqlite_path(uri) is not None:
        return  # an embedded store's index is written by log_run only
    with contextlib.suppress(Exception):  # OSError, sqlite3.Error, pyarrow errors
        cols = ["tag", "step", "status"]
        runs = [(r, pq.read_table(p, columns=cols)) for r, p in zip(run_ids, paths, strict=True)]
        write_tag_index_many(uri, runs)


def _sample_tags(head: Any, path: Path | None, table: Any, tracking_uri: str | None) -> list[str]:
    """Up to 8 tags of one run's modules table (for the "tag in none of the runs" error)."""
    if table is None:
        if path is None:
            table = modules_tables([head.run_id], tracking_uri)[0]
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
    artifacts are on a local path are read in place, the others are first fetched into the run
    cache (``track.cache.fetch_files``), and all are read in one scan. The sample tags (for an
    error message) are read only when the tag is in none of the runs.

    Raises:
        InfrastructureError: the store could not be reached or a run has no modules table.
    """
    paths = [local_modules_path(getattr(h, "artifact_uri", None)) for h in heads]
    indexed = _indexed_statuses(heads, tag, tracking_uri)
    if indexed is not None:
        out = indexed
    else:
        remote = [i for i, p in enumerate(paths) if p is None]
        if remote:
            from parity_tracker.track.cache import fetch_files
            from parity_tracker.track.store import resolve_tracking_uri

            runs = [(heads[i].run_id, getattr(heads[i], "artifact_uri", None)) for i in remote]
            fetched = fetch_files(runs, MODULES_PATH, resolve_tracking_uri(tracking_uri))
            for i, path in zip(remote, fetched, strict=True):
                paths[i] = path
        out = _local_tag_statuses(paths, tag) if heads else []
        if remote:
            _index_fetched([heads[i].run_id for i in remote], [paths[i] for i in remote],
                           tracking_uri)  # fmt: skip
    sample: list[str] = []
    if heads and all(s is None for s in out):
        sample = _sample_tags(heads[-1], paths[-1], None, tracking_uri)
    return out, sample
