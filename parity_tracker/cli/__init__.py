"""The ``parity-tracker`` command line: each command parses options and calls the library.

Exit codes (design.md, "CLI"; ``parity_tracker.errors``): 0 parity holds / no regression,
1 parity failure or regression, 2 usage or input error, 3 infrastructure error, 130 interrupted.
Errors are turned into output in ONE place, :class:`ParityGroup.invoke` (the pattern of click's
``exceptions.py``: the library raises errors that know their exit code; click shows them).
Every command that prints results takes ``--json`` (one JSON document on stdout; progress and
hints go to stderr).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from parity_tracker.cli import terminal as T
from parity_tracker.cli.options import allow_no_commit_option, night_option, store_retry_option
from parity_tracker.cli.serve import ui_command
from parity_tracker.errors import EXIT_INFRA, EXIT_OK, EXIT_PARITY_FAILURE, ParityTrackerError
from parity_tracker.files import jsonio
from parity_tracker.statuses import BUDGET, RUN_MODES

EXIT_INTERRUPTED = 130
DEFAULT_CONFIG = "pipelines/nightly.toml"


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
            raise ParityError(exc) from exc
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug or an unforeseen fault: never exit 1 (a parity verdict)
            if os.environ.get("PARITY_TRACKER_DEBUG"):
                raise
            click.echo(
                f"Error: internal error: {type(exc).__name__}: {str(exc)[:500]} "
                "(set PARITY_TRACKER_DEBUG=1 for the traceback)",
                err=True,
            )
            ctx.exit(EXIT_INFRA)


def _emit_json(payload: Any) -> None:
    click.echo(jsonio.dumps(payload, indent=2, default=str))


tracking_uri_option = click.option(
    "--tracking-uri",
    default=None,
    help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///./.parity/mlflow.db).",
)
experiment_option = click.option(
    "--experiment", default="parity", show_default=True, help="MLflow experiment name."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
set_option = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="A target setting (repeatable); see `parity-tracker targets`.",
)


def report_files(result: Any) -> dict[str, str]:
    """The files a logged run gets beside its tables: ``report.html`` (``dashboards.report``)."""
    from parity_tracker.dashboards.report import render_run_report

    return {"report.html": render_run_report(result)}


@click.group(cls=ParityGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="parity-tracker")
@store_retry_option
def cli(store_retry_s: float | None) -> None:
    """Prove a second implementation of a PyTorch model computes what PyTorch computes."""
    if store_retry_s is not None:  # read by track.store.retry_window_s
        os.environ["PARITY_TRACKER_STORE_RETRY_S"] = str(store_retry_s)


def _run_url(uri: str, experiment: str, run_id: str | None) -> str | None:
    """The run's page when the store is an MLflow server (``RunStore.run_url``), else None."""
    from parity_tracker.track.query import RunStore

    try:
        return RunStore(uri, experiment).run_url(run_id)
    except ParityTrackerError:
        return None  # a link is a convenience: an unreachable store must not fail the command


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
    help="Comparison mode; auto follows the seed's section 2, with budget (error against a "
    "float64 golden, at most k=2x PyTorch's own at the candidate's precision) for casts and "
    "other implementations.",
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
    type=click.Choice(["NOT", "ALL", "NOT_EQUAL", "FIRST_NOT_EQUAL"], case_sensitive=False),
    default="NOT_EQUAL",
    show_default=True,
    help="Which tensors to dump as .npy artifacts.",
)
@tracking_uri_option
@experiment_option
@click.option("--commit", default=None, help="Commit to record (default: read with git).")
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
    outcome = run_target(
        target,
        settings,
        mode=mode,
        rtol=rtol,
        atol=atol,
        capture_ops=ops,
        isolate=isolate,
        dump_mode=dump_mode,
        tracking_uri=tracking_uri,
        experiment=experiment,
        commit=commit,
        render=report_files,
        source=SOURCE_RUN,
        keep_repro=int(keep_repro * (1 << 20)),
    )
    uri = resolve_tracking_uri(tracking_uri)
    result = outcome.result
    if as_json:
        _emit_json(
            {
                "run_id": outcome.run_id,
                "tracking_uri": uri,
                "passed": result.passed,
                "interrupted": outcome.interrupted,
                "summary": result.summary,
            }
        )
    else:
        T.print_run(
            result, outcome.run_id, uri, experiment, _run_url(uri, experiment, outcome.run_id)
        )
    if outcome.error is not None:
        raise outcome.error
    if outcome.interrupted:
        ctx.exit(EXIT_INTERRUPTED)
    ctx.exit(EXIT_OK if result.passed else EXIT_PARITY_FAILURE)


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
@click.option(
    "--fail-on",
    type=click.Choice(["regression", "mismatch", "never"]),
    default="regression",
    show_default=True,
    help="What makes the exit code 1.",
)
@click.option(
    "--expected",
    default=None,
    type=click.Path(),
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
        click.echo(result.digest)
        url = _run_url(uri, experiment, result.parent_run_id)
        click.echo(
            (f"The nightly run: {url}\n" if url else "") + T.browse_hint(uri, result.parent_run_id)
        )
    if result.spooled:
        click.echo(
            "tracking store unreachable for some cells; spooled to "
            + ", ".join(result.spooled) + "; upload them with `parity-tracker sync`",
            err=True,
        )  # fmt: skip
    ctx.exit(result.exit_code)


# --------------------------------------------------------------------------- diff


@cli.command()
@click.argument("base", required=False)
@click.argument("head", required=False)
@click.option("--base-commit", default=None, help="Instead of BASE: newest run of this commit.")
@click.option("--head-commit", default=None, help="Instead of HEAD: newest run of this commit.")
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
    type=click.Path(),
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
    --head-commit, --target and --set.
    """
    from parity_tracker.analysis import render as R
    from parity_tracker.analysis.diff import diff_runs
    from parity_tracker.analysis.expected import load_expected
    from parity_tracker.pipeline.select import run_for_commit
    from parity_tracker.pipeline.targets import parse_assignments
    from parity_tracker.track.query import RunStore

    where = {"tracking_uri": tracking_uri, "experiment": experiment}
    if base_commit:
        base = run_for_commit(base_commit, target, parse_assignments(sets), **where)
    if head_commit:
        head = run_for_commit(head_commit, target, parse_assignments(sets), **where)
    if not base or not head:
        raise click.UsageError("give BASE and HEAD run ids, or --base-commit/--head-commit")
    result = diff_runs(
        base,
        head,
        expected=load_expected(expected) if expected else (),
        worse_factor=worse_factor,
        store=RunStore(tracking_uri, experiment),
    )
    shown = result.rows(include_unchanged=show_all)
    if as_json or fmt == "json":
        click.echo(
            R.to_json(shown, base=base, head=head)
            if not show_all
            else jsonio.dumps(
                {"counts": result.counts, "rows": shown.to_pylist(), "base": base, "head": head},
                default=str,
            )
        )
    elif fmt == "markdown":
        click.echo(R.to_markdown(shown))
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
    name, settings, heads = history_selection(target, parse_assignments(sets), store)
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
    T.print_history(hist, f"history of {name} {settings}", tag)


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
@click.option("--out", type=click.Path(), default=None, help="Folder (default ./.parity/repro/).")
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


@cli.command()
@tracking_uri_option
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
    ctx.exit(serve(command, host=host, port=port, env=env, on_ready=on_ready))


from parity_tracker.cli.nights import nightly_merge  # noqa: E402  (uses the options above)

cli.add_command(nightly_merge)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``parity-tracker``).

    MLflow's HTTP client retries 7 times with exponential backoff by default (minutes of silence
    before an unreachable server is reported); the CLI caps it at 2 retries unless
    ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` is set, so exit 3 and the spool path come in seconds.
    The environment is set here, not at import, so importing the module changes nothing.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # MLflow draws a tqdm bar per artifact download; the CLI shows its own progress instead.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    cli.main(args=argv, prog_name="parity-tracker")
