"""History of one configuration across commits: counts, output error, and the first bad commit.

The stored nightlies become a bisection without re-running anything: per commit, the run's
headline metrics come from ``RunStore.heads`` (on the embedded SQLite store one SQL query
over MLflow's tables; elsewhere one paged MLflow ``search_runs``), no artifact download.
``--tag`` asks ``RunStore.tag_statuses`` (``track.tag_status``: each run's per-tag statuses
from its own MLflow tags, which the same search returns; runs logged before them from their
modules tables). Every read goes through
``track.query.RunStore``; this module never touches MLflow.

"First bad commit" is the first commit of the *current* failing streak: walking commits from
newest to oldest while the tag (or the run) keeps failing, the oldest one reached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from parity_tracker.errors import InputError
from parity_tracker.statuses import PASSING, is_failing, is_neutral  # noqa: F401  (PASSING: old name)
from parity_tracker.track.query import RunStore


def _is_failing(run: Any) -> bool:
    """A run fails when it did not finish or its stored verdict is not a pass.

    The verdict is the run's own (``RunHead.passed``: tag ``parity.passed``, decided once by
    ``run.summary``), so a run that compared no tensor fails although nothing was failing.
    """
    return run.status != "FINISHED" or not run.passed


def _tag_failing(status: str | None) -> bool | None:
    """A tag's status over steps as a streak value.

    Failing (``statuses.FAILING``) True, passing False, neutral (``skipped``: nothing compared)
    or absent None (neither extends nor breaks the failing streak).
    """
    if status is None or is_neutral(status):
        return None
    return is_failing(status)


def search_runs(
    settings: Mapping[str, Any],
    *,
    tracking_uri: str | None = None,
    experiment: str = "parity",
) -> list[Any]:
    """``RunStore.find`` (params, tags and metrics from one paged search), newest first.

    Raises:
        InfrastructureError: the store could not be reached (names the URI).
    """
    return RunStore(tracking_uri, experiment).find(**settings)


def search_heads(
    settings: Mapping[str, Any],
    *,
    tracking_uri: str | None = None,
    experiment: str = "parity",
) -> list[Any]:
    """``RunStore.heads`` (only the fields history needs), newest first.

    Raises:
        InfrastructureError: the store could not be reached (names the URI).
    """
    return RunStore(tracking_uri, experiment).heads(**settings)


def _modules_tables(run_ids: Sequence[str], tracking_uri: str | None) -> list[Any]:
    """Old name kept for callers (``nightly``): ``RunStore(tracking_uri).modules_tables``."""
    return RunStore(tracking_uri).modules_tables(list(run_ids))


def latest_per_commit(runs: Sequence[Any]) -> list[Any]:
    """The newest run of each commit, ordered by when each commit was FIRST tested.

    A commit's place in history is the start time of its earliest run (ties: its commit key),
    so re-running an old commit (a bisection check, a retried cell) shows that commit's newest
    run in its original place instead of moving it to the end and hiding the current failing
    streak (issue 18). Runs without a commit are each their own point, placed by their own
    start time. ``runs`` must hold every run of the commits (both ``RunStore.heads`` backends,
    SQLite and server, return every matching run), in any order.
    """
    newest: dict[str, Any] = {}
    first: dict[str, int] = {}
    for run in runs:
        key = run.commit or f"(no commit) {run.run_id}"
        if key not in newest or run.start_time > newest[key].start_time:
            newest[key] = run
        first[key] = min(first.get(key, run.start_time), run.start_time)
    return [newest[key] for key in sorted(newest, key=lambda k: (first[k], k))]


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
    error_ratio: float | None = None  # worst error_ratio of a budget run (issue 15)
    passed: bool | None = None  # the run's stored verdict (RunHead.passed)


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
        skipped: run ids left out because they are incomplete (their writer stopped during the
            upload, ``track.store.is_incomplete``); the CLI says so.
        newest_failing: whether the newest point whose state is known fails (the tag when
            given, else the run), whatever its commit; None when no point's state is known. A
            failing streak of runs without a commit has no first bad commit but still fails.
        mode: the judged mode followed (the newest matching run's ``mode`` param): with the
            fingerprint it is the baseline key (``run.mode.baseline_key``), so a change of mode
            never shows as a fix or a first bad commit.
    """

    target: str
    settings: dict[str, str]
    fingerprint: str | None
    points: list[CommitPoint]
    tag: str | None = None
    first_bad_commit: str | None = None
    skipped: list[str] = field(default_factory=list)
    newest_failing: bool | None = None
    mode: str | None = None

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
        error_ratio=m.get("worst_error_ratio"),
        passed=bool(getattr(run, "passed", False)),
    )


def stored_configs(store: RunStore, target: str, limit: int = 10) -> list[dict[str, str]]:
    """The distinct settings of ``target``'s stored runs, newest first (``target`` left out).

    For error messages and notes that tell the user which ``--set`` values exist.

    Raises:
        InfrastructureError: the store could not be reached.
    """
    seen: dict[str, dict[str, str]] = {}
    for run in store.find(target=target):
        settings = {k: v for k, v in sorted(run.settings.items()) if k != "target"}
        seen.setdefault(repr(settings), settings)
        if len(seen) >= limit:
            break
    return list(seen.values())


def describe_configs(configs: Sequence[Mapping[str, str]]) -> str:
    """``"quantization=int8,perturb=none; quantization=none,perturb=none"`` (``--set`` form)."""
    return "; ".join(",".join(f"{k}={v}" for k, v in c.items()) or "(no settings)" for c in configs)


def build_history(
    target: str,
    settings: Mapping[str, Any] | None = None,
    *,
    tracking_uri: str | None = None,
    experiment: str = "parity",
    tag: str | None = None,
    last: int | None = None,
    store: RunStore | None = None,
    heads: Sequence[Any] | None = None,
) -> History:
    """The history of ``target`` with ``settings`` across commits.

    Runs are matched on the ``target`` param and every given setting; when they carry several
    config fingerprints (e.g. another device) or judged modes (allclose and budget runs of
    one configuration), the newest run's fingerprint and mode are followed.

    Args:
        target: the target name (the ``target`` param).
        settings: settings the runs must have (``{"quantization": "int8"}``).
        tracking_uri: the store (default: ``store.resolve_tracking_uri``).
        experiment: the MLflow experiment.
        tag: also report this tag's status per commit (from the runs' tags, ``track.tag_codes``;
            runs without them: their modules tables, in place or downloaded).
        last: keep only the newest ``last`` commits.
        store: the ``RunStore`` read (default: ``RunStore(tracking_uri, experiment)``).
        heads: the matching runs' heads when already read (``RunStore.heads`` with the same
            filters); default: read them.

    Raises:
        InputError: no run matches (names the target and settings), or ``tag`` is in none of
            the runs (shows some tags).
        InfrastructureError: the store could not be reached.
    """
    wanted = {"target": target, **{str(k): str(v) for k, v in (settings or {}).items()}}
    store = store or RunStore(tracking_uri, experiment)
    runs = list(heads) if heads is not None else store.heads(**wanted)
    skipped = [r.run_id for r in runs if getattr(r, "incomplete", False)]
    runs = [r for r in runs if not getattr(r, "incomplete", False)]
    if not runs:
        note = f" ({len(skipped)} incomplete run(s) skipped: {skipped[:3]})" if skipped else ""
        configs = stored_configs(store, target) if not skipped else []
        if configs:
            note += (f"; stored configurations of {target}: {describe_configs(configs)}; "
                     "pick one with --set KEY=VALUE (each key of it)")  # fmt: skip
        elif not skipped:
            note += f"; stored targets: {', '.join(store.target_names()) or '(none)'}"
        raise InputError(
            f"no stored run of {target} matches {wanted} in experiment {experiment!r}{note}"
        )
    fingerprint, mode = runs[0].fingerprint, getattr(runs[0], "mode", None)
    runs = [r for r in runs if (r.fingerprint, getattr(r, "mode", None)) == (fingerprint, mode)]
    chosen = latest_per_commit(runs)
    if last is not None:
        chosen = chosen[-last:] if last > 0 else []
    points = [_point(r) for r in chosen]
    if tag is None:
        failing = [_is_failing(r) for r in chosen]
    else:
        statuses, sample = store.tag_statuses(chosen, tag)
        for point, status in zip(points, statuses, strict=True):
            point.tag_status = status
        if points and all(p.tag_status is None for p in points):
            raise InputError(
                f"tag {tag!r} is in none of the {len(points)} runs; "
                f"tags look like: {', '.join(sample)}"
            )
        failing = [_tag_failing(p.tag_status) for p in points]
    newest = next((f for f in reversed(failing) if f is not None), None)
    # a run without a commit cannot be a first bad commit: unknown, it neither extends nor
    # breaks the streak (runs made outside a git checkout with --allow-no-commit)
    failing = [None if p.commit is None else f for p, f in zip(points, failing, strict=True)]
    index = first_bad(failing)
    return History(
        target=target,
        settings=wanted,
        fingerprint=fingerprint,
        points=points,
        tag=tag,
        first_bad_commit=None if index is None else points[index].commit,
        skipped=skipped,
        newest_failing=newest,
        mode=mode,
    )
