"""One target run end to end: resolve, validate settings, build, run, log — nothing lost.

``run_target`` is what ``parity-tracker run`` and every nightly cell call. It never loses a
computed result: a store that cannot be reached leaves the run in the spool (the error is
returned with the result, not raised over it), and an interrupted run is still logged KILLED.
The run's dumped tensors are removed from the system temporary folder once they are stored
(uploaded, or copied into the spool): ``TargetRun.dumps`` says where they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity_tracker.errors import InputError, ParityTrackerError
from parity_tracker.pipeline.targets import resolve_target


def run_case(case: Any, **kwargs: Any) -> Any:
    """Run a ``ParityCase``, in this process or, for a sharded candidate, on its ranks.

    A ``parity_tracker.distributed.ShardedCandidate`` is launched (ranks spawned, their
    captures merged against one unsharded reference run: ``distributed.launch``); any other
    candidate goes to ``parity_tracker.run.run_case``. The dispatch lives here, above both the
    run and distributed layers, so the run layer never imports the distributed one.

    Args:
        case: the ``ParityCase``.
        **kwargs: override the case's ``run_parity`` keywords (``mode``, ``dump_mode``, ...).

    Returns:
        The ``RunResult``.
    """
    from parity_tracker.distributed.launch import ShardedCandidate, launch
    from parity_tracker.run.run import case_kwargs
    from parity_tracker.run.run import run_case as run_here

    if not isinstance(case.candidate, ShardedCandidate):
        return run_here(case, **kwargs)
    kw = case_kwargs(case, **kwargs)
    kw.pop("candidate_drive", None)  # each rank's drive comes from its RankCase
    return launch(case.reference, case.candidate, case.inputs, **kw)


class TargetBuildError(InputError):
    """A target's ``build(settings)`` raised; the message names the target and settings."""


@dataclass
class TargetRun:
    """What ``run_target`` produced.

    Attributes:
        result: the ``RunResult``.
        run_id: the MLflow run id, None when not logged (see ``error``).
        error: a ``SpooledError`` (store unreachable, run spooled; CLI exit 3), else None.
        interrupted: the run was stopped by Ctrl-C (logged KILLED).
        dumps: where the run's dumped tensors are, in words (None: nothing was dumped).
    """

    result: Any
    run_id: str | None = None
    error: ParityTrackerError | None = None
    interrupted: bool = False
    dumps: str | None = None


def settle_dumps(out: TargetRun) -> str | None:
    """Remove the run's temporary dump folder once its tensors are stored; say where they are.

    Stored means uploaded (``out.run_id``: the MLflow run's ``tensors/`` artifacts) or spooled
    (``out.error.spool_path``: ``log_run`` copied them under ``artifacts/tensors``). Otherwise
    (not logged, or logging raised) the folder is kept: nothing computed is lost. A folder the
    caller chose (``dump_path``) is never removed (``run.dumps.discard_default_dump``).

    Returns:
        The sentence for the user, or None when the run dumped nothing.
    """
    from parity_tracker.run.dumps import discard_default_dump

    dump = out.result.dump_dir
    spool = getattr(out.error, "spool_path", None)
    if dump is None:
        return None
    if out.run_id is not None:
        where = f"logged as tensors/ of MLflow run {out.run_id}"
    elif spool is not None and (Path(spool) / "artifacts" / "tensors").is_dir():
        where = f"spooled with the run under {Path(spool) / 'artifacts' / 'tensors'}"
    else:
        return f"dumped tensors kept in {dump} (the run was not stored)"
    removed = discard_default_dump(out.result)
    if removed is None:
        return f"dumped tensors {where}; also in {dump}"
    return f"dumped tensors {where}; temporary folder {removed} removed"


def build_case(spec: str, settings: Mapping[str, Any] | None = None) -> tuple[Any, dict[str, str]]:
    """Resolve ``spec``, validate ``settings`` against its schema and build the case.

    Returns:
        ``(ParityCase, the complete validated settings)``.

    Raises:
        InputError: unknown target, setting or value (names the allowed ones).
        TargetBuildError: the target's build raised (names target, settings and the cause).
    """
    target = resolve_target(spec)
    chosen = target.validate(settings)
    try:
        return target.build_case(chosen), chosen
    except ParityTrackerError:
        raise
    except Exception as exc:
        raise TargetBuildError(
            f"target {target.name!r} failed to build with settings {chosen}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def run_target(
    spec: str,
    settings: Mapping[str, Any] | None = None,
    *,
    mode: str = "auto",
    rtol: float | None = None,
    atol: float | None = None,
    capture_ops: bool = False,
    isolate: bool = False,
    dump_mode: str = "NOT_EQUAL",
    tracking_uri: str | None = None,
    experiment: str = "parity",
    parent_run_id: str | None = None,
    run_name: str | None = None,
    commit: str | None = None,
    branch: str | None = None,
    log: bool = True,
    render: Callable[[Any], Mapping[str, str]] | None = None,
    source: tuple[str, str] | None = None,
    keep_repro: int | None = None,
    after_log: Callable[[TargetRun], None] | None = None,
) -> TargetRun:
    """Build and run target ``spec`` with ``settings``, then log it (``track.log_run``).

    Args:
        spec: a target name or ``module:function``.
        settings: setting overrides (``{"quantization": "int8"}``), validated.
        mode: ``auto`` | ``equal`` | ``allclose`` | ``budget``.
        rtol: allclose rtol for every tag (None: the case's overrides, else the per-dtype
            defaults of torch.testing.assert_close); give both rtol and atol or neither.
            Given, both are recorded as settings (``rtol``, ``atol`` params) and so enter the
            config fingerprint.
        atol: allclose atol for every tag.
        capture_ops: also compare every aten op output.
        isolate: re-run failing modules on the reference's inputs.
        dump_mode: a ``DumpMode`` name (``NOT``, ``ALL``, ``NOT_EQUAL``, ``FIRST_NOT_EQUAL``).
        tracking_uri: the store.
        experiment: the MLflow experiment.
        parent_run_id: nest the run under this one (a nightly parent).
        run_name: MLflow run name.
        commit: the commit to record (default: read with git).
        branch: the branch to record.
        log: False to run without logging.
        render: ``render(result) -> {artifact path: text}``, the files the logged run gets
            (the CLI passes the dashboards' report renderer); None: none.
        source: ``(mlflow.source.name, mlflow.source.type)`` of the logged run
            (``track.browse.SOURCE_RUN`` / ``SOURCE_NIGHTLY``); None: ``log_run``'s default.
        keep_repro: bytes kept per reproducer (``run_parity``; None: its default, 0: none).
        after_log: called with the ``TargetRun`` once the run is logged, while its dump is
            still on disk (the nightly uploads the first reproducer); then the temporary dump
            is removed (:func:`settle_dumps`).

    Raises:
        InputError: bad target or settings; TargetBuildError: the build raised.
        KeyboardInterrupt: when interrupted before a result existed.
    """
    from parity_tracker.compare.tolerances import check_pair
    from parity_tracker.tensor_checker import DumpMode
    from parity_tracker.track import SpooledError, log_run
    from parity_tracker.track.store import TAG_TARGET_SPEC

    pair = check_pair(rtol, atol)  # both or neither (torch.testing's rule), before any work
    case, _ = build_case(spec, settings)
    extra: dict[str, Any] = {}
    if pair is not None:  # one (rtol, atol) for every tag, replacing the case's overrides
        extra["tolerances"] = {"*": pair}
        # recorded as settings, so part of the config fingerprint (the baseline key): a run is
        # never diffed against one judged with other tolerances (fake fixes or regressions)
        extra["settings"] = {**case.settings, "rtol": pair[0], "atol": pair[1]}
    if keep_repro is not None:
        extra["keep_repro"] = keep_repro
    try:
        dump = DumpMode[dump_mode.upper()]
    except KeyError:
        names = ", ".join(m.name for m in DumpMode)
        raise InputError(f"dump mode {dump_mode!r} is not one of {names}") from None
    result = run_case(
        case, mode=mode, capture_ops=capture_ops, isolate=isolate, dump_mode=dump, **extra
    )
    out = TargetRun(result=result, interrupted=result.status == "killed")
    if not log:
        out.dumps = settle_dumps(out)  # kept: nothing stored them
        return out
    try:
        out.run_id = log_run(
            result,
            tracking_uri=tracking_uri,
            experiment=experiment,
            parent_run_id=parent_run_id,
            run_name=run_name,
            commit=commit,
            branch=branch,
            render=render,
            **({} if source is None else {"source": source}),
            # the spelling given, when the case stores another name: history/diff accept it
            tags={TAG_TARGET_SPEC: spec} if spec != case.settings.get("target") else None,
        )
    except SpooledError as exc:
        out.error = exc
    try:
        if after_log is not None and out.run_id is not None:
            after_log(out)
    finally:
        out.dumps = settle_dumps(out)
    return out
