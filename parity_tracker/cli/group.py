"""The one ``parity-tracker`` click group and what every command shares.

Errors are turned into output in ONE place, :class:`ParityGroup.invoke` (the pattern of click's
``exceptions.py``: the library raises errors that know their exit code; click shows them).
The commands are registered on :data:`cli` by ``cli/runs.py``, ``cli/analysis.py``,
``cli/tracking.py`` and ``cli/nights.py`` (imported by ``parity_tracker.cli``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import click

from parity_tracker.cli.options import JSON_REQUESTED, store_retry_option
from parity_tracker.cli.quiet import plain_warnings, quiet_libraries
from parity_tracker.errors import EXIT_INFRA, ParityTrackerError, brief
from parity_tracker.files import jsonio

EXIT_INTERRUPTED = 130


class ParityError(click.ClickException):
    """A ``ParityTrackerError`` shown by click with the error's own exit code."""

    def __init__(self, error: ParityTrackerError) -> None:
        super().__init__(str(error))
        self.exit_code = error.exit_code


class ParityGroup(click.Group):
    """The one place where library errors and interrupts become output and exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; ``ParityTrackerError`` → its exit code, Ctrl-C → 130."""
        try:
            return super().invoke(ctx)
        except ParityTrackerError as exc:
            _json_error(ctx, type(exc).__name__, str(exc), exc.exit_code)
            raise ParityError(exc) from exc
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug or an unforeseen fault: never exit 1 (a parity verdict)
            if os.environ.get("PARITY_TRACKER_DEBUG"):
                raise
            message = f"internal error: {type(exc).__name__}: {brief(exc, 500)}"
            _json_error(ctx, "InternalError", message, EXIT_INFRA)
            click.echo(f"Error: {message} (set PARITY_TRACKER_DEBUG=1 for the traceback)", err=True)
            ctx.exit(EXIT_INFRA)


#: ``ctx.meta`` key: a JSON document was printed on stdout already (no second one)
_JSON_DONE = "parity_tracker.json_done"


def _json_error(ctx: click.Context, kind: str, message: str, exit_code: int) -> None:
    """Under ``--json``, the error as stdout's one JSON document (unless one was printed).

    A script reading stdout (``jq``, a CI step) then gets a document on every exit, not an
    empty stream: ``{"error": {"type": ..., "message": ..., "exit_code": ...}}``. The message
    also goes to stderr as without ``--json``.
    """
    if ctx.meta.get(JSON_REQUESTED) and not ctx.meta.get(_JSON_DONE):
        _emit_json({"error": {"type": kind, "message": message, "exit_code": exit_code}})


@contextlib.contextmanager
def stdout_to_stderr(active: bool = True) -> Iterator[None]:
    """While active, whatever the work writes to stdout goes to stderr (``--json``).

    Target code prints ("loading weights...", a model's debug prints, a child process of
    ``--isolate`` or a launcher): under ``--json`` stdout must hold the one JSON document
    only, printed after the block. Both Python's ``sys.stdout`` (``contextlib.redirect_stdout``)
    and file descriptor 1 (``os.dup2``, for C code and child processes) are redirected; both
    are restored on exit.
    """
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = _dup_stdout()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _dup_stdout() -> int | None:
    """A copy of file descriptor 1, which then points at stderr's; None without both fds."""
    try:
        saved = os.dup(1)
    except OSError:
        return None
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        return None
    return saved


def _emit_json(payload: Any) -> None:
    """Print ``payload`` as the invocation's one JSON document (strict: no NaN/Infinity)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[_JSON_DONE] = True
    click.echo(jsonio.dumps(payload, indent=2, default=str))


def report_files(result: Any) -> dict[str, str]:
    """The files a logged run gets beside its tables: ``report.html`` (``dashboards.report``)."""
    from parity_tracker.dashboards.report import render_run_report

    return {"report.html": render_run_report(result)}


@click.group(cls=ParityGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="parity-tracker")
@store_retry_option
def cli(store_retry_s: float | None) -> None:
    """Prove a second implementation of a PyTorch model computes what PyTorch computes."""
    quiet_libraries()  # MLflow/alembic INFO lines, known-harmless library warnings (cli.quiet)
    plain_warnings()  # our own warnings as one "warning: ..." line (cli.quiet)
    if store_retry_s is not None:  # read by track.store.retry_window_s
        os.environ["PARITY_TRACKER_STORE_RETRY_S"] = str(store_retry_s)


def _run_url(uri: str, experiment: str, run_id: str | None) -> str | None:
    """The run's page when the store is an MLflow server (``RunStore.run_url``), else None."""
    from parity_tracker.track.query import RunStore

    try:
        return RunStore(uri, experiment).run_url(run_id)
    except ParityTrackerError:
        return None  # a link is a convenience: an unreachable store must not fail the command
