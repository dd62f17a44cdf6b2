"""Each stored run's per-tag statuses, packed into its own MLflow tags (issue 18).

``history --tag`` needs one status per run for one tag. Reading it from every run's
``tables/modules.parquet`` costs one artifact download per run on a server (23 s for 1,000
runs). So ``log_run`` also stores the run's per-tag statuses where the search that ``history``
already makes returns them: in the run's MLflow tags.

- the run's tags, in first-appearance order of its modules table, define positions; their
  fingerprint is ``sha256(json.dumps(tags))`` (first 32 hex digits, :func:`tag_list_hash`);
- position *i* holds one character: the code (``statuses.STATUS_CODES``) of tag *i*'s status
  over its steps (``tag_status.tag_status_over_steps``, the one rule);
- the code string is compressed (``zlib``, level 9) and base64-encoded, then cut into chunks of
  :data:`CHUNK_CHARS` characters, under MLflow's 8,000-character tag value limit
  (``mlflow.utils.validation.MAX_TAG_VAL_LENGTH``, which MLflow 3.17 *truncates* to, silently):
  MLflow tags ``parity.tag_codes.0``, ``parity.tag_codes.1``, …;
- the header tag ``parity.tag_codes`` is strict JSON ``{"v": 2, "sha256": ..., "tags": N,
  "chunks": K, "run": <parity run id or null>, "bind": ...}``; ``bind`` is the first 32 hex
  digits of ``sha256(json.dumps([sha256, run, codes]))`` (:func:`binding`), so codes, tag
  list fingerprint and run travel together: a chunk swapped with another run's, a header
  edited or copied from another run, decodes to None. ``run`` is checked against the run's
  ``parity.run_id`` tag (``track.store.TAG_RUN_ID``), which :func:`code_tags` keeps with the
  codes. Version 1 (no binding, and the status over steps was "first non-passing", which let
  a ``skipped`` step hide a later failure) is not read: those runs are read from their table.

The tag list itself is not stored again: a reader takes it from ONE run's modules table per
distinct fingerprint (in place on a local store, else fetched once into the run cache) and
keeps it by fingerprint (``track.tag_status``). A run whose header is missing, incomplete or
inconsistent decodes to None and is read from its modules table as before: never a guessed
value. A reader also uses decoded codes only when their count equals the length of the tag list
their fingerprint names (``track.tag_status``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parity_tracker.statuses import CODE_STATUSES, STATUS_CODES
from parity_tracker.track.store import TAG_RUN_ID

#: The header tag; chunk *k* is ``f"{TAG_CODES}.{k}"``.
TAG_CODES = "parity.tag_codes"
#: Characters per chunk tag (MLflow 3.17 keeps 8,000 per tag value and truncates beyond).
CHUNK_CHARS = 6000
#: At most this many chunk tags (300,000 compressed characters: millions of tags); a run whose
#: codes need more is not encoded (its readers fall back to the modules table).
MAX_CHUNKS = 50
#: Version of the format (the header's ``v``).
VERSION = 2


@dataclass(frozen=True)
class TagCodes:
    """A run's decoded per-tag status codes.

    Attributes:
        sha256: fingerprint of the run's ordered tag list (:func:`tag_list_hash`).
        codes: one ``statuses.STATUS_CODES`` character per tag, in tag-list order.
    """

    sha256: str
    codes: str

    def status(self, position: int | None) -> str | None:
        """The status at ``position`` of the tag list; None for None (tag not in the run)."""
        return None if position is None else CODE_STATUSES[self.codes[position]]


def binding(sha256: str, run: str | None, codes: str) -> str:
    """First 32 hex digits of ``sha256(json.dumps([sha256, run, codes]))``: header ``bind``."""
    return hashlib.sha256(json.dumps([sha256, run, codes]).encode()).hexdigest()[:32]


def tag_list_hash(tags: Sequence[str]) -> str:
    """First 32 hex digits of ``sha256(json.dumps(list(tags)))`` (UTF-8)."""
    return hashlib.sha256(json.dumps(list(tags)).encode()).hexdigest()[:32]


def ordered_tags(modules: Any) -> list[str]:
    """The distinct values of a modules table's ``tag`` column, in first-appearance order."""
    return list(dict.fromkeys(modules.column("tag").to_pylist()))


def tag_codes(modules: Any) -> tuple[list[str], str] | None:
    """``(ordered tags, code string)`` of a modules table; None when a status has no code.

    Each tag's status is ``tag_status.tag_status_over_steps`` over its rows in table order.
    A null or unknown status (or a null tag) is never given a code: the run is then not
    encoded, and readers use its table.
    """
    from parity_tracker.track.tag_status import tag_status_over_steps

    rows: dict[str, list[str]] = {}
    for tag, status in zip(
        modules.column("tag").to_pylist(), modules.column("status").to_pylist(), strict=True
    ):
        if tag is None:
            return None
        rows.setdefault(tag, []).append(status)
    codes = []
    for statuses in rows.values():
        code = STATUS_CODES.get(tag_status_over_steps(statuses))
        if code is None:
            return None
        codes.append(code)
    return list(rows), "".join(codes)


def pack(tags: Sequence[str], codes: str, run: str | None = None) -> dict[str, str]:
    """The MLflow tags holding ``codes`` for the ordered ``tags`` of run ``run`` (docstring).

    ``run`` is the run's ``parity.run_id`` tag (None: not bound to a run). ``{}`` when they
    would need more than :data:`MAX_CHUNKS` chunks.
    """
    blob = base64.b64encode(zlib.compress(codes.encode("ascii"), 9)).decode("ascii")
    chunks = [blob[k : k + CHUNK_CHARS] for k in range(0, len(blob), CHUNK_CHARS)] or [""]
    if len(chunks) > MAX_CHUNKS:
        return {}
    sha = tag_list_hash(tags)
    header = {"v": VERSION, "sha256": sha, "tags": len(codes), "chunks": len(chunks),
              "run": run, "bind": binding(sha, run, codes)}  # fmt: skip
    out = {TAG_CODES: json.dumps(header, separators=(",", ":"))}
    out.update({f"{TAG_CODES}.{k}": chunk for k, chunk in enumerate(chunks)})
    return out


def encode(modules: Any, run: str | None = None) -> dict[str, str]:
    """The MLflow tags of a run's per-tag statuses: ``pack(*tag_codes(modules), run)``.

    ``run``: the run's ``parity.run_id`` tag. ``{}`` when the table cannot be encoded (see
    ``tag_codes``).
    """
    found = tag_codes(modules)
    return {} if found is None else pack(*found, run)


def decode(tags: Mapping[str, str]) -> TagCodes | None:
    """The ``TagCodes`` stored in a run's MLflow ``tags``; None when absent or not whole.

    None (never a partial answer, never an exception) when the header is missing or not this
    format, a chunk is missing, the blob does not decompress, its length is not the header's
    tag count, a character is not a status code, the binding does not match (a chunk or header
    of another run), or the header names another run than the ``parity.run_id`` tag.
    """
    try:
        header = json.loads(tags[TAG_CODES])
        if header.get("v") != VERSION:
            return None
        n, k, sha = int(header["tags"]), int(header["chunks"]), str(header["sha256"])
        run, bind = header["run"], str(header["bind"])
        if not 1 <= k <= MAX_CHUNKS or (run is not None and run != tags.get(TAG_RUN_ID)):
            return None
        blob = "".join(tags[f"{TAG_CODES}.{i}"] for i in range(k))
        codes = zlib.decompress(base64.b64decode(blob, validate=True)).decode("ascii")
    except (KeyError, ValueError, TypeError, AttributeError, OverflowError, zlib.error):
        return None
    if len(codes) != n or not set(codes) <= CODE_STATUSES.keys():
        return None
    if binding(sha, run, codes) != bind:
        return None
    return TagCodes(sha, codes)


def code_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The subset of a run's MLflow ``tags`` that holds its codes, else ``{}``.

    The header, the chunks, and the ``parity.run_id`` tag they are bound to.
    """
    out = {k: v for k, v in tags.items() if k == TAG_CODES or k.startswith(TAG_CODES + ".")}
    if out and TAG_RUN_ID in tags:
        out[TAG_RUN_ID] = tags[TAG_RUN_ID]
    return out
