"""What the MLflow UI shows of parity runs: run descriptions, filterable tags, addresses.

MLflow 3.17's UI (``mlflow/server/js``) is read as follows, and this module is the one owner of
each name it uses:

- a run's description is the tag ``mlflow.note.content`` (markdown, rendered on the run page
  and searchable as ``tags.`mlflow.note.content```); the Source column shows
  ``mlflow.source.name``/``mlflow.source.type``; the Version column ``mlflow.source.git.commit``;
- an experiment opens in the classic runs view when its tag ``mlflow.experimentKind`` is
  ``custom_model_development`` (else MLflow 3 may open the GenAI overview; the UI's
  "GenAI | Model training" switch changes it by hand);
- the UI's "GenAI | Model training" switch follows the URL parameter
  ``workflowType=machine_learning`` (else the browser's stored choice, GenAI by default);
- routes (hash router): ``#/experiments`` (list), ``#/experiments/<id>/runs`` (runs table),
  ``#/experiments/<id>/runs/<run id>`` (run page), ``.../artifacts/<path>`` (artifact viewer);
- a saved view is the experiment tag ``mlflow.sharedViewState.<key>`` holding
  ``{"name", "createdAt", "updatedAt", "state"}`` (``state``: JSON of the runs table's
  ``selectedColumns`` and search facets); ``?viewStateShareKey=<key>`` on the runs route
  opens it. Column keys are ``<type>.`<key>``` (``params.`target```, ``attributes.`Source```).

Filterable names (stable; the README's search filters use them): params ``target`` and every
setting; tags ``verdict`` (:data:`VERDICTS`) and ``first_divergence`` (the first divergent
tag); metrics ``tensors_failing``, ``output_max_abs_diff``, ``output_sqnr_db``; the commit tag
``mlflow.source.git.commit``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

#: MLflow's run-description tag (rendered as markdown on the run page).
TAG_DESCRIPTION = "mlflow.note.content"
#: MLflow's source tags (the runs table's Source column) and the commit tag (Version column).
TAG_SOURCE_NAME, TAG_SOURCE_TYPE = "mlflow.source.name", "mlflow.source.type"
TAG_COMMIT, TAG_BRANCH = "mlflow.source.git.commit", "mlflow.source.git.branch"
#: Parity's filterable tags: the run's verdict and its first divergent tag.
TAG_VERDICT, TAG_FIRST_DIVERGENCE = "verdict", "first_divergence"
#: Values of the ``verdict`` tag: parity holds, parity fails, a forward raised, interrupted.
VERDICTS = ("pass", "fail", "error", "killed")
#: The experiment tag choosing the UI's mode, and the value of the classic (runs) view.
TAG_EXPERIMENT_KIND, CLASSIC_KIND = "mlflow.experimentKind", "custom_model_development"
#: Saved views of the runs table: experiment tags with this prefix; the parity view's key.
TAG_SAVED_VIEW_PREFIX, SAVED_VIEW_KEY = "mlflow.sharedViewState.", "parity"
#: MLflow's limit on a tag value (``mlflow.utils.validation.MAX_TAG_VAL_LENGTH``).
TAG_VALUE_MAX = 8000
#: Where a run's failing rows (CSV) and its report are stored in its artifacts.
FAILING_CSV, REPORT_FILE = "tables/failing.csv", "report.html"
#: The metrics shown as columns of the parity view, in order.
VIEW_METRICS = ("tensors_failing", "output_max_abs_diff", "output_sqnr_db", "regressions")

#: The parity view's search filter: runs with a ``target`` param (parity runs, not parents).
VIEW_FILTER = "params.target LIKE '%'"
#: The parity view's order, newest first. Not ``attributes.start_time``: with that key the UI
#: also fetches the parents of the runs found and folds the cells under them.
VIEW_ORDER_BY = "attributes.end_time"
#: The UI's mode switch as a URL parameter (``workflowType``; else the browser's last choice).
WORKFLOW_PARAM = "workflowType=machine_learning"

#: ``(mlflow.source.name, mlflow.source.type)`` of what produced a run.
Source = tuple[str, str]
SOURCE_RUN: Source = ("parity-tracker run", "LOCAL")
SOURCE_NIGHTLY: Source = ("parity-tracker nightly", "JOB")
SOURCE_LIBRARY: Source = ("parity_tracker.log_run", "LOCAL")


def run_verdict(record: Any) -> str:
    """The ``verdict`` tag of a run record (``RunSummary``): one of :data:`VERDICTS`."""
    if record.status == "killed":
        return "killed"
    if record.status == "failed" or record.error is not None:
        return "error"
    return "pass" if record.passed else "fail"


def _num(x: Any) -> str:
    """A number for the description: 4 significant digits, ``-`` for None."""
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _code(x: Any) -> str:
    return "`" + str(x).replace("`", "'") + "`"


_HEADLINE = {
    "pass": "**PARITY HOLDS**",
    "fail": "**PARITY FAILS**",
    "error": "**RUN ERROR** (a forward raised)",
    "killed": "**INTERRUPTED**",
}


def _counts(r: Any) -> str:
    line = (
        f"- tensors: {r.tensors_compared} compared, {r.tensors_passing} passing, "
        f"{r.tensors_failing} failing, {r.tensors_skipped} skipped"
    )
    if r.ops_compared:
        line += f"; ops: {r.ops_compared} compared, {r.ops_failing} failing"
    if r.weights_failing:
        line += f"; weights failing: {r.weights_failing}"
    return line


def _output(r: Any) -> str:
    if r.output_equal:
        return "- output: bitwise equal (max |Δ| 0, SQNR infinite)"
    if r.output_max_abs_diff is None and r.output_sqnr_db is None:
        return "- output: not compared"
    return f"- output: max |Δ| {_num(r.output_max_abs_diff)}, SQNR {_num(r.output_sqnr_db)} dB"


def _divergence(label: str, fd: Any) -> str:
    where = ", ".join(
        p
        for p in (
            f"module {_code(fd.module)}" if fd.module else "",
            fd.kind or "",
            f"step {fd.step}" if fd.step is not None else "",
            f"exec order {fd.exec_order}" if fd.exec_order is not None else "",
        )
        if p
    )
    text = f"- {label}: {_code(fd.tag)} ({where}): {fd.status}, max |Δ| {_num(fd.max_abs_diff)}"
    if fd.message:
        text += f" — {str(fd.message)[:120]}"
    return text


def _root_causes(r: Any, limit: int = 3) -> list[str]:
    out = []
    for rc in list(r.root_causes)[:limit]:
        out.append(
            f"- root cause: op {_code(rc.get('op'))} in module {_code(rc.get('module'))} "
            f"(step {rc.get('step')}, {rc.get('status')}"
            + (f", seed case {rc.get('cause')}" if rc.get("cause") else "")
            + ")"
        )
    more = len(r.root_causes) - limit
    return out + ([f"- … and {more} more root causes (report.html)"] if more > 0 else [])


def describe_run(
    record: Any, *, failing_csv_rows: int = 0, failing_total: int = 0, report: bool = True
) -> str:
    """The run's markdown description (tag ``mlflow.note.content``), from its ``RunSummary``.

    Most telling first (the run page folds all but the first lines): verdict and settings, the
    error of a failed run, the first divergence (tag, place, status, max |Δ|), the output's
    max |Δ| and SQNR, counts, the first divergent op, up to 3 root causes, and where the
    failing rows (``tables/failing.csv``) and the full report (``report.html``) are.

    Args:
        record: the run's ``RunSummary``.
        failing_csv_rows: rows written to ``tables/failing.csv`` (0: none written).
        failing_total: failing rows in all (modules + ops) before the CSV's cap.
        report: whether ``report.html`` is among the run's artifacts.

    Returns:
        Markdown of at most :data:`TAG_VALUE_MAX` characters.
    """
    r = record
    verdict = run_verdict(r)
    skip = ("target", "mode")
    settings = ", ".join(f"{k}={v}" for k, v in r.settings.items() if k not in skip)
    target = r.settings.get("target")
    lines = [
        f"{_HEADLINE[verdict]} (verdict {_code(verdict)})"
        + (f" · {_code(target)}" if target else "")
        + (f" {settings}" if settings else "")
        + f" · mode {r.mode}",
        "",
    ]
    if r.error is not None:
        lines.append(
            f"- error ({r.error.side or '?'}): {r.error.type}: {str(r.error.message)[:300]}"
        )
    if r.first_divergence is not None:
        lines.append(_divergence("first divergence", r.first_divergence))
    lines += [_output(r), _counts(r)]
    if r.first_divergent_op is not None:
        lines.append(_divergence("first divergent op", r.first_divergent_op))
    lines += _root_causes(r)
    lines.append("")
    if failing_csv_rows:
        part = "all" if failing_csv_rows >= failing_total else f"the first {failing_csv_rows} of"
        lines.append(f"Failing rows: {_code(FAILING_CSV)} ({part} {failing_total}).")
    if report:
        lines.append(f"Full report: {_code(REPORT_FILE)} (Artifacts tab).")
    return clip("\n".join(lines).rstrip() + "\n", f"\n… (cut; see {REPORT_FILE})\n")


def clip(text: str, tail: str, limit: int = TAG_VALUE_MAX) -> str:
    """``text`` cut to ``limit`` characters (MLflow's tag limit), ending with ``tail`` if cut."""
    if len(text) <= limit:
        return text
    return text[: limit - len(tail)] + tail


def ui_tags(record: Any, source: Source, description: str | None = None) -> dict[str, str]:
    """The UI tags of a parity run: verdict, first divergence, description, source.

    Args:
        record: the run's ``RunSummary``.
        source: ``(name, type)`` for ``mlflow.source.name`` / ``mlflow.source.type``.
        description: the run description (default: ``describe_run(record)``).
    """
    tags = {
        TAG_VERDICT: run_verdict(record),
        TAG_DESCRIPTION: description if description is not None else describe_run(record),
        TAG_SOURCE_NAME: source[0],
        TAG_SOURCE_TYPE: source[1],
    }
    if record.first_divergence is not None:
        tags[TAG_FIRST_DIVERGENCE] = str(record.first_divergence.tag)[:TAG_VALUE_MAX]
    return tags


# ---------------------------------------------------------------------------------------------
# the experiment: mode and saved view


def column_key(kind: str, key: str) -> str:
    """A runs-table column key as the UI writes it: ``<kind>.`<key>```."""
    return f"{kind}.`{key}`"


def view_columns(settings: Iterable[str] = ()) -> list[str]:
    """The parity view's columns: source, commit, target, each setting, verdict, metrics."""
    params = ["target", *(s for s in settings if s != "target")]
    return [
        column_key("attributes", "Source"),
        column_key("attributes", "Version"),
        *(column_key("params", p) for p in params),
        column_key("tags", TAG_VERDICT),
        *(column_key("metrics", m) for m in VIEW_METRICS),
        column_key("tags", TAG_FIRST_DIVERGENCE),
    ]


def saved_view(settings: Iterable[str] = (), *, now_ms: int | None = None) -> str:
    """The value of the tag ``mlflow.sharedViewState.parity``: the runs table with parity columns.

    Newest runs first (:data:`VIEW_ORDER_BY`), filtered on :data:`VIEW_FILTER`: the parity
    runs (the cells) are listed flat instead of folded under their nightly parent (clear the
    search box to see the parents). ``settings`` are the setting param names shown after
    ``target``.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    state = {
        "selectedColumns": view_columns(settings),
        "searchFilter": VIEW_FILTER,
        "orderByKey": VIEW_ORDER_BY,
        "orderByAsc": False,
    }
    envelope = {"name": "parity", "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    return json.dumps(envelope)


def experiment_tags(settings: Iterable[str] = ()) -> dict[str, str]:
    """Tags a parity experiment is created with: classic (runs) mode and the parity view."""
    return {
        TAG_EXPERIMENT_KIND: CLASSIC_KIND,
        TAG_SAVED_VIEW_PREFIX + SAVED_VIEW_KEY: saved_view(settings),
    }


# ---------------------------------------------------------------------------------------------
# addresses


def experiments_url(base: str) -> str:
    """The experiments list of the UI at ``base`` (``http://host:port``), in classic ML mode."""
    return f"{base.rstrip('/')}/#/experiments?{WORKFLOW_PARAM}"


def runs_url(base: str, experiment_id: str, *, view: bool = True) -> str:
    """The runs table of an experiment in classic ML mode, with the parity view when ``view``."""
    url = f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{WORKFLOW_PARAM}"
    return url + (f"&viewStateShareKey={SAVED_VIEW_KEY}" if view else "")


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """A run's page (its description, params, metrics, tags, artifacts), classic ML mode."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW_PARAM}"


def artifact_url(base: str, experiment_id: str, run_id: str, path: str) -> str:
    """A run's artifact in the UI's artifact viewer (e.g. ``tables/failing.csv``)."""
    page = f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return f"{page}/artifacts/{path}?{WORKFLOW_PARAM}"


def server_base(uri: str) -> str | None:
    """The UI address of a tracking URI that is an MLflow server (``http(s)://``), else None."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else None


def setting_keys(params: Iterable[Mapping[str, str]], skip: Iterable[str]) -> list[str]:
    """Param names of runs that are settings (``skip``: environment and derived params), sorted."""
    drop = set(skip)
    return sorted({k for p in params for k in p if k not in drop})
