"""The nightly pipeline: a matrix of targets × settings, each cell run, logged and diffed.

``run_nightly`` reads the matrix (``pipeline.config``, ``pipelines/nightly.toml``), keeps this
shard's cells (``pipeline.matrix``), opens one parent MLflow run, and for each cell builds the
target and runs it (``pipeline.run_target``), logs it as a child run, picks its baseline
(``pipeline.baseline``) and diffs against it (``analysis.diff.diff_runs``), relabelling known
failures as ``expected``. At the end it logs ``regressions.parquet``, ``cells.csv`` (one row
per cell) and the files of the injected renderer (``digest.md``, ``matrix.html``,
``history.html`` from ``dashboards.digest.nightly_artifacts``) to the parent run, makes the
digest the parent's run description (``mlflow.note.content``), and returns the
:class:`~parity_tracker.pipeline.results.NightlyResult`.
"""

from __future__ import annotations

import datetime as dt
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity_tracker.analysis.diff import diff_runs
from parity_tracker.analysis.expected import (
    ExpectedEntry,
    expected_file_record,
    expired_entries,
    load_expected,
)
from parity_tracker.errors import InputError
from parity_tracker.pipeline.baseline import (
    baseline_modules,
    choose_baseline,
    resolve_baseline_runs,
)
from parity_tracker.pipeline.config import MAX_CELLS, load_matrix
from parity_tracker.pipeline.matrix import Cell, matrix_hash, parse_shard, shard_cells
from parity_tracker.pipeline.pages import NightlyPages, nightly_pages
from parity_tracker.pipeline.results import (
    CELLS_CSV,
    FAIL_ON,
    CellResult,
    NightlyResult,
    cell_status,
    cells_table,
    regressions_table,
)
from parity_tracker.run.mode import baseline_key
from parity_tracker.track.browse import SOURCE_NIGHTLY
from parity_tracker.track.query import RunStore

#: ``render(result, pages) -> {file name: text}``: the files attached to the parent run
#: (``pages`` is None when the store could not give the pages' data).
Render = Callable[[NightlyResult, NightlyPages | None], Mapping[str, str]]
#: ``render_run(result) -> {artifact path: text}``: the files each cell's run gets.
RunRender = Callable[[Any], Mapping[str, str]]

__all__ = [
    "FAIL_ON",
    "Cell",
    "CellResult",
    "NightlyResult",
    "Render",
    "Reporter",
    "cell_status",
    "choose_baseline",
    "load_matrix",
    "parse_shard",
    "regressions_table",
    "resolve_baseline_runs",
    "run_cell",
    "run_nightly",
    "shard_cells",
]


@dataclass(frozen=True)
class _Plan:
    """Everything decided before the first cell runs."""

    config: str
    shard: tuple[int, int]
    cells: list[Cell]
    baseline: str
    explicit: dict[str, str] | None
    fail_on: str
    entries: list[ExpectedEntry]
    today: dt.date
    commit: str | None
    branch: str | None
    night: str
    matrix_hash: str
    expected_record: tuple[str, str] | None = None  # (absolute path, xxh3) of the file applied


class Reporter:
    """Progress events of a nightly (the CLI shows them as a rich progress bar)."""

    def start(self, total: int) -> None:
        """The nightly is about to run ``total`` cells."""

    def cell_started(self, cell: Cell) -> None:
        """``cell`` is being built and run."""

    def cell_done(self, result: CellResult) -> None:
        """``result`` is final (logged and diffed)."""

    def stop(self) -> None:
        """The nightly ended (normally or not)."""


def _diff_cell(out: CellResult, result: Any, plan: _Plan, store: RunStore) -> None:
    """Pick the cell's baseline, diff head against it (``analysis.diff.diff_runs``), record it."""
    fp = out.fingerprint = result.fingerprint
    if plan.explicit is not None:  # the explicit run of this cell's fingerprint AND mode
        base_id = plan.explicit.get(baseline_key(fp, result.record.mode))
        base_tab = None if base_id is None else store.modules_tables([base_id])[0]
    else:
        base_id, base_tab = baseline_modules(
            plan.baseline, head_run_id=out.run_id, head_commit=plan.commit, fingerprint=fp,
            mode=result.record.mode, store=store,
        )  # fmt: skip
    out.baseline_run_id = base_id
    diff = diff_runs(  # no baseline: base None, every tag is new
        base_tab, result, expected=plan.entries, today=plan.today, target=out.cell.target,
        settings=dict(out.cell.settings),
    )  # fmt: skip
    out.diff = diff.table
    out.changes = diff.counts
    out.expected_used = [e.describe() for e in diff.expected_used]
    out.unexpected_failing = diff.unexpected_failing
    _record_on_run(out, store)


def _record_on_run(out: CellResult, store: RunStore) -> None:
    """Store the cell's diff outcome on its run (``track.record_diff``); a fault only warns.

    The history page marks regressions from it (metric ``regressions``, tag
    ``parity.baseline_run_id``).
    """
    from parity_tracker.track import record_diff

    try:
        record_diff(out.run_id, regressions=out.changes.get("regression", 0),
                    baseline_run_id=out.baseline_run_id, tracking_uri=store.uri)  # fmt: skip
    except Exception as exc:
        warnings.warn(f"could not record the diff on run {out.run_id}: {exc!r}", stacklevel=2)


def run_cell(
    cell: Cell,
    *,
    parent_run_id: str | None,
    store: RunStore,
    commit: str | None,
    branch: str | None = None,
    render_run: RunRender | None = None,
) -> tuple[CellResult, Any]:
    """Build, run and log one cell (``pipeline.run_target``); a fault becomes ``error``.

    Returns:
        ``(cell result, RunResult or None)``.

    Raises:
        KeyboardInterrupt: passed on, after an interrupted run was logged KILLED.
    """
    from parity_tracker.pipeline.run_target import run_target

    out = CellResult(cell)
    try:
        done = run_target(
            cell.target, dict(cell.settings), mode=cell.mode, rtol=cell.rtol, atol=cell.atol,
            dump_mode=cell.dump_mode, capture_ops=cell.ops, tracking_uri=store.uri,
            experiment=store.experiment, parent_run_id=parent_run_id, run_name=cell.name,
            commit=commit, branch=branch, render=render_run, source=SOURCE_NIGHTLY,
            after_log=lambda done: _upload_reproducer(done, store.uri),
        )  # fmt: skip
    except Exception as exc:  # a broken target must not stop the matrix
        out.error = f"{type(exc).__name__}: {exc}"[:500]
        return out, None
    result = done.result
    out.run_id, out.passed, out.mode = done.run_id, bool(result.passed), result.mode
    out.recorded = {str(k): str(v) for k, v in (result.settings or {}).items()}
    out.tensors_failing = int(result.summary.get("tensors_failing") or 0)
    out.output_max_abs_diff = result.summary.get("output_max_abs_diff")
    fd = result.first_divergence
    out.first_divergence = fd.get("tag") if fd else None
    if result.error:
        out.error = f"{result.error.get('type')}: {result.error.get('message')}"[:500]
    if done.error is not None:
        out.spool_path = str(getattr(done.error, "spool_path", "")) or None
        out.error = str(done.error)[:500]
    if done.interrupted:
        raise KeyboardInterrupt
    return out, result


def _upload_reproducer(done: Any, uri: str | None) -> None:
    """A failing logged cell's first root cause reproducer, under the run's ``repro/`` (issue 20).

    Called by ``run_target`` while the run's dump (the kept material) is still on disk.
    """
    if done.result.passed:
        return
    try:
        from parity_tracker.repro import upload_first_reproducer

        upload_first_reproducer(done.result, done.run_id, tracking_uri=uri)
    except Exception as exc:
        warnings.warn(f"reproducer not uploaded: {exc!r}", RuntimeWarning, stacklevel=2)


def _cell(
    cell: Cell, parent: str, plan: _Plan, store: RunStore, render_run: RunRender | None
) -> CellResult:
    """Run, log and diff one cell; a diff fault (e.g. an unreadable baseline) becomes ``error``."""
    res, result = run_cell(cell, parent_run_id=parent, store=store, commit=plan.commit,
                           branch=plan.branch, render_run=render_run)  # fmt: skip
    if result is None or res.run_id is None:
        return res
    try:
        _diff_cell(res, result, plan, store)
    except Exception as exc:
        res.error = f"diff against the baseline failed: {type(exc).__name__}: {exc}"[:500]
    return res


def _plan(config: str | Path, *, shard: str | None, baseline: str, fail_on: str,
          expected: str | Path | None, commit: str | None, branch: str | None,
          today: dt.date | None, store: RunStore, night: str | None = None,
          allow_no_commit: bool = False, max_cells: int = MAX_CELLS) -> _Plan:  # fmt: skip
    """Read and check the inputs (matrix, shard, expected file, baseline) before any work.

    Raises:
        InputError: as ``run_nightly``; also no commit (neither given nor readable with git)
            unless ``allow_no_commit``: a night without a commit cannot be bisected.
    """
    from parity_tracker.pipeline.night import check_night_id, default_night_id
    from parity_tracker.run.environment import git_info

    if fail_on not in FAIL_ON:
        raise InputError(f"--fail-on {fail_on!r}; allowed: {', '.join(FAIL_ON)}")
    index, count = parse_shard(shard)
    every = load_matrix(config, max_cells=max_cells)
    cells = shard_cells(every, index, count)
    expected = Path(config).with_name("expected.toml") if expected is None else expected
    entries = load_expected(expected)
    git = git_info()
    commit = commit or git["git_commit"]
    if not commit and not allow_no_commit:
        raise InputError(
            "cannot read the git commit (not a git checkout, or git missing): pass --commit SHA, "
            "or --allow-no-commit to record none (history cannot place such runs)"
        )
    today = today or dt.datetime.now(dt.timezone.utc).date()
    night = check_night_id(night) if night else default_night_id(commit, config, today)
    return _Plan(
        config=str(config), shard=(index, count), cells=cells, baseline=baseline,
        explicit=resolve_baseline_runs(baseline, store, cells), fail_on=fail_on,
        entries=entries, today=today, commit=commit, branch=branch or git["git_branch"],
        night=night, matrix_hash=matrix_hash(every), expected_record=expected_file_record(expected),
    )  # fmt: skip


def _start(plan: _Plan, store: RunStore) -> str:
    """Open the nightly's parent run.

    Tags ``parity.night``, ``parity.matrix_hash`` (of the whole matrix,
    ``matrix.matrix_hash``) and the expected file applied (``parents.TAG_EXPECTED_PATH`` /
    ``TAG_EXPECTED_HASH``, empty when none); artifact ``cells.json`` (this shard's cells).
    """
    from parity_tracker.pipeline.night import CELLS_FILE, cells_json
    from parity_tracker.track import log_artifact_files, start_parent_run
    from parity_tracker.track.parents import (
        KIND_SHARD,
        TAG_EXPECTED_HASH,
        TAG_EXPECTED_PATH,
        TAG_KIND,
        TAG_MATRIX,
        TAG_NIGHT,
    )

    index, count = plan.shard
    parent = start_parent_run(
        tracking_uri=store.uri,
        experiment=store.experiment,
        run_name=f"nightly {index}/{count}",
        params={
            "config": plan.config,
            "shard": f"{index}/{count}",
            "baseline": plan.baseline,
            "fail_on": plan.fail_on,
            "cells": len(plan.cells),
        },
        tags={
            TAG_KIND: KIND_SHARD,
            TAG_NIGHT: plan.night,
            TAG_MATRIX: plan.matrix_hash,
            TAG_EXPECTED_PATH: (plan.expected_record or ("", ""))[0],
            TAG_EXPECTED_HASH: (plan.expected_record or ("", ""))[1],
        },
        source=SOURCE_NIGHTLY,
        commit=plan.commit,
        branch=plan.branch,
    )
    with tempfile.TemporaryDirectory(prefix="parity-cells-") as tmp:
        path = Path(tmp) / CELLS_FILE  # the cells planned, so a merge can name missing ones
        path.write_text(cells_json(plan.cells), encoding="utf-8")
        log_artifact_files(parent, {CELLS_FILE: path}, tracking_uri=store.uri)
    return parent


def run_nightly(
    config: str | Path,
    *,
    shard: str | None = None,
    baseline: str = "auto",
    fail_on: str = "regression",
    expected: str | Path | None = None,
    tracking_uri: str | None = None,
    experiment: str = "parity",
    commit: str | None = None,
    branch: str | None = None,
    today: dt.date | None = None,
    max_cells: int = MAX_CELLS,
    reporter: Reporter | None = None,
    render: Render | None = None,
    render_run: RunRender | None = None,
    night: str | None = None,
    allow_no_commit: bool = False,
) -> NightlyResult:
    """Run this shard of the matrix in ``config`` under one parent MLflow run (module docstring).

    Args:
        config: the matrix TOML.
        shard: ``"I/N"`` (1-based), default all cells.
        baseline: ``"auto"`` (see ``pipeline.baseline.choose_baseline``) or a run id: a nightly
            parent run (each cell against the child with its config fingerprint and judged
            mode, ``run.mode.baseline_key``) or a single run.
        fail_on: ``regression`` | ``mismatch`` | ``never`` (see ``NightlyResult.exit_code``).
        expected: the expected-divergence file (default ``expected.toml`` beside ``config``).
        tracking_uri: the store (default ``track.store.resolve_tracking_uri``).
        experiment: the MLflow experiment of the parent and its children.
        commit: the commit recorded on every run (default: read with git).
        branch: the branch recorded (default: read with git).
        today: the date expected entries expire against (default: today, UTC).
        max_cells: refuse a matrix of more cells (``config.MAX_CELLS`` = 1000 by default).
        reporter: progress events.
        render: the files to attach to the parent run besides ``regressions.parquet``
            (the CLI passes ``dashboards.digest.nightly_artifacts``); its ``digest.md`` becomes
            ``NightlyResult.digest``. None attaches nothing else.
        render_run: the files each cell's run gets (``report.html``), passed to ``log_run``.
        night: the night id shared by every shard (default
            ``pipeline.night.default_night_id``: UTC date, commit, matrix file hash), tagged
            ``parity.night`` on the parent run; ``parity-tracker nightly-merge`` joins them.
        allow_no_commit: run even when no commit is given or readable (recorded as none).

    Returns:
        The ``NightlyResult``.

    Raises:
        InputError: malformed config or expected file, bad shard or fail_on, unknown baseline,
            no commit (see ``allow_no_commit``), all before any cell runs; an explicit
            ``baseline`` that covers none of the shard's cells: before any cell runs when
            no stored run of it has a cell's name or settings (``check_baseline_covers``),
            else after the shard is stored and published when no cell's config fingerprint
            and mode match.
        InfrastructureError: the store could not be reached to open the parent run. (Cells
            the store refused later are spooled; ``NightlyResult.spooled`` lists them and
            ``exit_code`` is then 3.)
        KeyboardInterrupt: the parent run is ended KILLED first.
    """
    from parity_tracker.track import end_run

    store = RunStore(tracking_uri, experiment)
    plan = _plan(config, shard=shard, baseline=baseline, fail_on=fail_on, expected=expected,
                 commit=commit, branch=branch, today=today, store=store, night=night,
                 allow_no_commit=allow_no_commit, max_cells=max_cells)  # fmt: skip
    reporter = reporter or Reporter()
    parent = _start(plan, store)
    out = NightlyResult(
        parent,
        plan.commit,
        plan.shard,
        [],
        expired_entries(plan.entries, plan.today),
        fail_on,
        night=plan.night,
    )
    reporter.start(len(plan.cells))
    try:
        for cell in plan.cells:
            reporter.cell_started(cell)
            out.cells.append(_cell(cell, parent, plan, store, render_run))
            reporter.cell_done(out.cells[-1])
    except BaseException as exc:  # Ctrl-C: KILLED; a bug of ours: FAILED; then re-raise
        end_run(parent, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED",
                tracking_uri=store.uri)  # fmt: skip
        raise
    finally:
        reporter.stop()
    _publish(out, render, store)
    end_run(parent, "FINISHED", tracking_uri=store.uri)
    _check_explicit(plan, out)
    return out


def _check_explicit(plan: _Plan, out: NightlyResult) -> None:
    """An explicit ``--baseline`` must cover at least one cell that ran.

    Raises:
        InputError: it covers none (e.g. another shard's parent): silently diffing against
            nothing would report PASS.
    """
    ran = [c for c in out.cells if c.fingerprint]
    if plan.explicit is None or not ran or any(c.baseline_run_id for c in ran):
        return
    raise InputError(
        f"--baseline {plan.baseline} covers none of this shard's {len(ran)} cells (no run of "
        f"the same configuration and mode under it; another shard's parent?). The cells are stored "
        f"under nightly run {out.parent_run_id}; use --baseline auto, or merge the night with "
        f"`parity-tracker nightly-merge --night {plan.night}`"
    )


def _rendered(result: NightlyResult, render: Render | None, store: RunStore) -> dict[str, str]:
    """The renderer's files; a fault in the pages' data or the renderer only warns."""
    if render is None:
        return {}
    try:
        pages = nightly_pages(result, store)
    except Exception as exc:
        warnings.warn(f"nightly pages' data not read: {exc!r}", RuntimeWarning, stacklevel=3)
        pages = None
    try:
        return dict(render(result, pages))
    except Exception as exc:  # a presentation bug must not lose the nightly's results
        warnings.warn(f"nightly files not rendered: {exc!r}", RuntimeWarning, stacklevel=3)
        return {}


def _publish(result: NightlyResult, render: Render | None, store: RunStore) -> None:
    """Log ``regressions.parquet`` and the rendered files to the parent run."""
    from parity_tracker.files.csvfiles import write_csv
    from parity_tracker.files.tables import write_table
    from parity_tracker.track import log_artifact_files, set_description

    texts = _rendered(result, render, store)
    result.digest = texts.get("digest.md", "")
    with tempfile.TemporaryDirectory(prefix="parity-nightly-") as tmp:
        files = {
            "regressions.parquet": write_table(
                regressions_table(result.cells), Path(tmp) / "regressions.parquet"
            ),
            CELLS_CSV: write_csv(cells_table(result.cells), Path(tmp) / CELLS_CSV),
        }
        for name, text in texts.items():
            files[name] = Path(tmp) / name
            files[name].write_text(text, encoding="utf-8")
        log_artifact_files(result.parent_run_id, files, tracking_uri=store.uri)
    if result.digest:  # the parent's run page shows the night's digest
        try:
            set_description(result.parent_run_id, result.digest, tracking_uri=store.uri)
        except Exception as exc:
            warnings.warn(f"nightly digest not set as the run description: {exc!r}", stacklevel=2)
