"""Select stored runs by what a user knows: a commit, a target and its settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parity_tracker.errors import InputError
from parity_tracker.pipeline.targets import resolve_target


def stored_name(target: str, store: Any) -> str:
    """The ``target`` param the runs of ``target`` were stored under, read without importing.

    ``target`` itself when runs carry that name; else the name stored by runs made from the
    spec ``target`` (``parity-tracker run mypkg.pairs:build`` whose case records
    ``settings["target"] = "my-net"``: tag ``track.store.TAG_TARGET_SPEC``); else ``target``.

    Raises:
        InputError: runs of that spec carry several names (lists them).
        InfrastructureError: the store could not be reached.
    """
    if store.heads(target=target, max_results=1):
        return target
    names = store.target_names(spec=target)
    if len(names) > 1:
        raise InputError(
            f"runs made from {target!r} are stored under several target names: "
            f"{', '.join(names)}; pass one of them instead"
        )
    return names[0] if names else target


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
    return _commit_run(store, commit, *_lookup(target, settings, store))


def _lookup(target: str, settings: Mapping[str, str], store: Any) -> tuple[str, dict[str, str]]:
    """``(stored target name, settings)`` to look a run up by (``--base-commit``/``--base-branch``).

    The name the runs were stored under (:func:`stored_name`: a ``module:function`` spec maps
    to its case's name); the settings validated, defaults filled, when the target is installed
    here, else as given (stored runs carry the name and settings they were run with).

    Raises:
        InputError: a bad setting of an installed target.
    """
    name = stored_name(target, store)
    try:
        resolved = resolve_target(target)
    except InputError:  # not installed here
        return name, dict(settings)
    return (resolved.name if name == target else name), resolved.validate(settings)


def _commit_run(store: Any, commit: str, name: str, settings: Mapping[str, str]) -> str:
    """``store.run_for_commit``; when no run of ``name`` exists at all, lists stored targets."""
    try:
        return store.run_for_commit(commit, target=name, **settings).run_id
    except InputError as exc:
        if store.heads(target=name, max_results=1):
            raise
        stored = ", ".join(store.target_names()) or "(none)"
        raise InputError(f"{exc}; no run of target {name!r} is stored; stored targets: "
                         f"{stored}") from exc  # fmt: skip


def run_for_branch(
    branch: str,
    target: str | None,
    settings: Mapping[str, str],
    *,
    tracking_uri: str | None,
    experiment: str,
) -> str:
    """The newest complete run recorded on ``branch`` with ``target`` and ``settings``.

    The branch is the run's ``mlflow.source.git.branch`` tag (``--branch``, else read with
    git); e.g. ``main`` selects the newest nightly cell or run of that configuration on main,
    whatever its commit: a pull request's baseline.

    Raises:
        InputError: no ``target`` given, a bad setting, or no such run (names the branch,
            settings and experiment).
        InfrastructureError: the store could not be reached.
    """
    from parity_tracker.track.query import RunStore

    if target is None:
        raise InputError("--base-branch needs --target (and optionally --set)")
    store = RunStore(tracking_uri, experiment)
    name, chosen = _lookup(target, settings, store)
    runs = [r for r in store.find(target=name, **chosen) if r.branch == branch]
    runs = [r for r in runs if not r.incomplete]
    if not runs:
        raise InputError(
            f"no run of {name} matching {dict(chosen)} on branch {branch!r} in experiment "
            f"{experiment!r} of {store.uri} (no baseline yet: run the nightly on {branch} first)"
        )
    return runs[0].run_id


def history_selection(
    target: str, settings: Mapping[str, str], store: Any, note: Any = None
) -> tuple[str, dict[str, str], list[Any] | None]:
    """What ``history TARGET --set ...`` follows: ``(target name, settings, heads or None)``.

    Stored runs are read first with the name and settings as given, without importing the
    target (so no torch, and no need for the target's package): when they hold one
    configuration, that is the answer (with the heads already read). Only when they hold
    several (or none) is the target resolved, to fill in its default settings; a target not
    installed here then follows the newest configuration among the stored runs: its settings
    are returned (so they are printed), and ``note(text)`` is told which one was chosen among
    which stored configurations and how to pick another (``--set``).

    ``target`` may be the name the runs were stored under or the spec they were run from
    (:func:`stored_name`).

    Raises:
        InputError: no stored run and the target cannot be resolved (names both, and lists
            the stored target names).
        InfrastructureError: the store could not be reached.
    """
    given = {str(k): str(v) for k, v in settings.items()}
    name, heads = target, store.heads(target=target, **given)
    if not heads:  # a spec given to `run` (module:function) maps to the name it stored
        name = stored_name(target, store)
        heads = store.heads(target=name, **given) if name != target else heads
    if len({h.fingerprint for h in heads}) == 1:
        return name, given, heads
    try:
        resolved = resolve_target(target)
    except InputError as exc:
        if heads:
            return _newest_config(name, given, heads, store, note)
        stored = store.target_names()
        raise InputError(
            f"no stored run of {target!r} with {given} in experiment {store.experiment!r} "
            f"of {store.uri}, and the target is not installed here ({exc}); stored targets: "
            f"{', '.join(stored) or '(none)'}"
        ) from exc
    return (resolved.name if name == target else name), resolved.validate(given), None


def _newest_config(
    target: str, given: dict[str, str], heads: list[Any], store: Any, note: Any
) -> tuple[str, dict[str, str], list[Any]]:
    """The newest stored configuration of a target not installed here (``history_selection``)."""
    from parity_tracker.analysis.history import describe_configs, stored_configs

    fingerprint = heads[0].fingerprint
    newest = store.find(target=target, config_fingerprint=fingerprint, max_results=1)
    chosen = dict(given)
    if newest:
        chosen.update((k, v) for k, v in sorted(newest[0].settings.items()) if k != "target")
    if note is not None:
        others = stored_configs(store, target)
        note(
            f"{target} is not installed here; following the newest stored configuration "
            f"{describe_configs([chosen])} (stored: {describe_configs(others)}); pick another "
            "with --set KEY=VALUE"
        )
    return target, chosen, [h for h in heads if h.fingerprint == fingerprint]
