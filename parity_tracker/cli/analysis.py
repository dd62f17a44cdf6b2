"""``parity-tracker diff``, ``history``, ``report`` and ``repro``: reading stored runs."""

from __future__ import annotations

from pathlib import Path

import click

from parity_tracker.cli import terminal as T
from parity_tracker.cli.group import _emit_json, cli
from parity_tracker.cli.options import (
    experiment_option,
    json_option,
    set_option,
    tracking_uri_option,
)
from parity_tracker.errors import EXIT_OK, EXIT_PARITY_FAILURE
from parity_tracker.files import jsonio

# --------------------------------------------------------------------------- diff


@cli.command()
@click.argument("base", required=False)
@click.argument("head", required=False)
@click.option("--base-commit", default=None, help="Instead of BASE: newest run of this commit.")
@click.option("--head-commit", default=None, help="Instead of HEAD: newest run of this commit.")
@click.option(
    "--base-branch",
    default=None,
    help="Instead of BASE: newest complete run recorded on this branch (e.g. main's nightly).",
)
@click.option("--target", default=None, help="Target selector for --base/--head-commit.")
@set_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "markdown"]),
    default="table",
    show_default=True,
)
@click.option(
    "--worse-factor",
    type=float,
    default=2.0,
    show_default=True,
    help="max_abs_diff growth that counts as worse.",
)
@click.option(
    "--expected",
    default=None,
    type=click.Path(exists=True, dir_okay=False),  # a typo is an error, never no entries
    help="Expected-divergence TOML: matching failures show as expected.",
)
@click.option("--all", "show_all", is_flag=True, help="Also list unchanged tags.")
@tracking_uri_option
@experiment_option
@json_option
@click.pass_context
def diff(
    ctx: click.Context,
    base: str | None,
    head: str | None,
    base_commit: str | None,
    head_commit: str | None,
    base_branch: str | None,
    target: str | None,
    sets: tuple[str, ...],
    fmt: str,
    worse_factor: float,
    expected: str | None,
    show_all: bool,
    tracking_uri: str | None,
    experiment: str,
    as_json: bool,
) -> None:
    """Diff two runs tag by tag; exit 1 on a regression.

    BASE and HEAD are MLflow run ids; or select the newest run of a commit with --base-commit /
    --head-commit (or of a branch with --base-branch), --target and --set.
    """
    from parity_tracker.analysis import render as R
    from parity_tracker.analysis.diff import diff_runs
    from parity_tracker.analysis.expected import load_expected
    from parity_tracker.pipeline.select import run_for_branch, run_for_commit
    from parity_tracker.pipeline.targets import parse_assignments
    from parity_tracker.track.query import RunStore

    where = {"tracking_uri": tracking_uri, "experiment": experiment}
    if base_branch:
        base = run_for_branch(base_branch, target, parse_assignments(sets), **where)
    if base_commit:
        base = run_for_commit(base_commit, target, parse_assignments(sets), **where)
    if head_commit:
        head = run_for_commit(head_commit, target, parse_assignments(sets), **where)
    if not base or not head:
        raise click.UsageError(
            "give BASE and HEAD run ids, or --base-commit/--base-branch and --head-commit"
        )
    result = diff_runs(
        base,
        head,
        expected=load_expected(expected) if expected else (),
        worse_factor=worse_factor,
        store=RunStore(tracking_uri, experiment),
    )
    shown = result.rows(include_unchanged=show_all)
    base, head = result.base_id or base, result.head_id or head  # full ids, not the prefixes
    differs = list(result.config_differences)
    if differs:  # exit codes unchanged: the warning is information, not a verdict
        click.echo(f"warning: {R.config_warning(differs)}", err=True)
    if as_json or fmt == "json":
        click.echo(  # counts from the whole table: unchanged rows counted, not shown
            R.to_json(result.table, base=base, head=head, config_differences=differs)
            if not show_all
            else jsonio.dumps(
                {
                    "counts": result.counts,
                    "rows": shown.to_pylist(),
                    "base": base,
                    "head": head,
                    "config_differences": differs,
                },
                default=str,
            )
        )
    elif fmt == "markdown":
        click.echo(R.to_markdown(result.table, differences=differs))
    else:
        T.console().print(R.to_rich(shown, title=f"diff {base} -> {head}"))
        T.console().print(", ".join(f"{k} {v}" for k, v in result.counts.items() if v) or "no rows")
    ctx.exit(EXIT_PARITY_FAILURE if result.regressions else EXIT_OK)


# --------------------------------------------------------------------------- history


@cli.command()
@click.argument("target")
@set_option
@click.option("--tag", default=None, help="Also show this tag's status per commit.")
@click.option("--last", type=click.IntRange(min=1), default=None, help="Only the newest N commits.")
@tracking_uri_option
@experiment_option
@json_option
def history(
    target: str,
    sets: tuple[str, ...],
    tag: str | None,
    last: int | None,
    tracking_uri: str | None,
    experiment: str,
    as_json: bool,
) -> None:
    """Per commit: counts and output error of TARGET's configuration.

    With --tag: the tag's status per commit and the first bad commit (the first commit of the
    current failing streak).
    """
    from parity_tracker.analysis.history import build_history
    from parity_tracker.pipeline.select import history_selection
    from parity_tracker.pipeline.targets import parse_assignments
    from parity_tracker.track.query import RunStore

    store = RunStore(tracking_uri, experiment)
    name, settings, heads = history_selection(
        target, parse_assignments(sets), store, note=lambda text: click.echo(text, err=True)
    )
    hist = build_history(name, settings, tag=tag, last=last, store=store, heads=heads)
    if hist.skipped:
        click.echo(
            f"skipped {len(hist.skipped)} incomplete run(s) (writer stopped during the upload; "
            f"`parity-tracker sync` finishes or marks them): {', '.join(hist.skipped[:5])}",
            err=True,
        )
    if as_json:
        _emit_json(hist.to_dict())
        return
    followed = f" (mode {hist.mode})" if hist.mode and "mode" not in settings else ""
    T.print_history(hist, f"history of {name} {settings}{followed}", tag)


# --------------------------------------------------------------------------- report, sync, ui


@cli.command()
@click.argument("run_id")
@click.option(
    "--output",
    "-o",
    type=click.Path(),
    default=None,
    help="Where to write report.html (default ./.parity/reports/RUN/report.html).",
)
@click.option("--upload", is_flag=True, help="Also replace report.html in the run's artifacts.")
@tracking_uri_option
@json_option
def report(
    run_id: str, output: str | None, upload: bool, tracking_uri: str | None, as_json: bool
) -> None:
    """Rebuild the HTML report of RUN_ID from its stored tables."""
    from parity_tracker.dashboards.report import render_run_report
    from parity_tracker.track import log_artifact_files
    from parity_tracker.track.query import RunStore
    from parity_tracker.track.store import parity_home

    store = RunStore(tracking_uri)
    run_id = store.resolve_run_id(run_id)  # a unique prefix is enough
    html = render_run_report(store.load(run_id))
    path = Path(output) if output else parity_home() / "reports" / run_id / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    if upload:
        log_artifact_files(run_id, {"report.html": path}, tracking_uri=tracking_uri)
    if as_json:
        _emit_json({"run_id": run_id, "path": str(path.resolve()), "uploaded": upload})
    else:
        click.echo(f"report written to {path.resolve()}" + (" and uploaded" if upload else ""))


@cli.command()
@click.argument("run_id")
@click.option("--tag", default=None, help="An op or module tag (default: the first root cause).")
@click.option(
    "--out",
    type=click.Path(),
    default=None,
    metavar="DIR",
    help="Write the reproducer's files straight into DIR (created; files of the same names "
    "replaced) [default: ./.parity/repro/RUN_ID/op-NN, or .../module for a module tag].",
)
@click.option("--upload", is_flag=True, help="Also log the folder under the run's repro/.")
@tracking_uri_option
@json_option
def repro(
    run_id: str, tag: str | None, out: str | None, upload: bool, tracking_uri: str | None,
    as_json: bool,
) -> None:  # fmt: skip
    """Write a standalone failing test (op or module) for RUN_ID's divergence."""
    from parity_tracker.repro import reproduce_run
    from parity_tracker.track.query import RunStore

    run_id = RunStore(tracking_uri).resolve_run_id(run_id)  # a unique prefix is enough
    rep = reproduce_run(run_id, tag=tag, out=out, upload=upload, tracking_uri=tracking_uri)
    if as_json:
        _emit_json({"run_id": run_id, "path": str(rep.path.resolve()), "item": rep.item,
                    "artifact": rep.artifact})  # fmt: skip
    else:
        click.echo(f"reproducer of {rep.item['tag']} written to {rep.path.resolve()}"
                   + (f" and uploaded as {rep.artifact}" if rep.artifact else ""))  # fmt: skip
        click.echo(f"run it: cd {rep.path.resolve()} && pytest -q")
