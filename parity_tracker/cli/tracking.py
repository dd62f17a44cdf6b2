"""``parity-tracker sync`` and ``ui``: the spool's upload and the MLflow UI on the store."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from parity_tracker.cli import terminal as T
from parity_tracker.cli.group import _emit_json, cli
from parity_tracker.cli.options import experiment_option, json_option, tracking_uri_option
from parity_tracker.cli.serve import ui_command
from parity_tracker.errors import ParityTrackerError


@cli.command()
@click.option(
    "--tracking-uri",
    default=None,
    help="Send every spooled run to this store (default: each run to the store it was "
    "spooled for, recorded in the spool; $MLFLOW_TRACKING_URI is not read for them). Stale "
    "RUNNING runs are marked KILLED in this store (default: $MLFLOW_TRACKING_URI, else "
    "sqlite:///./.parity/mlflow.db).",
)
@json_option
def sync(tracking_uri: str | None, as_json: bool) -> None:
    """Upload the runs spooled while the tracking store was unreachable (exactly once).

    Without --tracking-uri each run goes to the store it was meant for (recorded when it was
    spooled); --tracking-uri sends them all to that store instead. Runs whose writer was killed
    mid-upload are finished from the spool; then every RUNNING run of the store whose writer
    is gone (this host: no such process; another host: started over 24 h ago) is marked KILLED.
    """
    from parity_tracker.errors import InfrastructureError
    from parity_tracker.track import reap_stale_runs, sync_spool

    done = sync_spool(tracking_uri)
    try:
        killed = reap_stale_runs(tracking_uri)
    except Exception as exc:
        raise InfrastructureError(f"cannot list RUNNING runs: {type(exc).__name__}: {exc}") from exc
    if as_json:
        _emit_json({"uploaded": done, "killed": killed})
        return
    for parity_id, run_id in done.items():
        click.echo(f"uploaded {parity_id} as run {run_id}")
    for run_id in killed:
        click.echo(f"marked run {run_id} KILLED (its writer is gone)")
    click.echo(f"{len(done)} spooled run(s) uploaded, {len(killed)} stale run(s) marked KILLED")


def _ui_urls(uri: str, base: str, experiment: str, explicit: bool) -> dict[str, Any]:
    """The addresses ``ui`` prints: the experiment's runs view, the list, which one to open.

    The runs view of ``experiment`` (with the parity columns, ``track.browse.runs_url``) is
    opened; the experiments list instead when the experiment has no runs yet, or when
    ``--experiment`` was not given and several experiments hold runs.
    """
    from parity_tracker.track import browse
    from parity_tracker.track.query import RunStore

    store = RunStore(uri, experiment)
    try:
        exp_id = store.prepare_ui()
        names = store.experiment_names()
    except ParityTrackerError as exc:  # e.g. a server store not up yet: its front page
        click.echo(f"warning: {exc}", err=True)
        return {"url": base, "runs_url": None, "experiments_url": browse.experiments_url(base),
                "open": base, "experiments": []}  # fmt: skip
    runs = browse.runs_url(base, exp_id) if exp_id is not None else None
    listing = browse.experiments_url(base)
    several = len(names) > 1
    opened = runs if runs and (explicit or not several) else listing
    return {"url": base, "runs_url": runs, "experiments_url": listing, "open": opened,
            "experiments": names}  # fmt: skip


@cli.command()
@click.option("--port", type=int, default=5000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address (loopback).")
@click.option("--dry-run", is_flag=True, help="Print the URLs and command; start nothing.")
@click.option(
    "--open/--no-open",
    "open_browser",
    default=None,
    help="Open the URL in a browser once the server answers (default: when on a terminal).",
)
@tracking_uri_option
@experiment_option
@json_option
@click.pass_context
def ui(
    ctx: click.Context,
    port: int,
    host: str,
    dry_run: bool,
    open_browser: bool | None,
    tracking_uri: str | None,
    experiment: str,
    as_json: bool,
) -> None:
    """Start the MLflow UI on the store (bound to 127.0.0.1) and print the runs view's URL.

    SIGTERM / SIGINT stop the server too; the command exits once the port is free.
    """
    from parity_tracker.cli.quiet import server_line_shown
    from parity_tracker.cli.serve import MODE_HINT, serve
    from parity_tracker.track.store import get_client, resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    explicit = ctx.get_parameter_source("experiment") != click.core.ParameterSource.DEFAULT
    if uri.startswith(("http://", "https://")):
        urls = _ui_urls(uri, uri.rstrip("/"), experiment, explicit)
        payload = {**urls, "command": None, "note": "the store is already an MLflow server"}
        if as_json:
            _emit_json(payload)
        else:
            click.echo(f"MLflow UI: {urls['open']} (the store is already a server)\n{MODE_HINT}")
        return
    get_client(uri)  # create/migrate the store first, so the server starts on a ready database
    base = f"http://{host}:{port}"
    urls = _ui_urls(uri, base, experiment, explicit)
    command = ui_command(uri, host, port)
    if as_json:
        _emit_json({**urls, "command": command, "tracking_uri": uri})
    else:
        T.print_ui(uri, experiment, urls, MODE_HINT)
    if dry_run:
        return
    if open_browser is None:
        open_browser = sys.stdout.isatty()
    on_ready = None
    if open_browser:
        import webbrowser

        def on_ready() -> None:
            webbrowser.open(urls["open"])

    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    ctx.exit(serve(command, host=host, port=port, env=env, on_ready=on_ready,
                   keep_line=server_line_shown))  # fmt: skip
