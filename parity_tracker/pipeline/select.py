"""Select stored runs by what a user knows: a commit, a target and its settings."""

from __future__ import annotations

from collections.abc import Mapping

from parity_tracker.errors import InputError
from parity_tracker.pipeline.targets import resolve_target

#: Length of a full git SHA-1; anything shorter is an abbreviation, matched as a prefix.
FULL_SHA = 40


def run_for_commit(
    commit: str,
    target: str | None,
    settings: Mapping[str, str],
    *,
    tracking_uri: str | None,
    experiment: str,
) -> str:
    """The newest run of ``commit`` with ``target`` and ``settings`` (validated, defaults filled).

    An abbreviated SHA (shorter than 40 hex digits, as ``git log --oneline`` prints it) matches
    the runs whose recorded commit starts with it.

    Raises:
        InputError: no ``target`` given, a bad setting, or no such run (names the commit,
            target, settings and experiment).
    """
    from parity_tracker.analysis.history import search_runs

    if target is None:
        raise InputError("--base-commit/--head-commit need --target (and optionally --set)")
    resolved = resolve_target(target)
    chosen = resolved.validate(settings)
    query = {"target": resolved.name, **chosen}
    runs = search_runs(
        {**query, "git_commit": commit}, tracking_uri=tracking_uri, experiment=experiment
    )
    if not runs and len(commit) < FULL_SHA:
        runs = [
            r
            for r in search_runs(query, tracking_uri=tracking_uri, experiment=experiment)
            if str(r.commit or "").startswith(commit)
        ]
    if not runs:
        raise InputError(f"no run of {target} {chosen} on commit {commit!r} in {experiment!r}")
    return runs[0].run_id
