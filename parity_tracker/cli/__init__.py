"""The ``parity-tracker`` command line: each command parses options and calls the library.

Exit codes (design.md, "CLI"; ``parity_tracker.errors``): 0 parity holds / no regression,
1 parity failure or regression, 2 usage or input error, 3 infrastructure error, 130 interrupted.
Errors become output in ONE place, :class:`ParityGroup.invoke` (``cli/group.py``).
Every command that prints results takes ``--json`` (one JSON document on stdout; progress and
hints go to stderr).

Module map: ``group`` (the click group :data:`cli`, :class:`ParityGroup` error mapping, shared
helpers), ``options`` (shared options), ``runs`` (targets, run, nightly), ``analysis`` (diff,
history, report, repro), ``tracking`` (sync, ui), ``nights`` (nightly-merge), ``serve`` (the
``mlflow server`` child), ``terminal`` (rich output). Importing this package registers them all.
"""

from __future__ import annotations

import os

from parity_tracker.cli import analysis, runs, tracking  # noqa: F401  (register the commands)
from parity_tracker.cli.group import (
    EXIT_INTERRUPTED,
    ParityError,
    ParityGroup,
    _emit_json,
    _run_url,
    cli,
    report_files,
)
from parity_tracker.cli.nights import nightly_merge
from parity_tracker.cli.options import (
    experiment_option,
    json_option,
    set_option,
    tracking_uri_option,
)
from parity_tracker.cli.runs import DEFAULT_CONFIG

cli.add_command(nightly_merge)

__all__ = [
    "DEFAULT_CONFIG",
    "EXIT_INTERRUPTED",
    "ParityError",
    "ParityGroup",
    "_emit_json",
    "_run_url",
    "cli",
    "experiment_option",
    "json_option",
    "main",
    "report_files",
    "set_option",
    "tracking_uri_option",
]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``parity-tracker``).

    MLflow's own HTTP retries are turned off by ``track.store.get_client`` (the retry window,
    ``--store-retry-s``, does the retrying, so it bounds the time per store call). The
    environment is set here, not at import, so importing the module changes nothing.
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow draws a tqdm bar per artifact download; the CLI shows its own progress instead.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    cli.main(args=argv, prog_name="parity-tracker")
