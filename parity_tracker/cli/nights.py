"""``parity-tracker nightly-merge`` and the output shared with ``nightly`` (a night's digest)."""

from __future__ import annotations

from typing import Any

import click

from parity_tracker.cli import terminal as T
from parity_tracker.cli.group import _emit_json
from parity_tracker.cli.options import (
    experiment_option,
    fail_on_option,
    json_option,
    tracking_uri_option,
)


def nightly_output(
    ctx: click.Context, result: Any, tracking_uri: str | None, as_json: bool
) -> None:
    """Print a nightly's (or a merged night's) digest or JSON; exit by its exit code."""
    from parity_tracker.track.store import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    if as_json:
        _emit_json({**result.to_dict(), "tracking_uri": uri, "digest": result.digest})
    else:  # stdout is the digest alone (`> digest.md`); where to browse it goes to stderr
        click.echo(result.digest)
        click.echo(T.browse_hint(uri, result.parent_run_id), err=True)
    if result.missing_shards:
        click.echo(
            f"night incomplete: shard {', '.join(result.missing_shards)} never reported (run it, "
            "or `parity-tracker sync` its spool, then merge again)",
            err=True,
        )
    for problem in result.shard_problems:
        click.echo(f"night incomplete: {problem}", err=True)
    if result.spooled:
        click.echo(
            "tracking store unreachable for some cells; spooled to "
            + ", ".join(result.spooled) + "; upload them with `parity-tracker sync`",
            err=True,
        )  # fmt: skip
    ctx.exit(result.exit_code)


@click.command("nightly-merge")
@click.option("--night", required=True, metavar="ID", help="The night id the shards ran with.")
@fail_on_option("What makes the exit code 1 (as nightly).")
@click.option(
    "--expected",
    default=None,
    type=click.Path(exists=True, dir_okay=False),  # a typo is an error, never no entries
    help="Expected-divergence TOML (default: expected.toml beside the shards' matrix).",
)
@tracking_uri_option
@experiment_option
@json_option
@click.pass_context
def nightly_merge(
    ctx: click.Context,
    night: str,
    fail_on: str,
    expected: str | None,
    tracking_uri: str | None,
    experiment: str,
    as_json: bool,
) -> None:
    """Join every shard of one night: one digest, matrix, history and regressions.parquet.

    Reads every cell of the night from the store, picks each cell's baseline from earlier
    nights, and logs the files on one night parent run. Exit codes as nightly.
    """
    from parity_tracker.dashboards.digest import nightly_artifacts
    from parity_tracker.pipeline.night import merge_night
    from parity_tracker.track.query import RunStore

    store = RunStore(tracking_uri, experiment)
    result = merge_night(night, store, fail_on=fail_on, expected=expected, render=nightly_artifacts)
    nightly_output(ctx, result, tracking_uri, as_json)
