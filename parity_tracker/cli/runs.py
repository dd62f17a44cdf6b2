"""``parity-tracker targets``, ``run`` and ``nightly``: the commands that run parity."""

from __future__ import annotations

from typing import Any

import click

from parity_tracker.cli import terminal as T
from parity_tracker.cli.group import (
    EXIT_INTERRUPTED,
    _emit_json,
    _run_url,
    cli,
    report_files,
    stdout_to_stderr,
)
from parity_tracker.cli.options import (
    allow_no_commit_option,
    experiment_option,
    fail_on_option,
    json_option,
    night_option,
    set_option,
    tracking_uri_option,
)
from parity_tracker.errors import EXIT_OK, EXIT_PARITY_FAILURE
from parity_tracker.statuses import BUDGET, RUN_MODES

DEFAULT_CONFIG = "pipelines/nightly.toml"


# --------------------------------------------------------------------------- targets


@cli.command()
@json_option
def targets(as_json: bool) -> None:
    """List the registered targets and the settings each supports (first value = default)."""
    from parity_tracker.pipeline.targets import list_targets

    found = list_targets()
    if as_json:
        _emit_json(
            [
                {
                    "name": t.name,
                    "source": t.source,
                    "description": t.description,
                    "settings": {k: list(v) for k, v in t.settings.items()},
                }
                for t in found
            ]
        )
        return
    T.print_targets(found)


# --------------------------------------------------------------------------- run


@cli.command()
@click.argument("target")
@set_option
@click.option("--quantization", default=None, help="Shortcut for --set quantization=VALUE.")
@click.option("--cache", default=None, help="Shortcut for --set cache=VALUE.")
@click.option(
    "--mode",
    type=click.Choice(["auto", *RUN_MODES]),
    default="auto",
    show_default=True,
    help="Comparison mode; auto: equal when both sides run the same kernels on the same values; "
    "budget (error against a float64 golden, at most k=2x PyTorch's own at the candidate's "
    "precision) for casts and other implementations; allclose for caches, random ops, sharding "
    "and integer quantization without a twin.",
)
@click.option("--rtol", type=float, default=None, help="allclose rtol for every tag.")
@click.option("--atol", type=float, default=None, help="allclose atol for every tag.")
@click.option("--ops", is_flag=True, help="Also capture and compare every aten op output.")
@click.option("--isolate", is_flag=True, help="Re-run failing modules on the reference inputs.")
@click.option(
    "--keep-repro",
    type=click.FloatRange(min=0),
    default=64,
    show_default=True,
    metavar="MIB",
    help="Keep what `parity-tracker repro` needs, up to MIB per reproducer (0: nothing).",
)
@click.option(
    "--dump-mode",
    type=click.Choice(["not", "all", "not_equal", "first_not_equal"], case_sensitive=False),
    default="not_equal",
    show_default=True,
    help="Which tensors to dump as .npy artifacts.",
)
@tracking_uri_option
@experiment_option
@click.option("--commit", default=None, help="Commit to record (default: read with git).")
@click.option("--branch", default=None, help="Branch to record (default: read with git).")
@json_option
@click.pass_context
def run(
    ctx: click.Context,
    target: str,
    sets: tuple[str, ...],
    quantization: str | None,
    cache: str | None,
    mode: str,
    rtol: float | None,
    atol: float | None,
    ops: bool,
    isolate: bool,
    keep_repro: float,
    dump_mode: str,
    tracking_uri: str | None,
    experiment: str,
    commit: str | None,
    branch: str | None,
    as_json: bool,
) -> None:
    """One parity run of TARGET, logged to MLflow; exit 0 when parity holds, 1 when not."""
    from parity_tracker.pipeline.run_target import run_target
    from parity_tracker.pipeline.targets import parse_assignments
    from parity_tracker.track.browse import SOURCE_RUN
    from parity_tracker.track.store import resolve_tracking_uri

    shortcuts = {"quantization": quantization, "cache": cache}
    settings = {**parse_assignments(sets), **{k: v for k, v in shortcuts.items() if v}}
    if rtol is not None and mode in ("equal", BUDGET):
        click.echo(f"warning: --rtol/--atol have no effect with --mode {mode}", err=True)
    with stdout_to_stderr(as_json):  # the target's own prints stay off the JSON
        outcome = run_target(
            target, settings, mode=mode, rtol=rtol, atol=atol, capture_ops=ops,
            isolate=isolate, dump_mode=dump_mode, tracking_uri=tracking_uri,
            experiment=experiment, commit=commit, branch=branch, render=report_files,
            source=SOURCE_RUN, keep_repro=int(keep_repro * (1 << 20)),
        )  # fmt: skip
    uri = resolve_tracking_uri(tracking_uri)
    result = outcome.result
    if commit is None:
        _warn_no_commit(result, outcome.run_id)
    if as_json:
        _emit_json(
            {
                "run_id": outcome.run_id,
                "tracking_uri": uri,
                "passed": result.passed,
                "interrupted": outcome.interrupted,
                "dumps": outcome.dumps,
                "summary": result.summary,
            }
        )
    else:
        T.print_run(
            result, outcome.run_id, uri, experiment, _run_url(uri, experiment, outcome.run_id)
        )
        if outcome.dumps:
            click.echo(outcome.dumps)
    if outcome.error is not None:
        raise outcome.error
    if outcome.interrupted:
        ctx.exit(EXIT_INTERRUPTED)
    ctx.exit(EXIT_OK if result.passed else EXIT_PARITY_FAILURE)


def _warn_no_commit(result: Any, run_id: str | None) -> None:
    """Warn (stderr) when a stored run records no commit: history and diff cannot place it.

    ``nightly`` refuses such a night (``--allow-no-commit``); a single ``run`` is often a local
    try, so it only warns, naming the fix.
    """
    if run_id is None or result.record.environment.get("git_commit"):
        return
    click.echo(
        f"warning: run {run_id} records no commit (not a git checkout, or git missing); "
        "history, diff --base-commit and bisect cannot place it: pass --commit SHA",
        err=True,
    )


# --------------------------------------------------------------------------- nightly


@cli.command()
@click.option(
    "--config",
    default=DEFAULT_CONFIG,
    show_default=True,
    type=click.Path(),
    help="The matrix TOML (targets x settings).",
)
@click.option("--shard", default=None, metavar="I/N", help="Run only shard I of N (1-based).")
@click.option(
    "--baseline",
    default="auto",
    show_default=True,
    metavar="auto|RUN_ID",
    help="auto: newest earlier run of each cell's configuration on another commit "
    "(branch main preferred); or a nightly parent run id.",
)
@fail_on_option("What makes the exit code 1.")
@click.option(
    "--expected",
    default=None,
    type=click.Path(exists=True, dir_okay=False),  # a typo is an error, never no entries
    help="Expected-divergence TOML (default: expected.toml beside --config).",
)
@tracking_uri_option
@experiment_option
@click.option("--commit", default=None, help="Commit to record (default: read with git).")
@click.option("--branch", default=None, help="Branch to record (default: read with git).")
@night_option
@allow_no_commit_option
@click.option(
    "--max-cells",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Refuse a matrix that expands to more cells (counted before expansion).",
)
@json_option
@click.pass_context
def nightly(
    ctx: click.Context,
    config: str,
    shard: str | None,
    baseline: str,
    fail_on: str,
    expected: str | None,
    tracking_uri: str | None,
    experiment: str,
    commit: str | None,
    branch: str | None,
    night: str | None,
    allow_no_commit: bool,
    max_cells: int,
    as_json: bool,
) -> None:
    """Run the matrix (or a --shard of it), diff each cell against its baseline, print the digest.

    Shards of one night share --night; join them with `parity-tracker nightly-merge --night ID`.
    """
    from parity_tracker.dashboards.digest import nightly_artifacts
    from parity_tracker.pipeline.nightly import run_nightly

    with stdout_to_stderr(as_json):  # the targets' own prints stay off the JSON
        result = run_nightly(
            config,
            shard=shard,
            baseline=baseline,
            fail_on=fail_on,
            expected=expected,
            tracking_uri=tracking_uri,
            experiment=experiment,
            commit=commit,
            branch=branch,
            reporter=None if as_json else T.RichReporter(),
            render=nightly_artifacts,
            render_run=report_files,
            night=night,
            allow_no_commit=allow_no_commit,
            max_cells=max_cells,
        )
    from parity_tracker.track.store import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    if as_json:
        _emit_json({**result.to_dict(), "tracking_uri": uri, "digest": result.digest})
    else:
        click.echo(result.digest)  # stdout is the digest alone; where to browse it: stderr
        url = _run_url(uri, experiment, result.parent_run_id)
        click.echo(
            (f"The nightly run: {url}\n" if url else "") + T.browse_hint(uri, result.parent_run_id),
            err=True,
        )
    if result.spooled:
        click.echo(
            "tracking store unreachable for some cells; spooled to "
            + ", ".join(result.spooled) + "; upload them with `parity-tracker sync`",
            err=True,
        )  # fmt: skip
    ctx.exit(result.exit_code)
