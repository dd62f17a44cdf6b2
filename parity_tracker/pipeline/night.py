"""A night is one thing: every shard of one nightly shares a night id; ``merge_night`` joins them.

Night id (``--night``): given, or :func:`default_night_id`, ``<UTC date>-<commit[:12]>-<matrix
hash[:8]>`` (e.g. ``20261130-1a2b3c4d5e6f-9f86d081``): shards started on the same day, on the
same commit, from the same matrix file, meet without being told. Without a commit the default
is unique per call (a random suffix): two commit-less nights never share an id. Each shard
tags its parent run ``parity.night`` and attaches ``cells.json`` (the cells it will run)
before running any.

``merge_night`` gathers every cell of a night from the store (``track.RunStore`` only), picks
each cell's baseline from any earlier night whatever the sharding (the newest earlier run of its
configuration not in this night, :func:`~parity_tracker.pipeline.baseline.choose_baseline`),
diffs it, and logs the combined ``digest.md``, ``matrix.html``, ``history.html`` and
``regressions.parquet`` on one night parent run. Cells a shard planned but the store does not
hold (spooled, or the shard died) are listed as errors, so the night cannot pass without them.
A shard that never reported at all (no parent run for index ``I`` of ``1..N``) has no
``cells.json`` to name its cells: the merge names the shard (``NightlyResult.missing_shards``)
and the night is incomplete, never PASS. A shard reported twice counts once (``pick_shards``).
Shards are grouped by ``(I, N)``: shards disagreeing on ``N``, shards of different matrices
(tag ``parity.matrix_hash``, ``matrix.matrix_hash``), a shard parent not FINISHED and shard
parents on different commits (a reused night id) are ``NightlyResult.shard_problems``: the
night is incomplete, named in the digest and JSON. Cells
are matched by ``Cell.name``, one name per cell (``Cell.identity``: target and settings).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity_tracker.analysis.diff import diff_runs
from parity_tracker.analysis.expected import (
    check_recorded_expected,
    expired_entries,
    load_expected,
)
from parity_tracker.errors import InputError
from parity_tracker.pipeline.baseline import choose_baseline
from parity_tracker.pipeline.matrix import Cell
from parity_tracker.pipeline.results import FAIL_ON, CellResult, NightlyResult
from parity_tracker.run.mode import baseline_params
from parity_tracker.track.parents import (
    KIND_NIGHT,
    SHARD_RUNS_CUT,
    TAG_EXPECTED_HASH,
    TAG_EXPECTED_PATH,
    TAG_KIND,
    TAG_MATRIX,
    TAG_NIGHT,
    TAG_SHARD_RUNS,
)

#: The artifact of a shard's parent run listing the cells it planned (``[{target, settings}]``).
CELLS_FILE = "cells.json"
#: The error of a planned cell the store does not hold.
MISSING = "not in the store (spooled, or its shard died): `parity-tracker sync`, then merge again"
_NIGHT_OK = re.compile(r"[A-Za-z0-9._:-]{1,200}")


def default_night_id(commit: str | None, config: str | Path, today: dt.date) -> str:
    """``<YYYYMMDD>-<commit[:12]>-<sha256(matrix file)[:8]>``.

    The UTC date, the commit and the matrix file's bytes: every shard of one nightly computes
    the same id on its own machine. Shards that may straddle midnight UTC should be given an
    explicit ``--night`` (e.g. the CI pipeline's id).

    Without a commit (``--allow-no-commit``) nothing ties two nights of one day apart, so the
    id is unique per call: ``<YYYYMMDD>-nocommit-<matrix hash>-<uuid4 hex[:12]>``. Shards of
    such a night must then be given one ``--night``; without it each shard is its own night,
    and a merge names the other shards as missing.
    """
    digest = hashlib.sha256(Path(config).read_bytes()).hexdigest()[:8]
    if not commit:
        return f"{today:%Y%m%d}-nocommit-{digest}-{uuid.uuid4().hex[:12]}"
    return f"{today:%Y%m%d}-{commit[:12]}-{digest}"


def check_night_id(night: str) -> str:
    """``night`` if it is 1-200 characters of letters, digits and ``._:-``.

    Raises:
        InputError: anything else (names the allowed characters).
    """
    if not _NIGHT_OK.fullmatch(night):
        raise InputError(f"--night {night!r}: use 1-200 letters, digits or . _ : -")
    return night


def cells_json(cells: Sequence[Cell]) -> str:
    """The ``cells.json`` of a shard: ``[{"target", "settings"}]`` in run order."""
    return json.dumps([{"target": c.target, "settings": dict(c.settings)} for c in cells])


@dataclass
class ShardPick:
    """What :func:`pick_shards` made of a night's shard parents.

    Attributes:
        chosen: one parent per shard ``(I, N)``.
        missing: ``"I/N"`` of every shard of a reported split ``N`` that never reported.
        notes: retried shards (which run was used), shards without a matrix hash.
        problems: why the night cannot be trusted whole (shards disagreeing on ``N`` or on the
            matrix, a shard parent not FINISHED); any problem makes the night incomplete.
    """

    chosen: list[Any]
    missing: list[str]
    notes: list[str]
    problems: list[str]


def _label(parent: Any) -> str:
    return f"{parent.params.get('shard') or '1/1'} (run {parent.run_id})"


def _matrix_check(chosen: Sequence[Any], pick: ShardPick) -> None:
    """Shards whose matrix hashes (``TAG_MATRIX``) differ are a problem; none is a note."""
    hashes: dict[str, list[str]] = {}
    unknown = []
    for parent in chosen:
        value = (parent.tags or {}).get(TAG_MATRIX)
        (hashes.setdefault(value, []) if value else unknown).append(_label(parent))
    if unknown:
        note = (f"shard {', '.join(unknown)} carries no {TAG_MATRIX} tag (recorded before it "
                "existed): its matrix is unknown, not checked against the others")  # fmt: skip
        warnings.warn(note, RuntimeWarning, stacklevel=3)
        pick.notes.append(note)
    if len(hashes) > 1:
        each = "; ".join(f"{h}: shard {', '.join(labels)}" for h, labels in sorted(hashes.items()))
        pick.problems.append(
            f"shards ran different matrices ({TAG_MATRIX} {each}): rerun them from one matrix file"
        )


def _commit_check(parents: Sequence[Any], pick: ShardPick) -> None:
    """Shard parents of one night (retries included) on different commits are a problem.

    A night is one commit: shards on several commits are a reused ``--night`` (e.g. a
    constant id every day) or a retry on another checkout. Every run of the night is kept out
    of its cells' baselines, so a reused id would hide the earlier nights' runs and no cell
    could regress. A shard without a commit (``--allow-no-commit``) counts as commit none.
    """
    commits: dict[str, list[str]] = {}
    for parent in sorted(parents, key=lambda p: p.start_time):
        commits.setdefault(getattr(parent, "commit", None) or "none", []).append(_label(parent))
    if len(commits) > 1:
        each = "; ".join(f"{c}: shard {', '.join(labels)}" for c, labels in commits.items())
        pick.problems.append(
            f"the night's shards ran on different commits ({each}): a night is one commit; "
            "give each night its own --night (the default is derived from the commit)"
        )


def pick_shards(parents: Sequence[Any]) -> ShardPick:
    """Group a night's shard parents by shard ``(I, N)`` (their ``shard`` param) and check them.

    A shard reported more than once (a retried CI job) counts once: its newest FINISHED parent,
    else its newest (a note names the run kept and the ones ignored). Every index ``1..N`` of
    every split ``N`` reported must be present, else ``"I/N"`` is missing. Parents that
    disagree on ``N`` (``1/3`` and ``1/2`` cover different cells) are a problem naming each
    shard, never resolved by picking one; so are a chosen parent that is not FINISHED (still
    RUNNING, or FAILED/KILLED: its cells may be partial), shards whose matrix hashes differ,
    and parents (retries included) on different commits (:func:`_commit_check`).
    """
    from parity_tracker.pipeline.matrix import parse_shard

    by_shard: dict[tuple[int, int], list[Any]] = {}
    for parent in parents:
        by_shard.setdefault(parse_shard(parent.params.get("shard") or "1/1"), []).append(parent)
    pick = ShardPick([], [], [], [])
    for (index, count), group in sorted(by_shard.items()):
        runs = sorted(group, key=lambda r: (r.status == "FINISHED", r.start_time))
        pick.chosen.append(runs[-1])
        if len(runs) > 1:
            which = "completed" if runs[-1].status == "FINISHED" else "one; none completed"
            pick.notes.append(
                f"shard {index}/{count} reported {len(runs)} times: used run {runs[-1].run_id} "
                f"(the latest {which}), ignored {', '.join(r.run_id for r in runs[:-1])}"
            )
    counts = sorted({count for _, count in by_shard})
    pick.missing = [f"{i}/{n}" for n in counts for i in range(1, n + 1) if (i, n) not in by_shard]
    if len(counts) > 1:
        pick.problems.append(
            f"shards disagree on the shard count N ({', '.join(map(str, counts))}): shard "
            f"{', '.join(_label(p) for p in pick.chosen)}; run every shard of a night with "
            "one --shard I/N split"
        )
    pick.problems += [
        f"shard {_label(p)} is {p.status}, not FINISHED: its cells may be missing or partial"
        for p in pick.chosen
        if p.status != "FINISHED"
    ]
    _matrix_check(pick.chosen, pick)
    _commit_check(parents, pick)
    return pick


def _shard_file(parent: Any, name: str, store: Any, unknown: list[str]) -> Path | None:
    """A shard parent's file ``name``; None when a shard that did not finish lacks it.

    A shard that died before attaching it (its parent is not FINISHED, already a shard
    problem) is named in ``unknown``; a FINISHED shard's missing file stays an error.

    Raises:
        InfrastructureError: the store could not be reached, or a FINISHED shard lacks it.
    """
    from parity_tracker.errors import InfrastructureError

    try:
        return store.fetch([(parent.run_id, parent.artifact_uri)], name)[0]
    except InfrastructureError:
        if parent.status == "FINISHED":
            raise
        unknown.append(f"shard {_label(parent)} has no {name}: its cells are unknown")
        return None


def _planned(parents: Sequence[Any], store: Any, unknown: list[str]) -> list[Cell]:
    """Every cell the night's shards planned (their ``cells.json``), in matrix order.

    Shard ``I/N`` ran cells ``k`` with ``k % N == I - 1`` (``matrix.shard_cells``), so its
    ``j``-th cell is cell ``j * N + I - 1`` of the matrix. A cell (``Cell.identity``: target
    and settings) planned twice counts once. A shard not FINISHED without ``cells.json`` is
    named in ``unknown`` (:func:`_shard_file`).
    """
    from parity_tracker.pipeline.matrix import parse_shard

    paths = [_shard_file(p, CELLS_FILE, store, unknown) for p in parents]
    order: dict[str, tuple[tuple[int, int], Cell]] = {}
    for parent, path in zip(parents, paths, strict=True):
        if path is None:
            continue
        index, count = parse_shard(parent.params.get("shard") or "1/1")
        for j, item in enumerate(json.loads(Path(path).read_text())):
            cell = Cell(item["target"], tuple(item["settings"].items()))
            order.setdefault(cell.identity, ((j * count + index - 1, parent.start_time), cell))
    return [cell for _, cell in sorted(order.values(), key=lambda kv: kv[0])]


def _cell_result(cell: Cell, run: Any, summary: dict[str, Any] | None) -> CellResult:
    """A cell's outcome read back from its stored run (the diff is added later)."""
    out = CellResult(cell, run_id=run.run_id, fingerprint=run.fingerprint)
    out.passed = run.passed  # the stored verdict (track.store.stored_passed)
    out.recorded = dict(run.settings)
    out.mode = run.tags.get("parity.mode")
    out.tensors_failing = int(run.metrics.get("tensors_failing", 0))
    out.output_max_abs_diff = run.metrics.get("output_max_abs_diff")
    fd = (summary or {}).get("first_divergence")
    out.first_divergence = fd.get("tag") if isinstance(fd, dict) else None
    if "parity.error" in run.tags:
        out.error = run.tags["parity.error"][:500]
    elif run.tags.get("parity.complete") != "true":
        out.error = f"run {run.run_id} is not complete in the store (status {run.status})"
    return out


def _baseline(run: Any, night_ids: set[str], store: Any) -> Any:
    """The cell's baseline: ``choose_baseline`` over its baseline key's runs of other nights.

    The key is the fingerprint and the judged mode (``run.mode.baseline_params``); a run
    without a ``mode`` param has no known mode, so no baseline.
    """
    mode = run.params.get("mode")
    if not run.fingerprint or not mode:
        return None
    found = store.find(**baseline_params(run.fingerprint, mode))
    others = [r for r in found if r.run_id not in night_ids]
    return choose_baseline([*others, run], head_run_id=run.run_id, head_commit=run.commit)


def _diff(out: CellResult, run: Any, night_ids: set[str], store: Any, plan: dict) -> None:
    base = _baseline(run, night_ids, store)
    out.baseline_run_id = None if base is None else base.run_id
    runs = [run] if base is None else [base, run]
    tables = store.modules_tables([r.run_id for r in runs], [r.artifact_uri for r in runs])
    head_tab, base_tab = tables[-1], (tables[0] if base is not None else None)
    diff = diff_runs(base_tab, head_tab, expected=plan["entries"], today=plan["today"],
                     target=out.cell.target, settings=dict(out.cell.settings))  # fmt: skip
    out.diff, out.changes = diff.table, diff.counts
    out.expected_used = [e.describe() for e in diff.expected_used]
    out.unexpected_failing = diff.unexpected_failing


def _reported_errors(parents: Sequence[Any], store: Any, stored: set[str]) -> dict[str, str]:
    """``{cell name: error}`` of cells a FINISHED shard reported failing with no run logged.

    A cell whose target failed to build, or whose run could not be logged, has no run in the
    store; its shard's ``cells.csv`` (``results.cells_table``) holds the error, which the
    merge shows instead of :data:`MISSING`. A shard's file that cannot be read only warns.
    """
    from parity_tracker.pipeline.results import CELLS_CSV, read_cells_csv

    out: dict[str, str] = {}
    for parent in parents:
        if parent.status != "FINISHED":
            continue
        try:
            rows = read_cells_csv(store.fetch([(parent.run_id, parent.artifact_uri)], CELLS_CSV)[0])
        except Exception as exc:  # an old shard without it: the cells stay MISSING
            warnings.warn(f"{CELLS_CSV} of shard {_label(parent)} not read: {exc!r}", stacklevel=3)
            continue
        for name, row in rows.items():
            if name not in stored and row["status"] == "error" and not row["run_id"]:
                out[name] = (f"{row['message'] or 'error'} (shard {_label(parent)} logged no run "
                             "of this cell)")[:500]  # fmt: skip
    return out


def gather_night(
    night: str,
    store: Any,
    *,
    expected: Sequence[Any] = (),
    today: dt.date | None = None,
    found: tuple[list[Any], list[Any]] | None = None,
    problems: list[str] | None = None,
) -> tuple[list[Any], list[CellResult]]:
    """``(shard parent runs, one CellResult per planned cell)`` of night ``night``, diffed.

    A shard reported twice counts once (``pick_shards``: its newest completed parent, only
    that parent's cells); a cell run twice under it counts once: its newest run. ``found`` is
    ``store.night(night)`` when already read. A shard whose planned cells are unknown (not
    FINISHED, no ``cells.json``) is appended to ``problems``.

    Raises:
        InputError: no shard of that night in the store (names the night and experiment).
        InfrastructureError: the store could not be reached.
    """
    parents, children = found if found is not None else store.night(night)
    if not parents:
        raise InputError(
            f"no nightly shard tagged parity.night={night!r} in experiment {store.experiment!r} "
            f"of {store.uri}; run `parity-tracker nightly --night {night}` first"
        )
    night_ids = {r.run_id for r in children}  # every run of the night: never a baseline
    parents = pick_shards(parents).chosen
    kept = {p.run_id for p in parents}
    children = [r for r in children if r.tags.get("mlflow.parentRunId") in kept]
    by_name: dict[str, Any] = {}  # Cell.name is one name per cell: the run name finds it
    for run in sorted(children, key=lambda r: r.start_time):
        by_name[run.tags.get("mlflow.runName") or run.run_id] = run
    stored = [r for r in by_name.values() if r.tags.get("parity.complete") == "true"]
    fetched = store.fetch([(r.run_id, r.artifact_uri) for r in stored], "summary.json")
    summaries = dict(zip([r.run_id for r in stored], fetched, strict=True))
    plan = {"entries": list(expected), "today": today or dt.datetime.now(dt.timezone.utc).date()}
    cells: list[CellResult] = []
    unknown: list[str] = []
    planned = _planned(parents, store, unknown)
    if problems is not None:
        problems += unknown
    reported = _reported_errors(parents, store, set(by_name))
    for cell in planned:
        run = by_name.get(cell.name)
        if run is None:
            cells.append(CellResult(cell, error=reported.get(cell.name, MISSING)))
            continue
        path = summaries.get(run.run_id)
        out = _cell_result(cell, run, json.loads(Path(path).read_text()) if path else None)
        if run.run_id in summaries:  # stored whole: diffable even when its forward failed
            _diff(out, run, night_ids, store, plan)
        cells.append(out)
    return parents, cells


def recorded_expected(night: str, parents: Sequence[Any]) -> Path | None:
    """The expected-divergence file night ``night``'s shards applied, checked; None if none.

    Shards record it as ``TAG_EXPECTED_PATH``/``TAG_EXPECTED_HASH`` (absolute path, xxh3);
    shards from before those tags fall back to ``expected.toml`` beside their ``config``.

    Raises:
        InputError: the shards applied different files, or the recorded file is missing or
            was edited since (``analysis.expected.check_recorded_expected``): the message
            names the path and the fix, ``--expected PATH``.
    """
    recorded = {(p.tags[TAG_EXPECTED_PATH], p.tags.get(TAG_EXPECTED_HASH, ""))
                for p in parents if TAG_EXPECTED_PATH in p.tags}  # fmt: skip
    if not recorded:  # shards older than the tags: the guess merges always made
        config = parents[0].params.get("config")
        guess = Path(config).with_name("expected.toml") if config else None
        return guess if guess is not None and guess.is_file() else None
    if len(recorded) > 1:
        names = ", ".join(
            sorted(f"{path or '(none)'} [{digest or '-'}]" for path, digest in recorded)
        )
        raise InputError(
            f"night {night}'s shards applied different expected-divergence files: {names}; "
            "pass --expected PATH to choose the one the merge applies"
        )
    ((path, digest),) = recorded
    if not path:
        return None  # the shards applied no expected file
    return check_recorded_expected(path, digest, who=f"night {night}'s shards")


def merge_night(
    night: str,
    store: Any,
    *,
    fail_on: str = "regression",
    expected: str | Path | None = None,
    today: dt.date | None = None,
    render: Any = None,
) -> NightlyResult:
    """Join every shard of night ``night`` into one digest on one night parent run.

    Args:
        night: the night id the shards were run with.
        store: a ``track.RunStore``.
        fail_on: ``regression`` | ``mismatch`` | ``never``, as ``run_nightly``.
        expected: the expected-divergence file (default: the one the shards recorded,
            :func:`recorded_expected`; it must still exist with the same content).
        today: the date expected entries expire against (default: today, UTC).
        render: ``render(result, pages) -> {file: text}`` (the CLI passes
            ``dashboards.digest.nightly_artifacts``).

    Returns:
        The night's ``NightlyResult`` (``parent_run_id`` is the new night parent run).

    Raises:
        InputError: bad ``fail_on`` or night id, no shard of that night, bad expected file.
        InfrastructureError: the store could not be reached.
    """
    from parity_tracker.pipeline.nightly import _publish
    from parity_tracker.track import end_run, start_parent_run

    if fail_on not in FAIL_ON:
        raise InputError(f"--fail-on {fail_on!r}; allowed: {', '.join(FAIL_ON)}")
    check_night_id(night)
    found = store.night(night)
    parents = found[0]
    pick = pick_shards(parents)
    if expected is None and parents:
        expected = recorded_expected(night, parents)
    entries = load_expected(expected) if expected else []
    today = today or dt.datetime.now(dt.timezone.utc).date()
    parents, cells = gather_night(night, store, expected=entries, today=today, found=found,
                                  problems=pick.problems)  # fmt: skip
    commits = sorted({p.commit for p in parents if p.commit})
    total = len(pick.chosen) + len(pick.missing)
    matrices = {p.tags.get(TAG_MATRIX) for p in parents}
    parent = start_parent_run(
        tracking_uri=store.uri, experiment=store.experiment, run_name=f"night {night}",
        params={"night": night, "shards": total, "cells": len(cells), "fail_on": fail_on},
        tags={TAG_KIND: KIND_NIGHT, TAG_NIGHT: night,
              TAG_SHARD_RUNS: ",".join(p.run_id for p in parents)[:SHARD_RUNS_CUT],
              **({TAG_MATRIX: matrices.pop()} if len(matrices) == 1 else {})},
        commit=commits[0] if len(commits) == 1 else None,
    )  # fmt: skip
    out = NightlyResult(parent, ",".join(commits) or None, (0, total), cells,
                        expired_entries(entries, today), fail_on, night=night,
                        missing_shards=pick.missing, shard_notes=pick.notes,
                        shard_problems=pick.problems)  # fmt: skip
    _publish(out, render, store)
    end_run(parent, "FINISHED", tracking_uri=store.uri)
    return out
