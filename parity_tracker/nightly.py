"""The nightly pipeline: a matrix of targets × settings, each cell run, logged and diffed.

``run_nightly`` reads the matrix (``pipelines/nightly.toml``), keeps this shard's cells, opens one
parent MLflow run, and for each cell builds the target, runs it (``run.run_case``), logs it as a
child run, picks its baseline and diffs against it (``diff.diff_tables``), relabelling known
failures as ``expected`` (``expected.apply_expected``). At the end it writes
``regressions.parquet`` and ``digest.md`` to the parent run and returns the verdict.

Matrix file format (also documented at the top of ``pipelines/nightly.toml``)::

    [[matrix]]
    target = "digits-cnn"                       # a target name or module:function spec
    quantization = ["none", "fp16", "bf16"]     # each list is one axis; a scalar is one value
    # optional per-entry options: mode = "auto" | "equal" | "allclose", ops = true

Each ``[[matrix]]`` entry expands to the cartesian product of its axes; settings it does not
name take the target's default. Duplicate cells are run once.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from parity_tracker.diff import count_changes, diff_tables, interesting
from parity_tracker.errors import EXIT_INFRA, InfrastructureError, InputError
from parity_tracker.expected import ExpectedEntry, apply_expected, expired_entries, load_expected
from parity_tracker.targets import resolve_target
from parity_tracker.tomlfile import load_toml

#: Keys of a ``[[matrix]]`` entry that are options, not setting axes.
OPTION_KEYS = ("target", "mode", "ops", "rtol", "atol", "dump_mode")
#: Dump mode of a nightly cell unless its entry says otherwise: one tensor pair per failing
#: cell is enough to start from, and keeps a nightly's artifacts small (``NOT_EQUAL`` on a
#: bf16 VAE writes ~200 MB per run).
DEFAULT_DUMP_MODE = "FIRST_NOT_EQUAL"
DUMP_MODES = ("NOT", "ALL", "NOT_EQUAL", "FIRST_NOT_EQUAL")
FAIL_ON = ("regression", "mismatch", "never")


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: a target with complete, validated settings.

    Attributes:
        target: the target name or spec.
        settings: every setting of the target (defaults filled in).
        mode: ``auto``, ``equal`` or ``allclose``.
        ops: capture per-op outputs too.
        rtol: allclose rtol for every tag of the cell (None: the target's own overrides, else
            the per-dtype defaults of ``torch.testing.assert_close``); set with ``atol``.
        atol: allclose atol for every tag of the cell.
        dump_mode: which tensors the cell dumps (``DumpMode`` name).
    """

    target: str
    settings: tuple[tuple[str, str], ...]
    mode: str = "auto"
    ops: bool = False
    rtol: float | None = None
    atol: float | None = None
    dump_mode: str = DEFAULT_DUMP_MODE

    @property
    def name(self) -> str:
        """``digits-cnn[quantization=int8,memory_format=contiguous]``."""
        return f"{self.target}[{','.join(f'{k}={v}' for k, v in self.settings)}]"


def _axes(entry: Mapping[str, Any], where: str) -> dict[str, list[str]]:
    axes = {}
    for key, value in entry.items():
        if key in OPTION_KEYS:
            continue
        values = value if isinstance(value, list) else [value]
        if not values or any(isinstance(v, (dict, list)) for v in values):
            raise InputError(f"{where}: {key} must be a value or a non-empty list of values")
        axes[key] = [str(v) for v in values]
    return axes


def _cell_options(entry: Mapping[str, Any], where: str) -> tuple[Any, Any, str]:
    """``(rtol, atol, dump_mode)`` of a ``[[matrix]]`` entry, validated."""
    from parity_tracker.tolerances import check_pair

    tol = (entry.get("rtol"), entry.get("atol"))
    if any(v is not None and not isinstance(v, (int, float)) for v in tol):
        raise InputError(f"{where}: rtol and atol must be numbers, got {tol}")
    try:
        pair = check_pair(*tol)
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from exc
    dump_mode = str(entry.get("dump_mode", DEFAULT_DUMP_MODE)).upper()
    if dump_mode not in DUMP_MODES:
        raise InputError(f"{where}: dump_mode = {dump_mode!r}; allowed: {', '.join(DUMP_MODES)}")
    rtol, atol = pair if pair is not None else (None, None)
    return rtol, atol, dump_mode


def _expand(entry: Any, where: str) -> list[Cell]:
    if not isinstance(entry, dict) or "target" not in entry:
        raise InputError(f'{where}: each [[matrix]] entry needs target = "name"')
    mode = str(entry.get("mode", "auto"))
    if mode not in ("auto", "equal", "allclose"):
        raise InputError(f"{where}: mode = {mode!r}; allowed: auto, equal, allclose")
    rtol, atol, dump_mode = _cell_options(entry, where)
    try:
        target = resolve_target(str(entry["target"]))
        axes = _axes(entry, where)
        cells = []
        for combo in itertools.product(*axes.values()):
            settings = target.validate(dict(zip(axes, combo, strict=True)))
            cells.append(
                Cell(
                    str(entry["target"]),
                    tuple(settings.items()),
                    mode,
                    bool(entry.get("ops", False)),
                    rtol,
                    atol,
                    dump_mode,
                )
            )
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from exc
    return cells


def load_matrix(path: str | Path) -> list[Cell]:
    """Every cell of the matrix file at ``path``, in file order, duplicates dropped.

    Raises:
        InputError: the file is missing or malformed TOML (names the file and line), an entry
            names an unknown target or a setting value the target does not allow (names the
            file, the entry's 1-based index, and the allowed values), or the matrix is empty.
    """
    data = load_toml(path)
    unknown = set(data) - {"matrix"}
    if unknown:
        raise InputError(f"{path}: unknown top-level keys {sorted(unknown)}; use [[matrix]]")
    cells: dict[Cell, None] = {}
    for i, entry in enumerate(data.get("matrix", []), start=1):
        for cell in _expand(entry, f"{path} [[matrix]] #{i}"):
            cells.setdefault(cell, None)
    if not cells:
        raise InputError(f"{path}: no [[matrix]] entries; see the format at the top of the file")
    return list(cells)


def parse_shard(spec: str | None) -> tuple[int, int]:
    """``"2/4"`` → ``(2, 4)``; None → ``(1, 1)``.

    Raises:
        InputError: not ``I/N`` with 1 ≤ I ≤ N.
    """
    if not spec:
        return 1, 1
    try:
        i, n = (int(p) for p in spec.split("/"))
    except ValueError:
        raise InputError(f"--shard expects I/N such as 1/4, got {spec!r}") from None
    if not 1 <= i <= n:
        raise InputError(f"--shard {spec}: need 1 <= I <= N")
    return i, n


def shard_cells(cells: Sequence[Cell], index: int, count: int) -> list[Cell]:
    """This shard's cells: cell k (0-based, file order) belongs to shard ``k % count + 1``.

    Deterministic and disjoint: the ``count`` shards together run every cell exactly once.
    """
    return [c for k, c in enumerate(cells) if k % count == index - 1]


# --------------------------------------------------------------------------- baseline


def choose_baseline(candidates: Sequence[Any], *, head_run_id: str, head_commit: str | None) -> Any:
    """The baseline among stored runs of one fingerprint (``history.StoredRun``, newest first).

    Rule (``--baseline auto``): finished runs other than the head, started before it, on another
    commit; among those the newest on branch ``main`` if any is on main, else the newest. When
    no other commit has a run, the newest earlier run of the same commit (a re-run) is used.

    Returns:
        The chosen run, or None.
    """
    earlier = [r for r in candidates if r.run_id != head_run_id and r.status == "FINISHED"]
    head = next((r for r in candidates if r.run_id == head_run_id), None)
    if head is not None:
        earlier = [r for r in earlier if r.start_time <= head.start_time]
    other = [r for r in earlier if head_commit is None or r.commit != head_commit]
    on_main = [r for r in other if r.branch == "main"]
    pool = on_main or other or earlier
    return pool[0] if pool else None


# --------------------------------------------------------------------------- results


@dataclass
class CellResult:
    """The outcome of one cell."""

    cell: Cell
    run_id: str | None = None
    passed: bool = False
    mode: str | None = None
    tensors_failing: int = 0
    unexpected_failing: int = 0
    output_max_abs_diff: float | None = None
    first_divergence: str | None = None
    baseline_run_id: str | None = None
    changes: dict[str, int] = field(default_factory=dict)
    expected_used: list[str] = field(default_factory=list)
    error: str | None = None
    spool_path: str | None = None
    fingerprint: str | None = None
    diff: pa.Table | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the diff table left out)."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("diff", "cell")}
        return {
            "cell": self.cell.name,
            "target": self.cell.target,
            "settings": dict(self.cell.settings),
            **out,
        }


@dataclass
class NightlyResult:
    """The whole nightly: every cell, the digest, and the verdict."""

    parent_run_id: str | None
    commit: str | None
    shard: tuple[int, int]
    cells: list[CellResult]
    expired: list[ExpectedEntry]
    fail_on: str
    digest: str = ""

    @property
    def regressions(self) -> int:
        """Regression rows over all cells (``expected`` ones excluded)."""
        return sum(c.changes.get("regression", 0) for c in self.cells)

    @property
    def failed_cells(self) -> list[CellResult]:
        """Cells that could not be built, run or logged."""
        return [c for c in self.cells if c.error]

    @property
    def spooled(self) -> list[str]:
        """Spool paths of cells the store did not take (upload with ``parity-tracker sync``)."""
        return [c.spool_path for c in self.cells if c.spool_path]

    @property
    def exit_code(self) -> int:
        """The exit code: 0 or 1 by ``fail_on``; 3 when cells were spooled.

        ``regression``: 1 on a regression row, a cell that did not complete, or an expired
        expected entry; ``mismatch``: also on any failing tensor not marked expected;
        ``never``: 0. Whatever ``fail_on`` says, 3 (infrastructure) when cells were spooled.
        """
        if self.spooled:
            return EXIT_INFRA
        if self.fail_on == "never":
            return 0
        bad = self.regressions > 0 or bool(self.failed_cells) or bool(self.expired)
        if self.fail_on == "mismatch":
            bad = bad or any(c.unexpected_failing for c in self.cells)
        return 1 if bad else 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "parent_run_id": self.parent_run_id,
            "commit": self.commit,
            "shard": f"{self.shard[0]}/{self.shard[1]}",
            "fail_on": self.fail_on,
            "exit_code": self.exit_code,
            "regressions": self.regressions,
            "spooled": self.spooled,
            "expired": [e.describe() for e in self.expired],
            "cells": [c.to_dict() for c in self.cells],
        }


def regressions_table(cells: Sequence[CellResult]) -> pa.Table:
    """Every changed or expected row of every cell, with the cell's target, settings and runs."""
    parts = []
    for c in cells:
        if c.diff is None or c.diff.num_rows == 0:
            continue
        rows = interesting(c.diff)
        n = rows.num_rows
        meta = {
            "cell": [c.cell.name] * n,
            "target": [c.cell.target] * n,
            "settings": [json.dumps(dict(c.cell.settings))] * n,
            "run_id": [c.run_id] * n,
            "baseline_run_id": [c.baseline_run_id] * n,
        }
        parts.append(
            pa.table(
                {
                    **{k: pa.array(v, pa.string()) for k, v in meta.items()},
                    **{n_: rows.column(n_) for n_ in rows.column_names},
                }
            )
        )
    if not parts:
        return pa.table(
            {
                k: pa.array([], pa.string())
                for k in (
                    "cell",
                    "target",
                    "settings",
                    "run_id",
                    "baseline_run_id",
                    "tag",
                    "change",
                )
            }
        )
    return pa.concat_tables(parts, promote_options="default")


def _fmt(x: Any) -> str:
    return "-" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))


def render_digest(result: NightlyResult, *, limit: int = 30) -> str:
    """The markdown digest: verdict, one line per cell, the regressions, expected and expired."""
    verdict = "FAIL" if result.exit_code else "PASS"
    lines = [
        f"# Parity nightly — {verdict}",
        "",
        f"commit `{result.commit or 'unknown'}` · shard {result.shard[0]}/{result.shard[1]} · "
        f"{len(result.cells)} cells · {result.regressions} regressions · "
        f"fail-on {result.fail_on} · parent run `{result.parent_run_id}`",
        "",
        "| cell | parity | mode | failing | output max abs diff | first divergence | baseline "
        "| regression | worse | drift | fix | expected |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result.cells:
        parity = cell_status(c)
        ch = c.changes
        lines.append(
            f"| {c.cell.name} | {parity} | {_fmt(c.mode)} | {c.tensors_failing} | "
            f"{_fmt(c.output_max_abs_diff)} | {_fmt(c.first_divergence)} | "
            f"{(c.baseline_run_id or 'none')[:12]} | {ch.get('regression', 0)} | "
            f"{ch.get('worse', 0)} | {ch.get('drift', 0)} | {ch.get('fix', 0)} | "
            f"{ch.get('expected', 0)} |"
        )
    lines += _section_rows(result.cells, "regression", "Regressions", limit)
    lines += _section_rows(result.cells, "worse", "Worse (max abs diff grew)", limit)
    errors = [c for c in result.cells if c.error]
    if errors:
        lines += ["", "## Cells that did not complete", ""]
        lines += [f"- {c.cell.name}: {c.error}" for c in errors]
    used = sorted({e for c in result.cells for e in c.expected_used})
    if used:
        lines += ["", "## Expected divergences applied", ""] + [f"- {e}" for e in used]
    if result.expired:
        lines += ["", "## EXPIRED expected divergences (fix them or extend `until`)", ""]
        lines += [f"- {e.describe()}" for e in result.expired]
    return "\n".join(lines) + "\n"


def _section_rows(cells: Sequence[CellResult], change: str, title: str, limit: int) -> list[str]:
    rows = []
    for c in cells:
        if c.diff is None or not c.changes.get(change):
            continue
        for r in c.diff.to_pylist():
            if r["change"] == change:
                rows.append(
                    f"| {c.cell.name} | {r['tag']} | {r['step']} | {r['base_status']} → "
                    f"{r['head_status']} | {_fmt(r['base_max_abs_diff'])} → "
                    f"{_fmt(r['head_max_abs_diff'])} |"
                )
    if not rows:
        return []
    head = [
        "",
        f"## {title}",
        "",
        "| cell | tag | step | status | max abs diff |",
        "|---|---|---|---|---|",
    ]
    more = [f"\n… and {len(rows) - limit} more"] if len(rows) > limit else []
    return head + rows[:limit] + more


# --------------------------------------------------------------------------- execution


class Reporter:
    """Progress events of a nightly (the CLI shows them as a rich progress bar)."""

    def start(self, total: int) -> None:
        """The nightly is about to run ``total`` cells."""

    def cell_started(self, cell: Cell) -> None:
        """``cell`` is being built and run."""

    def cell_done(self, result: CellResult) -> None:
        """``result`` is final (logged and diffed)."""


def _baseline_modules(
    baseline: str,
    *,
    head_run_id: str,
    head_commit: str | None,
    fingerprint: str,
    tracking_uri: str | None,
    experiment: str,
) -> tuple[str | None, pa.Table | None]:
    """``(baseline run id, its modules table)`` for one cell, or ``(None, None)``."""
    from parity_tracker.history import _modules_tables, search_runs

    if baseline == "auto":
        runs = search_runs(
            {"config_fingerprint": fingerprint}, tracking_uri=tracking_uri, experiment=experiment
        )
        chosen = choose_baseline(runs, head_run_id=head_run_id, head_commit=head_commit)
        if chosen is None:
            return None, None
        run_id = chosen.run_id
    else:
        run_id = baseline
    return run_id, _modules_tables([run_id], tracking_uri)[0]


def resolve_baseline_runs(baseline: str, *, tracking_uri: str | None) -> dict[str, str] | None:
    """The runs an explicit ``--baseline RUN_ID`` means, as ``{fingerprint: run id}``.

    A nightly parent run gives its children; a parity run gives itself. ``auto`` gives None.

    Raises:
        InputError: no run ``RUN_ID`` in the store (names it).
        InfrastructureError: the store could not be reached.
    """
    if baseline == "auto":
        return None
    from parity_tracker.store import get_client, resolve_tracking_uri, retry

    uri = resolve_tracking_uri(tracking_uri)
    try:
        client = get_client(uri)
        run = retry(client.get_run, baseline)
    except Exception as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower():
            raise InputError(f"--baseline {baseline}: no such run in {uri}") from exc
        raise InfrastructureError(f"cannot read run {baseline} from {uri}: {exc}") from exc
    fp = run.data.params.get("config_fingerprint")
    if fp:
        return {fp: baseline}
    children = retry(
        client.search_runs,
        [run.info.experiment_id],
        f"tags.`mlflow.parentRunId` = '{baseline}'",
        max_results=5000,
    )
    return {
        c.data.params["config_fingerprint"]: c.info.run_id
        for c in children
        if "config_fingerprint" in c.data.params
    }


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
        base_tab = _modules_tables_or_none(base_id, tracking_uri)
    else:
        base_id, base_tab = _baseline_modules(
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
    failing = diff.filter(  # skipped (never called / cache-skipped) is not a failure
        pc.invert(pc.is_in(diff.column("head_status"), pa.array(["equal", "close", "skipped"])))
    )
    failing = failing.filter(pc.not_equal(failing.column("change"), "expected"))
    out.unexpected_failing = failing.num_rows
    _record_on_run(out, tracking_uri)


def _record_on_run(out: CellResult, tracking_uri: str | None) -> None:
    """Log metric ``regressions`` and tag ``parity.baseline_run_id`` on the cell's run.

    The history page marks regressions from them; a store fault here only warns.
    """
    import warnings

    from parity_tracker.store import get_client, retry

    try:
        client = get_client(tracking_uri)
        retry(client.log_metric, out.run_id, "regressions", float(out.changes.get("regression", 0)))
        retry(client.set_tag, out.run_id, "parity.baseline_run_id", out.baseline_run_id or "none")
    except Exception as exc:
        warnings.warn(f"could not record the diff on run {out.run_id}: {exc!r}", stacklevel=2)


def _modules_tables_or_none(run_id: str | None, tracking_uri: str | None) -> pa.Table | None:
    from parity_tracker.history import _modules_tables

    return None if run_id is None else _modules_tables([run_id], tracking_uri)[0]


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
    from parity_tracker.pipeline import run_target

    out = CellResult(cell)
    try:
        done = run_target(
            cell.target,
            dict(cell.settings),
            mode=cell.mode,
            rtol=cell.rtol,
            atol=cell.atol,
            dump_mode=cell.dump_mode,
            capture_ops=cell.ops,
            tracking_uri=tracking_uri,
            experiment=experiment,
            parent_run_id=parent_run_id,
            run_name=cell.name,
            commit=commit,
            branch=branch,
        )
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


def _cell(
    cell: Cell,
    parent: str,
    *,
    baseline: str,
    explicit: dict[str, str] | None,
    commit: str | None,
    branch: str | None,
    entries: list[ExpectedEntry],
    today: dt.date,
    tracking_uri: str | None,
    experiment: str,
) -> CellResult:
    """Run, log and diff one cell; a diff fault (e.g. an unreadable baseline) becomes ``error``."""
    res, result = run_cell(cell, parent_run_id=parent, tracking_uri=tracking_uri,
                           experiment=experiment, commit=commit, branch=branch)  # fmt: skip
    if result is None or res.run_id is None:
        return res
    try:
        _diff_cell(res, result, baseline=baseline, explicit=explicit, commit=commit,
                   entries=entries, today=today, tracking_uri=tracking_uri,
                   experiment=experiment)  # fmt: skip
    except Exception as exc:
        res.error = f"diff against the baseline failed: {type(exc).__name__}: {exc}"[:500]
    return res


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
) -> NightlyResult:
    """Run this shard of the matrix in ``config`` under one parent MLflow run (module docstring).

    Args:
        config: the matrix TOML.
        shard: ``"I/N"`` (1-based), default all cells.
        baseline: ``"auto"`` (see :func:`choose_baseline`) or a run id: a nightly parent run
            (each cell against the child with its config fingerprint) or a single run.
        fail_on: ``regression`` | ``mismatch`` | ``never`` (see ``NightlyResult.exit_code``).
        expected: the expected-divergence file (default ``expected.toml`` beside ``config``).
        tracking_uri: the store (default ``store.resolve_tracking_uri``).
        experiment: the MLflow experiment of the parent and its children.
        commit: the commit recorded on every run (default: read with git).
        branch: the branch recorded (default: read with git).
        today: the date expected entries expire against (default: today, UTC).
        reporter: progress events.

    Returns:
        The ``NightlyResult``; its ``digest`` is also logged as ``digest.md``.

    Raises:
        InputError: malformed config or expected file, bad shard or fail_on, unknown baseline.
        InfrastructureError: the store could not be reached to open the parent run. (Cells
            the store refused later are spooled; ``NightlyResult.spooled`` lists them and
            ``exit_code`` is then 3.)
        KeyboardInterrupt: the parent run is ended KILLED first.
    """
    from parity_tracker.env import git_info
    from parity_tracker.track import end_run, start_parent_run

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
    parent = start_parent_run(
        tracking_uri=tracking_uri,
        experiment=experiment,
        run_name=f"nightly {index}/{count}",
        params={
            "config": str(config),
            "shard": f"{index}/{count}",
            "baseline": baseline,
            "fail_on": fail_on,
            "cells": len(cells),
        },
        tags={"parity.kind": "nightly"},
        commit=commit,
        branch=branch,
    )
    out = NightlyResult(
        parent, commit, (index, count), [], expired_entries(entries, today), fail_on
    )
    reporter.start(len(cells))
    try:
        for cell in cells:
            reporter.cell_started(cell)
            out.cells.append(
                _cell(cell, parent, baseline=baseline, explicit=explicit, commit=commit,
                      branch=branch, entries=entries, today=today, tracking_uri=tracking_uri,
                      experiment=experiment)
            )  # fmt: skip
            reporter.cell_done(out.cells[-1])
    except BaseException as exc:  # Ctrl-C: KILLED; a bug of ours: FAILED; then re-raise
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        end_run(parent, status, tracking_uri=tracking_uri)
        raise
    out.digest = render_digest(out)
    _publish(out, tracking_uri=tracking_uri, experiment=experiment)
    end_run(parent, "FINISHED", tracking_uri=tracking_uri)
    return out


def _publish(result: NightlyResult, *, tracking_uri: str | None, experiment: str) -> None:
    """Log ``regressions.parquet``, ``digest.md`` and the dashboards to the parent run."""
    from parity_tracker.tables import write_table
    from parity_tracker.track import log_artifact_files

    with tempfile.TemporaryDirectory(prefix="parity-nightly-") as tmp:
        files = {
            "regressions.parquet": write_table(
                regressions_table(result.cells), Path(tmp) / "regressions.parquet"
            ),
            "digest.md": Path(tmp) / "digest.md",
        }
        files["digest.md"].write_text(result.digest, encoding="utf-8")
        files.update(
            _dashboards(result, Path(tmp), tracking_uri=tracking_uri, experiment=experiment)
        )
        log_artifact_files(result.parent_run_id, files, tracking_uri=tracking_uri)


def cell_status(c: CellResult) -> str:
    """The matrix colour of a cell: error, regression, expected, fail or pass."""
    if c.error:
        return "error"
    if c.changes.get("regression"):
        return "regression"
    if c.passed:
        return "pass"
    return "expected" if c.changes.get("expected") and not c.unexpected_failing else "fail"


def _run_url(tracking_uri: str | None, experiment_id: str | None, run_id: str | None) -> str | None:
    """The run's page on an MLflow server (None for an embedded store: no fixed address)."""
    from parity_tracker.store import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    if not run_id or not experiment_id or not uri.startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def _history_runs(
    result: NightlyResult, *, tracking_uri: str | None, experiment: str, exp_id: str | None
) -> list[dict[str, Any]]:
    """Stored runs of each cell's configuration (newest 30 commits) for the history page."""
    from parity_tracker.history import latest_per_commit, search_runs

    this = {c.run_id: c for c in result.cells if c.run_id}
    out = []
    for c in result.cells:
        if not c.run_id:
            continue
        fp = c.fingerprint
        runs = latest_per_commit(
            search_runs(
                {"config_fingerprint": fp}, tracking_uri=tracking_uri, experiment=experiment
            )
        )[-30:]
        for r in runs:
            mine = this.get(r.run_id)
            out.append({
                "fingerprint": fp, "target": c.cell.target, "settings": dict(c.cell.settings),
                "commit": r.commit, "run_id": r.run_id, "start_time": r.start_time,
                "tensors_failing": r.metrics.get("tensors_failing"),
                "output_max_abs_diff": r.metrics.get("output_max_abs_diff"),
                "regression": bool(r.metrics.get("regressions", 0)) or bool(
                    mine is not None and mine.changes.get("regression")),
                "url": _run_url(tracking_uri, exp_id, r.run_id),
            })  # fmt: skip
    return out


def _tag_status(result: NightlyResult) -> list[dict[str, Any]]:
    """Head statuses of the changed or failing tags of this nightly (the heatmap's rows)."""
    rows = []
    for c in result.cells:
        if c.diff is None:
            continue
        for r in interesting(c.diff).to_pylist():
            if r["head_status"] is not None:
                rows.append({"tag": r["tag"], "commit": result.commit, "status": r["head_status"],
                             "fingerprint": c.fingerprint})  # fmt: skip
    return rows


def _dashboards(
    result: NightlyResult, folder: Path, *, tracking_uri: str | None, experiment: str
) -> dict[str, Path]:
    """``matrix.html`` and ``history.html`` (``dashboards.nightly``); a fault only warns."""
    import warnings

    try:
        from parity_tracker.dashboards.nightly import render_history, render_matrix
        from parity_tracker.store import get_client

        exp = get_client(tracking_uri).get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else None
        cells = [
            {"target": c.cell.target, "settings": dict(c.cell.settings), "run_id": c.run_id,
             "status": cell_status(c), "tensors_failing": c.tensors_failing,
             "output_max_abs_diff": c.output_max_abs_diff, "first_divergence": c.first_divergence,
             "message": c.error or "; ".join(c.expected_used) or None, "commit": result.commit,
             "url": _run_url(tracking_uri, exp_id, c.run_id)}
            for c in result.cells
        ]  # fmt: skip
        runs = _history_runs(
            result, tracking_uri=tracking_uri, experiment=experiment, exp_id=exp_id
        )
        pages = {
            "matrix.html": render_matrix(cells, title=f"Nightly parity {result.commit or ''}"),
            "history.html": render_history(runs, _tag_status(result)),
        }
    except Exception as exc:  # a dashboard bug must not lose the nightly's results
        warnings.warn(f"nightly dashboards not written: {exc!r}", RuntimeWarning, stacklevel=2)
        return {}
    files = {}
    for name, html in pages.items():
        files[name] = folder / name
        files[name].write_text(html, encoding="utf-8")
    return files
