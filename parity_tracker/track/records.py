"""The records of stored parity runs that ``track.query`` hands out.

``RunInfo`` (one run as ``find_runs`` lists it), ``RunHead`` (the few fields ``history`` needs,
as ``find_run_heads`` lists them) and ``StoredTables`` (``RunStore.load_tables``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parity_tracker.run.environment import ENV_KEYS
from parity_tracker.run.mode import SIDE_NAMES
from parity_tracker.track.store import (
    TAG_COMPLETE,
    TAG_PASSED,
    TAG_RUN_ID,
    is_incomplete,
    stored_passed,
)
from parity_tracker.track.tag_codes import code_tags


@dataclass(frozen=True)
class RunInfo:
    """One stored parity run as ``find_runs`` lists it.

    Attributes:
        run_id: the MLflow run id.
        start_time: milliseconds since the epoch (MLflow's unit).
        commit: ``mlflow.source.git.commit`` tag (None if unknown).
        branch: ``mlflow.source.git.branch`` tag (None if unknown).
        settings: the params minus the environment, ``mode_reason``, ``config_fingerprint``
            and the sides' class names (``run.mode.SIDE_NAMES``; ``mode`` is kept: it is a
            setting of the contract).
        fingerprint: the ``config_fingerprint`` param.
        metrics: the logged metrics (latest values).
        status: MLflow run status (FINISHED, FAILED, KILLED, RUNNING).
        parity_run_id: the ``parity.run_id`` tag (the ``run_id`` column of the tables).
        params: every param, as stored (strings).
        artifact_uri: the run's artifact root (``mlflow-artifacts:/...``, ``s3://...``,
            ``file:///...``), None when unknown.
        tags: every tag, as stored.
        incomplete: its writer stopped before storing it whole (``store.is_incomplete``).
    """

    run_id: str
    start_time: int
    commit: str | None
    branch: str | None
    settings: dict[str, str]
    fingerprint: str | None
    metrics: dict[str, float]
    status: str
    parity_run_id: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    artifact_uri: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    incomplete: bool = False

    @property
    def passed(self) -> bool:
        """The run's stored verdict (tag ``parity.passed``, ``store.stored_passed``)."""
        return stored_passed(self.tags.get(TAG_PASSED))

    @classmethod
    def from_mlflow(cls, run: Any) -> RunInfo:
        """Build from an ``mlflow.entities.Run``."""
        params, tags = dict(run.data.params), dict(run.data.tags)
        skip = {*ENV_KEYS, "mode_reason", "config_fingerprint", *SIDE_NAMES}
        return cls(
            run_id=run.info.run_id,
            start_time=int(run.info.start_time or 0),
            commit=tags.get("mlflow.source.git.commit"),
            branch=tags.get("mlflow.source.git.branch"),
            settings={k: v for k, v in params.items() if k not in skip},
            fingerprint=params.get("config_fingerprint"),
            metrics=dict(run.data.metrics),
            status=run.info.status,
            parity_run_id=tags.get(TAG_RUN_ID),
            params=params,
            artifact_uri=run.info.artifact_uri,
            tags=tags,
            incomplete=is_incomplete(run.info.status, tags.get(TAG_COMPLETE)),
        )


@dataclass(frozen=True)
class RunHead:
    """The few fields of a stored run that ``history`` needs, as ``find_run_heads`` lists them.

    Attributes:
        run_id: the MLflow run id.
        start_time: milliseconds since the epoch (MLflow's unit).
        status: MLflow run status (FINISHED, FAILED, KILLED, RUNNING).
        commit: ``mlflow.source.git.commit`` tag (None if unknown).
        fingerprint: the ``config_fingerprint`` param (None if absent).
        metrics: every logged metric's latest value (as ``RunInfo.metrics``).
        artifact_uri: the run's artifact root (``file:///...`` for the embedded store), or None
            when it was not read (runs found through MLflow's search).
        incomplete: its writer stopped before storing it whole (``store.is_incomplete``).
        tag_codes: the run's MLflow tags that hold its per-tag statuses (``track.tag_codes``;
            empty for runs logged before them).
        passed: the run's stored verdict (tag ``parity.passed``, ``store.stored_passed``):
            False when the tag is absent, so an unknown run is never shown passing.
        mode: the ``mode`` param, the mode the run was judged in (equal, allclose, budget;
            None if absent). With the fingerprint it is the run's baseline key
            (``run.mode.baseline_key``): ``history`` follows one key.
    """

    run_id: str
    start_time: int
    status: str
    commit: str | None
    fingerprint: str | None
    metrics: dict[str, float]
    artifact_uri: str | None = None
    incomplete: bool = False
    tag_codes: dict[str, str] = field(default_factory=dict)
    passed: bool = False
    mode: str | None = None

    @classmethod
    def from_info(cls, info: RunInfo) -> RunHead:
        """The head of a ``RunInfo``."""
        return cls(
            run_id=info.run_id,
            start_time=info.start_time,
            status=info.status,
            commit=info.commit,
            fingerprint=info.fingerprint,
            metrics=dict(info.metrics),
            artifact_uri=info.artifact_uri,
            incomplete=info.incomplete,
            tag_codes=code_tags(info.tags),
            passed=info.passed,
            mode=info.params.get("mode"),
        )


@dataclass(frozen=True)
class StoredTables:
    """A stored run's ``modules`` table and settings (``RunStore.load_tables``).

    Attributes:
        modules: the ``modules`` table (``files.tables.MODULES_SCHEMA``).
        settings: the run's settings (``RunInfo.settings``).
        tracking_run_id: the full MLflow run id.
    """

    modules: Any
    settings: dict[str, str]
    tracking_run_id: str
