"""What a parity run logs, and its staging folder (the spool's format) — for ``track.log``.

The params, metrics and tags of a run (``run_params``, ``run_metrics``, ``run_tags``; exactly
what is listed in ``track.log``'s module docstring), ``stage_run`` writing everything
``log_run`` uploads into one folder (``run.json`` + ``artifacts/``), and ``read_meta`` reading
that folder's ``run.json`` back, checked. Nothing here talks to MLflow.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from parity_tracker.errors import InputError
from parity_tracker.files.atomic import atomic_write_json, atomic_write_text
from parity_tracker.files.csvfiles import failing_rows, write_csv
from parity_tracker.files.safe_paths import resolve_inside
from parity_tracker.files.tables import write_table
from parity_tracker.run.environment import ENV_KEYS
from parity_tracker.run.result import RunResult
from parity_tracker.run.summary import RUN_STATUSES
from parity_tracker.track.browse import (
    FAILING_CSV,
    REPORT_FILE,
    SOURCE_LIBRARY,
    Source,
    describe_run,
    ui_tags,
)
from parity_tracker.track.owner import fault_point
from parity_tracker.track.store import TAG_PASSED, TAG_RUN_ID, param_key
from parity_tracker.track.tag_codes import encode as encode_tag_codes

#: The contract's metrics (design.md), then this module's extras.
CONTRACT_METRICS = (
    "tensors_compared",
    "tensors_passing",
    "tensors_failing",
    "first_divergence_order",
    "output_max_abs_diff",
    "output_sqnr_db",
)
EXTRA_METRICS = ("tensors_skipped", "ops_compared", "ops_failing", "worst_error_ratio")
#: Params derived by the run, logged next to the settings and environment.
DERIVED_PARAMS = ("mode", "mode_reason", "config_fingerprint")
_PARAM_MAX = 6000  # MLflow's limit on a param value's length


# ---------------------------------------------------------------------------------------------
# what gets logged


def _param_value(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _PARAM_MAX else text[: _PARAM_MAX - 3] + "..."


def run_params(result: RunResult) -> dict[str, str]:
    """The params of a run: settings, environment, mode, mode_reason, config_fingerprint.

    An environment value that is None (unknown or not applicable: no git checkout, TF32 on a
    machine without CUDA; ``run.environment``) is left out, never logged as the text
    ``"None"``: an absent ``git_commit`` param matches no commit, as the absent
    ``mlflow.source.git.commit`` tag does.
    """
    r = result.record
    params = {param_key(k): _param_value(v) for k, v in result.settings.items()}
    env = r.environment
    params.update({k: _param_value(env[k]) for k in ENV_KEYS if env.get(k) is not None})
    params["mode"] = r.mode
    params["mode_reason"] = _param_value(r.mode_reason)
    params["config_fingerprint"] = r.config_fingerprint
    return params


def run_metrics(result: RunResult) -> dict[str, float]:
    """The metrics of a run; a metric whose value is None is left out.

    Which metric is left out when: see ``track.log``'s module docstring.
    """
    r = result.record
    values = {
        "tensors_compared": r.tensors_compared,
        "tensors_passing": r.tensors_passing,
        "tensors_failing": r.tensors_failing,
        "first_divergence_order": r.first_divergence and r.first_divergence.exec_order,
        "output_max_abs_diff": r.output_max_abs_diff,
        "output_sqnr_db": r.output_sqnr_db,
        **{k: getattr(r, k) for k in EXTRA_METRICS},
    }
    return {k: float(v) for k, v in values.items() if v is not None}


def run_tags(result: RunResult, parent_run_id: str | None) -> dict[str, str]:
    """The tags of a run (without ``parity.complete``, which is set once all is stored).

    They include the run's per-tag statuses, packed by ``track.tag_codes.encode``.
    """
    r = result.record
    env = r.environment
    tags = {
        TAG_RUN_ID: result.run_id,
        "parity.status": r.status,
        TAG_PASSED: str(bool(r.passed)).lower(),
        "parity.config_fingerprint": r.config_fingerprint,
        "parity.mode": r.mode,
    }
    if env.get("git_commit"):
        tags["mlflow.source.git.commit"] = str(env["git_commit"])
    if env.get("git_branch"):
        tags["mlflow.source.git.branch"] = str(env["git_branch"])
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    if r.error is not None:
        tags["parity.error"] = f"{r.error.type}: {r.error.message}"[:5000]
    tags.update(encode_tag_codes(result.modules, result.run_id))  # statuses for history --tag
    return tags


#: Renders the files a run's artifacts get beside its tables: ``render(result)`` returns
#: ``{artifact_path: text}`` (e.g. ``{"report.html": html}``). The layer above passes one.
Renderer = Callable[[RunResult], Mapping[str, str]]


def _write_rendered(result: RunResult, art: Path, render: Renderer | None) -> None:
    """Write ``render(result)``'s files under ``art``; a renderer fault only warns."""
    if render is None:
        return
    try:
        files = dict(render(result))
    except Exception as exc:  # a report bug must not lose the run
        warnings.warn(f"rendered artifacts not written: {exc!r}", RuntimeWarning, stacklevel=3)
        return
    for name, text in files.items():
        atomic_write_text(_inside(art, name), text)


def _inside(root: Path, name: str) -> Path:
    """``root / name``, refusing a name that leaves ``root`` (absolute, or with ``..``).

    Raises:
        InputError: the artifact path escapes the artifact root.
    """
    return resolve_inside(root, name, what="artifact path", root_name="artifact root")


def _copy_artifacts(art: Path, artifacts: Mapping[str, str | os.PathLike[str]] | None) -> None:
    """Copy ``{artifact_path: local file}`` under ``art``.

    Raises:
        InputError: a file does not exist, or an artifact path leaves the root.
    """
    for name, local in (artifacts or {}).items():
        if not Path(local).is_file():
            raise InputError(f"artifact file {local} (for {name!r}) does not exist")
        target = _inside(art, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, target)


def _stage_ui(result: RunResult, art: Path, source: Source) -> dict[str, str]:
    """Write ``tables/failing.csv`` (when rows fail) and return the run's UI tags.

    The tags (``browse.ui_tags``) carry the description, which says how many failing rows the
    CSV holds (capped at ``files.csvfiles.FAILING_CSV_MAX_ROWS``) and whether ``report.html``
    is among the artifacts.
    """
    rows, total = failing_rows(result.modules, result.ops)
    if total:
        write_csv(rows, art / FAILING_CSV)
    text = describe_run(
        result.record,
        failing_csv_rows=rows.num_rows if total else 0,
        failing_total=total,
        report=(art / REPORT_FILE).is_file(),
    )
    return ui_tags(result.record, source, text)


def default_run_name(result: RunResult) -> str:
    """The MLflow run name when none is given: ``<target or "parity">-<parity run id[:8]>``.

    Not MLflow's generated name: ``run_parity`` seeds Python's ``random`` (the sides' fixed
    seed), and MLflow draws its adjective-noun names from it, so every run of a process got
    the same name (the runs table could not tell them apart).
    """
    target = result.settings.get("target")
    return f"{target or 'parity'}-{str(result.run_id)[:8]}"


def stage_run(
    result: RunResult,
    folder: Path,
    *,
    experiment: str,
    tracking_uri: str,
    parent_run_id: str | None,
    run_name: str | None,
    artifacts: Mapping[str, str | os.PathLike[str]] | None = None,
    render: Renderer | None = None,
    source: Source = SOURCE_LIBRARY,
    tags: Mapping[str, str] | None = None,
) -> Path:
    """Write everything ``log_run`` uploads into ``folder`` (the spool's format).

    Layout: ``run.json`` (experiment, run name, parent, params, metrics, tags, status, times)
    and ``artifacts/`` (``tables/modules.parquet``, ``tables/ops.parquet``, ``summary.json``,
    the files of ``artifacts`` and of ``render``, e.g. ``report.html``; ``tables/failing.csv``
    when rows fail). Tensors are not copied here (see ``track.log._spool``). The tags include
    the UI's (``browse.ui_tags``: verdict, first divergence, description, ``source``).
    """
    art = folder / "artifacts"
    write_table(result.modules, art / "tables" / "modules.parquet")
    write_table(result.ops, art / "tables" / "ops.parquet")
    _copy_artifacts(art, artifacts)
    _write_rendered(result, art, render)
    try:
        shown = _stage_ui(result, art, source)
    except Exception as exc:  # a description bug must not lose the run
        warnings.warn(f"UI tags not written: {exc!r}", RuntimeWarning, stacklevel=2)
        shown = {}
    atomic_write_text(art / "summary.json", result.record.to_json())
    fault_point("staging")
    now = int(time.time() * 1000)
    meta = {
        "parity_run_id": result.run_id,
        "experiment": experiment,
        "tracking_uri": tracking_uri,
        "run_name": run_name or default_run_name(result),
        "parent_run_id": parent_run_id,
        "params": run_params(result),
        "metrics": run_metrics(result),
        "tags": {**(tags or {}), **shown, **run_tags(result, parent_run_id)},
        "status": RUN_STATUSES[result.record.status],
        "start_time": int(result.record.start_time_ms or now),
        "end_time": now,
    }
    atomic_write_json(folder / "run.json", meta)
    return folder


#: ``run.json`` of a staged or spooled run: key → the types its value may have.
_META_TYPES: dict[str, tuple[type, ...]] = {
    "parity_run_id": (str,), "experiment": (str,), "tracking_uri": (str,),
    "run_name": (str, type(None)), "parent_run_id": (str, type(None)), "params": (dict,),
    "metrics": (dict,), "tags": (dict,), "status": (str,), "start_time": (int,),
    "end_time": (int,),
}  # fmt: skip


def read_meta(folder: Path) -> dict[str, Any]:
    """``folder/run.json`` (a staged or spooled run), checked key by key.

    Raises:
        InputError: the file is missing, not strict JSON, or a key is missing or of the wrong
            type (a spool entry someone else could have written; names the file and key).
    """
    path = folder / "run.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path}: unreadable run record ({type(exc).__name__}: {exc})") from exc
    if not isinstance(meta, dict):
        raise InputError(f"{path}: a run record must be a JSON object")
    for key, types in _META_TYPES.items():
        if not isinstance(meta.get(key), types) or isinstance(meta.get(key), bool):
            allowed = " or ".join(t.__name__ for t in types)
            raise InputError(f"{path}: {key} = {meta.get(key)!r}; expected {allowed}")
    return meta
