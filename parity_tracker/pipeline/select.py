"""Select stored runs by what a user knows: a commit, a target and its settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    store = RunStore(tracking_uri, experiment)
    try:
        resolved = resolve_target(target)
    except InputError:  # not installed here: stored runs carry the name and settings given
        return store.run_for_commit(commit, target=target, **settings).run_id
    chosen = resolved.validate(settings)
    return store.run_for_commit(commit, target=resolved.name, **chosen).run_id


def history_selection(
    target: str, settings: Mapping[str, str], store: Any
) -> tuple[str, dict[str, str], list[Any] | None]:
    """What ``history TARGET --set ...`` follows: ``(target name, settings, heads or None)``.

    Stored runs are read first with the name and settings as given, without importing the
    target (so no torch, and no need for the target's package): when they hold one
    configuration, that is the answer (with the heads already read). Only when they hold
    several (or none) is the target resolved, to fill in its default settings; a target not
    installed here then follows the newest configuration among the stored runs.

    Raises:
        InputError: no stored run and the target cannot be resolved (names both).
        InfrastructureError: the store could not be reached.
    """
    given = {str(k): str(v) for k, v in settings.items()}
    heads = store.heads(target=target, **given)
    if len({h.fingerprint for h in heads}) == 1:
        return target, given, heads
    try:
        resolved = resolve_target(target)
    except InputError as exc:
        if heads:
            return target, given, heads
        raise InputError(
            f"no stored run of {target!r} with {given} in experiment {store.experiment!r} "
            f"of {store.uri}, and the target is not installed here ({exc})"
        ) from exc
    return resolved.name, resolved.validate(given), None
