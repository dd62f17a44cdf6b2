"""Select stored runs by what a user knows: a commit, a target and its settings."""

from __future__ import annotations

from collections.abc import Mapping

from parity_tracker.errors import InputError
from parity_tracker.pipeline.targets import resolve_target


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
    the runs whose recorded commit starts with it (``track.RunStore.run_for_commit``).

    Raises:
        InputError: no ``target`` given, a bad setting, or no such run (names the commit,
            settings and experiment).
        InfrastructureError: the store could not be reached.
    """
    from parity_tracker.track.query import RunStore

    if target is None:
        raise InputError("--base-commit/--head-commit need --target (and optionally --set)")
    resolved = resolve_target(target)
    chosen = resolved.validate(settings)
    store = RunStore(tracking_uri, experiment)
    return store.run_for_commit(commit, target=resolved.name, **chosen).run_id
