"""The options shared by commands: store, experiment, --json, --set; and shared-store ones.

The shared-store workflow (issue 18): retry window, night id, missing commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

#: ``parity-tracker --store-retry-s N <command>``; read by ``track.store.retry_window_s``.
store_retry_option = click.option(
    "--store-retry-s",
    type=click.FloatRange(min=0),
    default=None,
    envvar="PARITY_TRACKER_STORE_RETRY_S",
    show_envvar=True,
    help="Seconds to keep retrying a tracking server that refuses or fails (restart, 5xx) "
    "before spooling the run  [default: 90].",
)
night_option = click.option(
    "--night",
    default=None,
    metavar="ID",
    help="Night id shared by every shard (default: UTC date-commit[:12]-sha256(matrix)[:8]).",
)
allow_no_commit_option = click.option(
    "--allow-no-commit", is_flag=True, help="Run even when no commit is given or readable."
)
tracking_uri_option = click.option(
    "--tracking-uri",
    default=None,
    help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///./.parity/mlflow.db).",
)
experiment_option = click.option(
    "--experiment", default="parity", show_default=True, help="MLflow experiment name."
)
#: ``ctx.meta`` key (shared by every context of one invocation): ``--json`` was given, so an
#: error is also printed as a JSON document on stdout (``ParityGroup.invoke``)
JSON_REQUESTED = "parity_tracker.json"


def _note_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[JSON_REQUESTED] = True
    return value


json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    callback=_note_json,
    help='Print one JSON document (an error too: {"error": {...}}, exit code unchanged).',
)
set_option = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="A target setting (repeatable); see `parity-tracker targets`.",
)


def fail_on_option(help_text: str) -> Callable[[Any], Any]:
    """``--fail-on`` with the choices of ``pipeline.results.FAIL_ON`` (the one list)."""
    from parity_tracker.pipeline.results import FAIL_ON

    return click.option(
        "--fail-on",
        type=click.Choice(list(FAIL_ON)),
        default="regression",
        show_default=True,
        help=help_text,
    )
