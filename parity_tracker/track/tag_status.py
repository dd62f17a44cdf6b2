"""A tag's status in stored runs, read the fastest way the store allows (``RunStore`` uses it).

Two paths answer the same question, on every store alike, and are tested for equality:

- **the runs' own codes** (``track.tag_codes``): every run logged since issue 18 carries its
  per-tag statuses in its MLflow tags, which the search ``history`` makes anyway already
  returns (``RunHead.tag_codes``). Only the ordered tag list is read, once per distinct list
  fingerprint, from one run's modules table: in place on a local store, else fetched into the
  run cache and then kept under ``<cache root>/tag_lists/<fingerprint>.json`` (checked against
  the fingerprint on every read). So ``history --tag`` over 1,000 never-fetched server runs
  downloads one table.
- **the modules tables**, for runs without codes (logged before them, or not encodable): runs
  whose artifacts are on a local path are read in place, the others are fetched once into the
  local run cache (``track.cache``: direct GETs, 16 at a time, kept for good since a stored run
  never changes), then all are read in one filtered ``pyarrow.dataset`` scan projected on
  ``tag`` and ``status``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.compute as pc

from parity_tracker.errors import InfrastructureError, ParityTrackerError
from parity_tracker.statuses import is_failing, is_neutral
from parity_tracker.track.tag_codes import TagCodes, decode, ordered_tags, tag_list_hash

#: Where a run's modules table is among its artifacts (``track.log``).
MODULES_PATH = "tables/modules.parquet"


def tag_status_over_steps(statuses: Sequence[str | None]) -> str | None:
    """A tag's status over its steps (rows in table order).

    The first failing status (``statuses.is_failing``) if any step fails; else the first
    neutral one (``skipped``) if any; else the first (passing); None when the tag has no row.
    So a skipped step never hides a later failure. The one rule for every read path below.
    """
    if not statuses:
        return None
    failing = next((s for s in statuses if is_failing(s)), None)
    if failing is not None:
        return failing
    return next((s for s in statuses if is_neutral(s)), statuses[0])


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


def _tag_list_path(sha: str) -> Path:
    from parity_tracker.track.cache import cache_root

    return cache_root() / "tag_lists" / f"{sha}.json"


def _kept_tag_list(sha: str, n_tags: int) -> list[str] | None:
    """The tag list kept for fingerprint ``sha``, None when absent or not matching it."""
    import json

    try:
        tags = json.loads(_tag_list_path(sha).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(tags, list) and len(tags) == n_tags and tag_list_hash(tags) == sha
    return tags if ok else None


def _keep_tag_list(sha: str, tags: list[str]) -> None:
    """Keep a verified tag list by fingerprint; a fault only costs a read next time."""
    import contextlib
    import json

    from parity_tracker.files.atomic import atomic_write_text

    with contextlib.suppress(OSError):
        path = _tag_list_path(sha)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(tags))


def _tag_lists(
    heads: Sequence[Any], decoded: Sequence[TagCodes | None], tracking_uri: str
) -> dict[str, list[str]]:
    """``{fingerprint: ordered tags}`` of each fingerprint among ``decoded``, once verified.

    A fingerprint whose table does not match it is left out (its runs are then scanned).
    Each missing list is read from one run carrying it: its local modules table, else one
    fetched into the run cache (all fetched together).

    Raises:
        InfrastructureError: the store could not be reached or a table is missing.
    """
    import pyarrow.parquet as pq

    from parity_tracker.track.cache import fetch_files

    lists: dict[str, list[str]] = {}
    wanted: dict[str, tuple[int, Any]] = {}  # fingerprint -> (tag count, one head)
    for head, codes in zip(heads, decoded, strict=True):
        if codes is not None and codes.sha256 not in lists and codes.sha256 not in wanted:
            kept = _kept_tag_list(codes.sha256, len(codes.codes))
            if kept is not None:
                lists[codes.sha256] = kept
            else:
                wanted[codes.sha256] = (len(codes.codes), head)
    if not wanted:
        return lists
    paths = {sha: local_modules_path(getattr(h, "artifact_uri", None))
             for sha, (_, h) in wanted.items()}  # fmt: skip
    remote = [sha for sha, p in paths.items() if p is None]
    if remote:
        runs = [(wanted[sha][1].run_id, getattr(wanted[sha][1], "artifact_uri", None))
                for sha in remote]  # fmt: skip
        paths.update(zip(remote, fetch_files(runs, MODULES_PATH, tracking_uri), strict=True))
    for sha, (n_tags, head) in wanted.items():
        try:
            tags = ordered_tags(pq.read_table(paths[sha], columns=["tag"]))
        except Exception as exc:
            raise InfrastructureError(
                f"cannot read the tags of {MODULES_PATH} of run {head.run_id}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if len(tags) == n_tags and tag_list_hash(tags) == sha:
            lists[sha] = tags
            if sha in remote:  # a local table is read again instead: nothing written
                _keep_tag_list(sha, tags)
    return lists


def _scanned_statuses(heads: Sequence[Any], tag: str, tracking_uri: str) -> list[str | None]:
    """``tag``'s status in each run, from its modules table (in place, or fetched first)."""
    paths = [local_modules_path(getattr(h, "artifact_uri", None)) for h in heads]
    remote = [i for i, p in enumerate(paths) if p is None]
    if remote:
        from parity_tracker.track.cache import fetch_files

        runs = [(heads[i].run_id, getattr(heads[i], "artifact_uri", None)) for i in remote]
        for i, path in zip(remote, fetch_files(runs, MODULES_PATH, tracking_uri), strict=True):
            paths[i] = path
    return _local_tag_statuses(paths, tag)


def _sample_tags(
    head: Any, codes: TagCodes | None, lists: dict[str, list[str]], tracking_uri: str
) -> list[str]:
    """Up to 8 tags of one run (for the "tag in none of the runs" error)."""
    if codes is not None and codes.sha256 in lists:
        return lists[codes.sha256][:8]
    path = local_modules_path(getattr(head, "artifact_uri", None))
    if path is None:
        return modules_tables([head.run_id], tracking_uri)[0].column("tag").to_pylist()[:8]
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=["tag"]).column("tag").to_pylist()[:8]


def tag_statuses(
    heads: Sequence[Any], tag: str, tracking_uri: str | None
) -> tuple[list[str | None], list[str]]:
    """``tag``'s status in each run (None where the run has no such tag), and sample tags.

    Runs whose ``tag_codes`` (``RunHead.tag_codes``) decode, and whose tag list is known or
    readable, answer from their codes; the others from their modules tables (module
    docstring). The status is ``tag_status_over_steps`` of the tag's rows either way. The
    sample (up to 8 tags of the newest run, ``heads[-1]``, for an error message) is read only
    when the tag is in none of the runs.

    Raises:
        InfrastructureError: the store could not be reached or a run has no modules table.
    """
    from parity_tracker.track.store import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    decoded = [decode(getattr(h, "tag_codes", None) or {}) for h in heads]
    lists = _tag_lists(heads, decoded, uri)
    positions = {sha: (tags.index(tag) if tag in tags else None) for sha, tags in lists.items()}
    out: list[str | None] = [None] * len(heads)
    scan = []
    for i, codes in enumerate(decoded):
        # the codes count must be the tag list's length, else the table answers (never a crash)
        ok = codes is not None and codes.sha256 in lists
        if ok and len(lists[codes.sha256]) == len(codes.codes):
            out[i] = codes.status(positions[codes.sha256])
        else:
            scan.append(i)
    if scan:
        found = _scanned_statuses([heads[i] for i in scan], tag, uri)
        for i, status in zip(scan, found, strict=True):
            out[i] = status
    sample: list[str] = []
    if heads and all(s is None for s in out):
        sample = _sample_tags(heads[-1], decoded[-1], lists, uri)
    return out, sample


def _table_statuses(table: Any) -> dict[str, str]:
    """``{tag: status over its steps}`` of one modules table (``tag_status_over_steps``)."""
    rows: dict[str, list[str]] = {}
    for tag, status in zip(
        table.column("tag").to_pylist(), table.column("status").to_pylist(), strict=True
    ):
        rows.setdefault(tag, []).append(status)
    return {tag: s for tag, st in rows.items() if (s := tag_status_over_steps(st)) is not None}


def run_tag_statuses(heads: Sequence[Any], tracking_uri: str | None) -> list[dict[str, str]]:
    """Every tag's status in each run: ``{tag: status}`` per head, in ``heads`` order.

    The same two paths as :func:`tag_statuses`: a run's decoded codes with its known tag
    list, else its modules table (in place when local, else fetched into the run cache).

    Raises:
        InfrastructureError: the store could not be reached or a run has no modules table.
    """
    import pyarrow.parquet as pq

    from parity_tracker.track.store import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    decoded = [decode(getattr(h, "tag_codes", None) or {}) for h in heads]
    lists = _tag_lists(heads, decoded, uri)
    out: list[dict[str, str]] = [{} for _ in heads]
    local: list[tuple[int, Path]] = []
    remote: list[int] = []
    for i, codes in enumerate(decoded):
        tags = lists.get(codes.sha256) if codes is not None else None
        if codes is not None and tags is not None and len(tags) == len(codes.codes):
            out[i] = {t: codes.status(k) for k, t in enumerate(tags)}
            continue
        path = local_modules_path(getattr(heads[i], "artifact_uri", None))
        if path is None:
            remote.append(i)
        else:
            local.append((i, path))
    for i, path in local:
        try:
            out[i] = _table_statuses(pq.read_table(path, columns=["tag", "status"]))
        except Exception as exc:
            raise InfrastructureError(
                f"cannot read {path} of run {heads[i].run_id}: {type(exc).__name__}: {exc}"
            ) from exc
    if remote:
        ids = [heads[i].run_id for i in remote]
        tables = modules_tables(ids, uri, [getattr(heads[i], "artifact_uri", None) for i in remote])
        for i, table in zip(remote, tables, strict=True):
            out[i] = _table_statuses(table)
    return out
