"""Expected divergences: known, dated failures that show as ``expected`` instead of regressions.

The file (default ``pipelines/expected.toml``) is a list of ``[[expected]]`` tables::

    [[expected]]
    target = "llama-tiny"                  # the target name (exact)
    settings = { quantization = "bf16" }   # filter: every listed setting must match (optional)
    tag = "checker_model.layers.*"         # fnmatch glob over the tag
    reason = "bf16 rounding in RMSNorm, tracked in #123"
    until = 2026-12-31                      # a TOML date; after it the entry has expired

A failing tag (head status not ``equal``/``close``) that matches a live entry gets the change
``expected``. An expired entry does not apply, and fails the nightly, naming itself.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictStr

from parity_tracker.errors import InputError
from parity_tracker.files.toml import load_toml, validate_model
from parity_tracker.statuses import failing_mask


@dataclass(frozen=True)
class ExpectedEntry:
    """One known divergence.

    Attributes:
        target: the target name.
        tag: an fnmatch glob over tags.
        reason: why the divergence is accepted (shown in the digest).
        until: the last day the entry applies.
        settings: setting values a run must have for the entry to apply.
        source: ``file#index`` (1-based), used to name the entry in messages.
    """

    target: str
    tag: str
    reason: str
    until: dt.date
    settings: Mapping[str, str] = field(default_factory=dict)
    source: str = ""

    def expired(self, today: dt.date) -> bool:
        """True once ``today`` is after ``until``."""
        return today > self.until

    def applies_to(self, target: str, settings: Mapping[str, Any]) -> bool:
        """True when the run's target and every filtered setting match."""
        if target != self.target:
            return False
        return all(str(settings.get(k)) == str(v) for k, v in self.settings.items())

    def describe(self) -> str:
        """``file#2 (llama-tiny, tag glob, until 2026-12-31): reason``."""
        sets = ",".join(f"{k}={v}" for k, v in self.settings.items())
        where = f"{self.target}{'[' + sets + ']' if sets else ''}, tag {self.tag}"
        return f"{self.source} ({where}, until {self.until}): {self.reason}"


def _until(value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise ValueError("not a date; write until = 2026-12-31 (YYYY-MM-DD)")


def _setting(value: Any) -> str:
    if not isinstance(value, (str, int, float)):
        raise ValueError("a setting filter value must be a string, number or boolean")
    return str(value)


class _Entry(BaseModel):
    """One ``[[expected]]`` table (the declared schema; unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")

    target: StrictStr
    tag: StrictStr
    reason: StrictStr
    until: Annotated[dt.date, BeforeValidator(_until)]
    settings: dict[str, Annotated[str, BeforeValidator(_setting)]] = {}


class _ExpectedFile(BaseModel):
    """The expected-divergence file: ``[[expected]]`` tables, nothing else."""

    model_config = ConfigDict(extra="forbid")

    expected: list[_Entry] = []


def load_expected(path: str | Path | None) -> list[ExpectedEntry]:
    """Read an expected-divergence file; a missing ``path`` (None or no file) gives ``[]``.

    The file is validated against a declared pydantic schema (``_ExpectedFile``): a wrong type
    or an unknown key is refused, naming the key, the value and what is allowed.

    Raises:
        InputError: malformed TOML (names the file and line) or a malformed entry (names the
            file, ``expected[N].key`` with N 1-based, the value and the rule).
    """
    if path is None or not Path(path).exists():
        return []
    data = validate_model(_ExpectedFile, load_toml(path), str(path))
    return [
        ExpectedEntry(
            target=e.target,
            tag=e.tag,
            reason=e.reason,
            until=e.until,
            settings=dict(e.settings),
            source=f"{path}#{i}",
        )
        for i, e in enumerate(data.expected, start=1)
    ]


def expected_file_record(path: str | Path | None) -> tuple[str, str] | None:
    """What a shard records of the expected file it used: ``(absolute path, content hash)``.

    The hash is the 16-digit hex ``xxhash.xxh3_64`` of the file's bytes. ``None`` when no file
    was used (``path`` is None or names no file: :func:`load_expected` reads that as ``[]``).
    """
    if path is None or not Path(path).is_file():
        return None
    resolved = Path(path).resolve()
    return str(resolved), xxhash.xxh3_64_hexdigest(resolved.read_bytes())


def check_recorded_expected(path: str, digest: str, *, who: str) -> Path:
    """The recorded expected file, checked against the hash the shards recorded.

    Args:
        path: the absolute path a shard recorded (:func:`expected_file_record`).
        digest: the content hash recorded with it.
        who: what recorded it, for the message (e.g. ``"night n1's shards"``).

    Returns:
        ``path`` as a ``Path``.

    Raises:
        InputError: the file is gone or its content changed since the shards read it; the
            message names the path and the fix (``--expected PATH``).
    """
    found = Path(path)
    if not found.is_file():
        raise InputError(
            f"{who} used the expected-divergence file {path}, which does not exist here: pass "
            "--expected PATH (the same file) so expected cells are not counted as failures"
        )
    now = xxhash.xxh3_64_hexdigest(found.read_bytes())
    if now != digest:
        raise InputError(
            f"{who} used the expected-divergence file {path} with content hash {digest}; it "
            f"now hashes {now} (edited since): pass --expected PATH to choose the file to apply"
        )
    return found


def expired_entries(entries: list[ExpectedEntry], today: dt.date) -> list[ExpectedEntry]:
    """The entries whose ``until`` date has passed."""
    return [e for e in entries if e.expired(today)]


def apply_expected(
    diff: pa.Table,
    entries: list[ExpectedEntry],
    *,
    target: str,
    settings: Mapping[str, Any],
    today: dt.date,
) -> tuple[pa.Table, list[ExpectedEntry]]:
    """Relabel failing head rows matched by a live entry as ``expected``.

    Args:
        diff: a table from ``diff.diff_tables`` (columns ``tag``, ``head_status``, ``change``).
        entries: from :func:`load_expected`.
        target: the run's target name.
        settings: the run's settings.
        today: the date expiry is judged against.

    Returns:
        The relabelled table and the live entries that matched at least one row.
    """
    live = [e for e in entries if not e.expired(today) and e.applies_to(target, settings)]
    if not live or diff.num_rows == 0:
        return diff, []
    tags = diff.column("tag").to_pylist()
    status = diff.column("head_status")
    # skipped (never called, or skipped by a cache) is not a failure, so never "expected"
    failing = np.asarray(pc.and_(pc.is_valid(status), failing_mask(status)))  # removed: null
    change = np.asarray(diff.column("change").to_pylist(), dtype=object)
    used = []
    for entry in live:
        hit = failing & np.array([fnmatch.fnmatchcase(t, entry.tag) for t in tags], dtype=bool)
        if hit.any():
            change[hit] = "expected"
            used.append(entry)
    index = diff.column_names.index("change")
    return diff.set_column(index, "change", pa.array(change, type=pa.string())), used
