"""The data of the nightly's pages (matrix and history), read from the nightly and the store.

The pipeline gathers the data; presentation (``parity_tracker.dashboards``) turns it into
HTML and is injected into ``run_nightly`` by the caller, so this layer never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parity_tracker.pipeline.results import NightlyResult, cell_status
from parity_tracker.run.mode import baseline_params
from parity_tracker.statuses import is_failing

#: Commits of history per configuration on the history page.
HISTORY_COMMITS = 30


@dataclass(frozen=True)
class NightlyPages:
    """What the matrix and history pages show.

    Attributes:
        title: the matrix page's title.
        cells: one dict per cell (``target``, ``settings``, ``run_id``, ``status``,
            ``tensors_failing``, ``output_max_abs_diff``, ``first_divergence``, ``message``,
            ``commit``, ``url``, ``recorded``), as ``dashboards.nightly.render_matrix`` takes
            them.
        runs: stored runs of each cell's configuration (newest 30 commits), as
            ``dashboards.nightly.render_history`` takes them.
        tag_status: ``{tag, commit, status, fingerprint}`` of every tag failing in some run
            of ``runs``, at each of its configuration's commits (``_tag_status``).
    """

    title: str
    cells: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    tag_status: list[dict[str, Any]]


def run_url(tracking_uri: str | None, experiment_id: str | None, run_id: str | None) -> str | None:
    """The run's page on an MLflow server (None for an embedded store: no fixed address)."""
    from parity_tracker.track.browse import run_url as browse_run_url
    from parity_tracker.track.browse import server_base
    from parity_tracker.track.store import resolve_tracking_uri

    base = server_base(resolve_tracking_uri(tracking_uri))
    if not run_id or not experiment_id or base is None:
        return None
    return browse_run_url(base, experiment_id, run_id)


def _cells(result: NightlyResult, url: Any) -> list[dict[str, Any]]:
    return [
        {"target": c.cell.target, "settings": dict(c.cell.settings), "run_id": c.run_id,
         "status": cell_status(c), "tensors_failing": c.tensors_failing,
         "output_max_abs_diff": c.output_max_abs_diff, "first_divergence": c.first_divergence,
         "message": c.error or "; ".join(c.expected_used) or None, "commit": result.commit,
         "url": url(c.run_id), "recorded": dict(c.recorded)}
        for c in result.cells
    ]  # fmt: skip


def _history_runs(
    result: NightlyResult, url: Any, store: Any
) -> tuple[list[dict[str, Any]], dict[str, list[Any]]]:
    """The history page's runs, and each fingerprint's stored runs (one per commit)."""
    from parity_tracker.analysis.history import latest_per_commit

    this = {c.run_id: c for c in result.cells if c.run_id}
    out, stored = [], {}
    for c in result.cells:
        if not c.run_id:
            continue
        fp = c.fingerprint  # the cell's history: runs of its baseline key (fingerprint + mode)
        key = baseline_params(fp, c.mode) if c.mode else {"config_fingerprint": fp}
        runs = stored[fp] = latest_per_commit(store.find(**key))[-HISTORY_COMMITS:]
        for position, r in enumerate(runs):  # commits in order of first test (history)
            mine = this.get(r.run_id)
            out.append({
                "fingerprint": fp, "target": c.cell.target, "settings": dict(c.cell.settings),
                "commit": r.commit, "run_id": r.run_id, "start_time": r.start_time,
                "position": position,
                "tensors_failing": r.metrics.get("tensors_failing"),
                "passed": r.passed,  # the stored verdict (track.store.stored_passed)
                "output_max_abs_diff": r.metrics.get("output_max_abs_diff"),
                "regression": bool(r.metrics.get("regressions", 0)) or bool(
                    mine is not None and mine.changes.get("regression")),
                "url": url(r.run_id),
            })  # fmt: skip
    return out, stored


def _tag_status(stored: dict[str, list[Any]], store: Any) -> list[dict[str, Any]]:
    """Statuses of every tag failing in some stored run of a fingerprint, at each of its commits.

    Read from the runs' stored per-tag statuses (``RunStore.run_tag_statuses``: tag codes,
    else modules tables), over the commits the history page covers, so a configuration failing
    since an earlier commit gets its heatmap too.
    """
    from parity_tracker.track.records import RunHead

    rows = []
    for fp, runs in stored.items():
        statuses = store.run_tag_statuses([RunHead.from_info(r) for r in runs])
        failing = {t for per_run in statuses for t, s in per_run.items() if is_failing(s)}
        for run, per_run in zip(runs, statuses, strict=True):
            rows.extend({"tag": t, "commit": run.commit, "status": s, "fingerprint": fp}
                        for t, s in per_run.items() if t in failing)  # fmt: skip
    return rows


def nightly_pages(result: NightlyResult, store: Any) -> NightlyPages:
    """Gather the pages' data of ``result`` (one read per cell configuration from ``store``).

    Args:
        result: the finished nightly.
        store: the ``track.RunStore`` the nightly logged to.

    Raises:
        Exception: whatever the store raises; the nightly turns it into a warning.
    """
    exp_id = store.experiment_id()

    def url(run_id: str | None) -> str | None:
        return run_url(store.uri, exp_id, run_id)

    runs, stored = _history_runs(result, url, store)
    return NightlyPages(
        title=f"Nightly parity {result.commit or ''}",
        cells=_cells(result, url),
        runs=runs,
        tag_status=_tag_status(stored, store),
    )
