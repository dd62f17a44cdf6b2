"""The nightly pipeline: a matrix of targets × settings, each cell run, logged and diffed.

``run_nightly`` reads the matrix (``pipeline.config``, ``pipelines/nightly.toml``), keeps this
shard's cells (``pipeline.matrix``), opens one parent MLflow run, and for each cell builds the
target and runs it (``pipeline.run_target``), logs it as a child run, picks its baseline
(``pipeline.baseline``) and diffs against it (``analysis.diff.diff_tables``), relabelling known
failures as ``expected`` (``analysis.expected.apply_expected``). At the end it logs
``regressions.parquet`` and the files of the injected renderer (``digest.md``, ``matrix.html``,
``history.html`` from ``dashboards.digest.nightly_artifacts``) to the parent run, and returns
the :class:`~parity_tracker.pipeline.results.NightlyResult`.
"""

from __future__ import annotations

import datetime as dt
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from parity_tracker.analysis.diff import count_changes, diff_tables
from parity_tracker.analysis.expected import (
    ExpectedEntry,
    apply_expected,
    expired_entries,
    load_expected,
)
from parity_tracker.errors import InputError
from parity_tracker.pipeline.baseline import (
    baseline_modules,
    choose_baseline,
    modules_table,
    resolve_baseline_runs,
)
from parity_tracker.pipeline.config import load_matrix
from parity_tracker.pipeline.matrix import Cell, parse_shard, shard_cells
from parity_tracker.pipeline.pages import NightlyPages, nightly_pages
from parity_tracker.pipeline.results import (
    FAIL_ON,
    CellResult,
    NightlyResult,
    cell_status,
    regressions_table,
)
from parity_tracker.statuses import failing_mask

#: ``render(result, pages) -> {file name: text}``: the files attached to the parent run
#: (``pages`` is None when the store could not give the pages' data).
Render = Callable[[NightlyResult, NightlyPages | None], Mapping[str, str]]

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


def _diff_cell(
    out: CellResult,
    result: Any,
    *,
    baseline: str,
    explicit: dict[str, str] | None,
    commit: str | None,
    entries: list[ExpectedEntry],
    today: dt.date,
    tracking_uri: str | None,
    experiment: str,
) -> None:
    """Pick the cell's baseline, diff its modules table against head's, apply expectations."""
    fp = out.fingerprint = result.fingerprint
    if explicit is not None:
        base_id = explicit.get(fp)
        base_tab = modules_table(base_id, tracking_uri)
    else:
        base_id, base_tab = baseline_modules(
            baseline,
            head_run_id=out.run_id,
            head_commit=commit,
            fingerprint=fp,
            tracking_uri=tracking_uri,
            experiment=experiment,
        )
    out.baseline_run_id = base_id
    if base_tab is None:  # no baseline: every tag is new; diff against an empty table
        base_tab = result.modules.schema.empty_table()
    diff = diff_tables(base_tab, result.modules)
    diff, used = apply_expected(
        diff, entries, target=out.cell.target, settings=dict(out.cell.settings), today=today
    )
    out.diff = diff
    out.changes = count_changes(diff)
    out.expected_used = [e.describe() for e in used]
    head = diff.column("head_status")  # skipped is no failure; a tag absent in head neither
    failing = diff.filter(pc.and_(failing_mask(head), pc.is_valid(head)))
    out.unexpected_failing = failing.filter(
        pc.not_equal(failing.column("change"), "expected")
    ).num_rows
    _record_on_run(out, tracking_uri)


def _record_on_run(out: CellResult, tracking_uri: str | None) -> None:
    """Log metric ``regressions`` and tag ``parity.baseline_run_id`` on the cell's run.

    The history page marks regressions from them; a store fault here only warns. (Through
    track's client; moves behind track's ``RunStore.record_diff`` when it exists.)
    """
    from parity_tracker.track.store import get_client, retry

    try:
        client = get_client(tracking_uri)
        retry(client.log_metric, out.run_id, "regressions", float(out.changes.get("regression", 0)))
        retry(client.set_tag, out.run_id, "parity.baseline_run_id", out.baseline_run_id or "none")
    except Exception as exc:
        warnings.warn(f"could not record the diff on run {out.run_id}: {exc!r}", stacklevel=2)


def run_cell(
    cell: Cell,
    *,
    parent_run_id: str | None,
    tracking_uri: str | None,
    experiment: str,
    commit: str | None,
    branch: str | None = None,
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
            dump_mode=cell.dump_mode, capture_ops=cell.ops, tracking_uri=tracking_uri,
            experiment=experiment, parent_run_id=parent_run_id, run_name=cell.name,
            commit=commit, branch=branch,
        )  # fmt: skip
    except Exception as exc:  # a broken target must not stop the matrix
        out.error = f"{type(exc).__name__}: {exc}"[:500]
        return out, None
    result = done.result
    out.run_id, out.passed, out.mode = done.run_id, bool(result.passed), result.mode
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


def _cell(cell: Cell, parent: str, *, branch: str | None, **diff_args: Any) -> CellResult:
    """Run, log and diff one cell; a diff fault (e.g. an unreadable baseline) becomes ``error``."""
    res, result = run_cell(
        cell, parent_run_id=parent, tracking_uri=diff_args["tracking_uri"],
        experiment=diff_args["experiment"], commit=diff_args["commit"], branch=branch,
    )  # fmt: skip
    if result is None or res.run_id is None:
        return res
    try:
        _diff_cell(res, result, **diff_args)
    except Exception as exc:
        res.error = f"diff against the baseline failed: {type(exc).__name__}: {exc}"[:500]
    return res


def _start(config: str | Path, cells: list[Cell], shard: tuple[int, int], **meta: Any) -> str:
    """Open the nightly's parent run."""
    from parity_tracker.track import start_parent_run

    index, count = shard
    return start_parent_run(
        tracking_uri=meta["tracking_uri"],
        experiment=meta["experiment"],
        run_name=f"nightly {index}/{count}",
        params={
            "config": str(config),
            "shard": f"{index}/{count}",
            "baseline": meta["baseline"],
            "fail_on": meta["fail_on"],
            "cells": len(cells),
        },
        tags={"parity.kind": "nightly"},
        commit=meta["commit"],
        branch=meta["branch"],
    )


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
    reporter: Reporter | None = None,
    render: Render | None = None,
) -> NightlyResult:
    """Run this shard of the matrix in ``config`` under one parent MLflow run (module docstring).

    Args:
        config: the matrix TOML.
        shard: ``"I/N"`` (1-based), default all cells.
        baseline: ``"auto"`` (see ``pipeline.baseline.choose_baseline``) or a run id: a nightly
            parent run (each cell against the child with its config fingerprint) or a single run.
        fail_on: ``regression`` | ``mismatch`` | ``never`` (see ``NightlyResult.exit_code``).
        expected: the expected-divergence file (default ``expected.toml`` beside ``config``).
        tracking_uri: the store (default ``track.store.resolve_tracking_uri``).
        experiment: the MLflow experiment of the parent and its children.
        commit: the commit recorded on every run (default: read with git).
        branch: the branch recorded (default: read with git).
        today: the date expected entries expire against (default: today, UTC).
        reporter: progress events.
        render: the files to attach to the parent run besides ``regressions.parquet``
            (the CLI passes ``dashboards.digest.nightly_artifacts``); its ``digest.md`` becomes
            ``NightlyResult.digest``. None attaches nothing else.

    Returns:
        The ``NightlyResult``.

    Raises:
        InputError: malformed config or expected file, bad shard or fail_on, unknown baseline.
        InfrastructureError: the store could not be reached to open the parent run. (Cells
            the store refused later are spooled; ``NightlyResult.spooled`` lists them and
            ``exit_code`` is then 3.)
        KeyboardInterrupt: the parent run is ended KILLED first.
    """
    from parity_tracker.run.environment import git_info
    from parity_tracker.track import end_run

    if fail_on not in FAIL_ON:
        raise InputError(f"--fail-on {fail_on!r}; allowed: {', '.join(FAIL_ON)}")
    index, count = parse_shard(shard)
    cells = shard_cells(load_matrix(config), index, count)
    expected = Path(config).with_name("expected.toml") if expected is None else expected
    entries = load_expected(expected)
    today = today or dt.datetime.now(dt.timezone.utc).date()
    git = git_info()
    commit, branch = commit or git["git_commit"], branch or git["git_branch"]
    explicit = resolve_baseline_runs(baseline, tracking_uri=tracking_uri)
    reporter = reporter or Reporter()
    store = {"tracking_uri": tracking_uri, "experiment": experiment}
    parent = _start(config, cells, (index, count), baseline=baseline, fail_on=fail_on,
                    commit=commit, branch=branch, **store)  # fmt: skip
    out = NightlyResult(
        parent, commit, (index, count), [], expired_entries(entries, today), fail_on
    )
    reporter.start(len(cells))
    try:
        for cell in cells:
            reporter.cell_started(cell)
            out.cells.append(
                _cell(cell, parent, branch=branch, baseline=baseline, explicit=explicit,
                      commit=commit, entries=entries, today=today, **store)
            )  # fmt: skip
            reporter.cell_done(out.cells[-1])
    except BaseException as exc:  # Ctrl-C: KILLED; a bug of ours: FAILED; then re-raise
        end_run(parent, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED",
                tracking_uri=tracking_uri)  # fmt: skip
        raise
    finally:
        reporter.stop()
    _publish(out, render, **store)
    end_run(parent, "FINISHED", tracking_uri=tracking_uri)
    return out


def _rendered(
    result: NightlyResult, render: Render | None, *, tracking_uri: str | None, experiment: str
) -> dict[str, str]:
    """The renderer's files; a fault in the pages' data or the renderer only warns."""
    if render is None:
        return {}
    try:
        pages = nightly_pages(result, tracking_uri=tracking_uri, experiment=experiment)
    except Exception as exc:
        warnings.warn(f"nightly pages' data not read: {exc!r}", RuntimeWarning, stacklevel=3)
        pages = None
    try:
        return dict(render(result, pages))
    except Exception as exc:  # a presentation bug must not lose the nightly's results
        warnings.warn(f"nightly files not rendered: {exc!r}", RuntimeWarning, stacklevel=3)
        return {}


def _publish(
    result: NightlyResult, render: Render | None, *, tracking_uri: str | None, experiment: str
) -> None:
    """Log ``regressions.parquet`` and the rendered files to the parent run."""
    from parity_tracker.files.tables import write_table
    from parity_tracker.track import log_artifact_files

    texts = _rendered(result, render, tracking_uri=tracking_uri, experiment=experiment)
    result.digest = texts.get("digest.md", "")
    with tempfile.TemporaryDirectory(prefix="parity-nightly-") as tmp:
        files = {
            "regressions.parquet": write_table(
                regressions_table(result.cells), Path(tmp) / "regressions.parquet"
            )
        }
        for name, text in texts.items():
            files[name] = Path(tmp) / name
            files[name].write_text(text, encoding="utf-8")
        log_artifact_files(result.parent_run_id, files, tracking_uri=tracking_uri)
