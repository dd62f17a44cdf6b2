"""The ``parity-tracker`` command line: each command parses options and calls the library.

Exit codes (design.md, "CLI"; ``parity_tracker.errors``): 0 parity holds / no regression,
1 parity failure or regression, 2 usage or input error, 3 infrastructure error, 130 interrupted.
Errors are turned into output in ONE place, :class:`ParityGroup.invoke` (the pattern of click's
``exceptions.py``: the library raises errors that know their exit code; click shows them).
Every command that prints results takes ``--json`` (one JSON document on stdout; progress and
hints go to stderr).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from parity_tracker.errors import EXIT_OK, EXIT_PARITY_FAILURE, InputError, ParityTrackerError

EXIT_INTERRUPTED = 130
# MLflow draws a tqdm bar per artifact download; the CLI shows its own progress instead.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
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


def _console(err: bool = False) -> Any:
    from rich.console import Console

    # Off a terminal (CI logs, pipes) rich would cut tables to 80 columns: use a wide page
    # unless COLUMNS says otherwise.
    wide = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
    return Console(stderr=err, highlight=False, soft_wrap=True, width=wide)


def _emit_json(payload: Any) -> None:
    click.echo(json.dumps(payload, indent=2, default=str, allow_nan=False))


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


@click.group(cls=ParityGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="parity-tracker")
def cli() -> None:
    """Prove a second implementation of a PyTorch model computes what PyTorch computes."""


# --------------------------------------------------------------------------- targets


@cli.command()
@json_option
def targets(as_json: bool) -> None:
    """List the registered targets and the settings each supports (first value = default)."""
    from parity_tracker.targets import list_targets

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
    from rich.table import Table

    table = Table(title="targets (also: any module.path:function)")
    for col in ("name", "settings (default first)", "description"):
        table.add_column(col, overflow="fold")
    for t in found:
        sets = "\n".join(f"{k}: {', '.join(map(str, v))}" for k, v in t.settings.items())
        table.add_row(t.name, sets or "-", t.description)
    _console().print(table)


# --------------------------------------------------------------------------- run


def _print_run(result: Any, run_id: str | None, uri: str, experiment: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    s = result.summary
    con = _console()
    verdict = "[green]PARITY HOLDS[/]" if result.passed else "[bold red]PARITY FAILS[/]"
    con.print(f"{verdict}  mode={s.get('mode')} ({s.get('mode_reason')})  status={s.get('status')}")
    counts = {k: v for k, v in (s.get("counts") or {}).items() if v}
    con.print("tensors: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    fd = s.get("first_divergence")
    if fd:
        con.print(
            f"first divergence: [bold]{escape(str(fd.get('tag')))}[/] (step {fd.get('step')}, "
            f"{fd.get('status')}, max abs diff {_n(fd.get('max_abs_diff'))})"
            + (f" on rank(s) {', '.join(map(str, fd['ranks']))}" if fd.get("ranks") else "")
        )
    op = s.get("first_divergent_op")
    if op:
        con.print(f"first divergent op: {escape(str(op.get('tag')))} ({op.get('status')}, "
                  f"max abs diff {_n(op.get('max_abs_diff'))})")  # fmt: skip
    for rc in (s.get("root_causes") or [])[:3]:
        con.print(
            f"root cause: op {escape(str(rc.get('op')))} in module {escape(str(rc.get('module')))}"
            f" (step {rc.get('step')}, seed case {rc.get('cause') or '?'})"
        )
    if s.get("error"):
        err = f"{s['error'].get('type')}: {s['error'].get('message')}"
        con.print(f"[red]error[/]: {escape(err)}")
    worst = _worst(result.modules)
    if worst:
        table = Table(title="worst tensors")
        for col in ("tag", "step", "status", "max_abs_diff", "sqnr_db"):
            table.add_column(col)
        for r in worst:
            table.add_row(escape(str(r["tag"])), str(r["step"]), r["status"],
                          _n(r["max_abs_diff"]), _n(r["sqnr_db"]))  # fmt: skip
        con.print(table)
    if run_id:
        con.print(f"logged: run {run_id} in experiment {experiment!r} at {uri}")
        con.print(
            f"open it: parity-tracker ui --tracking-uri {uri}   |   parity-tracker report {run_id}"
        )


def _worst(modules: Any, n: int = 5) -> list[dict[str, Any]]:
    """The ``n`` failing rows with the largest max_abs_diff."""
    import pyarrow as pa
    import pyarrow.compute as pc

    passing = pc.is_in(modules.column("status"), value_set=pa.array(["equal", "close"]))
    failing = modules.filter(pc.invert(passing))
    if failing.num_rows == 0:
        return []
    ordered = failing.sort_by([("max_abs_diff", "descending")]).slice(0, n)
    return ordered.select(["tag", "step", "status", "max_abs_diff", "sqnr_db"]).to_pylist()


@cli.command()
@click.argument("target")
@set_option
@click.option("--quantization", default=None, help="Shortcut for --set quantization=VALUE.")
@click.option("--cache", default=None, help="Shortcut for --set cache=VALUE.")
@click.option(
    "--mode",
    type=click.Choice(["auto", "equal", "allclose"]),
    default="auto",
    show_default=True,
    help="Comparison mode; auto follows the seed's section 2.",
)
@click.option("--rtol", type=float, default=None, help="allclose rtol for every tag.")
@click.option("--atol", type=float, default=None, help="allclose atol for every tag.")
@click.option("--ops", is_flag=True, help="Also capture and compare every aten op output.")
@click.option("--isolate", is_flag=True, help="Re-run failing modules on the reference inputs.")
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
    dump_mode: str,
    tracking_uri: str | None,
    experiment: str,
    commit: str | None,
    as_json: bool,
) -> None:
    """One parity run of TARGET, logged to MLflow; exit 0 when parity holds, 1 when not."""
    from parity_tracker.pipeline import run_target
    from parity_tracker.store import resolve_tracking_uri
    from parity_tracker.targets import parse_assignments

    shortcuts = {"quantization": quantization, "cache": cache}
    settings = {**parse_assignments(sets), **{k: v for k, v in shortcuts.items() if v}}
    if rtol is not None and mode == "equal":
        click.echo("warning: --rtol/--atol have no effect with --mode equal", err=True)
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
        _print_run(result, outcome.run_id, uri, experiment)
    if outcome.error is not None:
        raise outcome.error
    if outcome.interrupted:
        ctx.exit(EXIT_INTERRUPTED)
    ctx.exit(EXIT_OK if result.passed else EXIT_PARITY_FAILURE)


# --------------------------------------------------------------------------- nightly


class _RichReporter:
    """The nightly's progress bar (rich, on stderr)."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=_console(err=True),
            transient=False,
        )
        self.task: Any = None

    def start(self, total: int) -> None:
        self.progress.start()
        self.task = self.progress.add_task("nightly", total=total)

    def cell_started(self, cell: Any) -> None:
        from rich.markup import escape

        self.progress.update(self.task, description=escape(cell.name))

    def cell_done(self, result: Any) -> None:
        from rich.markup import escape

        verdict = "error" if result.error else ("pass" if result.passed else "fail")
        self.progress.console.print(f"{escape(result.cell.name)}: {verdict}")
        self.progress.advance(self.task)

    def stop(self) -> None:
        self.progress.stop()


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
    as_json: bool,
) -> None:
    """Run the matrix, diff every cell against its baseline, print the digest."""
    from parity_tracker.nightly import run_nightly
    from parity_tracker.store import resolve_tracking_uri

    reporter = None if as_json else _RichReporter()
    try:
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
            reporter=reporter,
        )
    finally:
        if reporter is not None:
            reporter.stop()
    uri = resolve_tracking_uri(tracking_uri)
    if as_json:
        _emit_json({**result.to_dict(), "tracking_uri": uri, "digest": result.digest})
    else:
        click.echo(result.digest)
        click.echo(
            f"Browse the runs: parity-tracker ui --tracking-uri {uri}\n"
            f"  (then open the printed URL; digest.md, matrix.html and history.html are on the "
            f"nightly run {result.parent_run_id})"
        )
    if result.spooled:
        click.echo(
            "tracking store unreachable for some cells; spooled to "
            + ", ".join(result.spooled) + "; upload them with `parity-tracker sync`",
            err=True,
        )  # fmt: skip
    ctx.exit(result.exit_code)


# --------------------------------------------------------------------------- diff


def _run_for_commit(
    commit: str,
    target: str | None,
    sets: tuple[str, ...],
    tracking_uri: str | None,
    experiment: str,
) -> str:
    """The newest run of ``commit`` with ``target`` and settings (validated, defaults filled)."""
    from parity_tracker.history import search_runs
    from parity_tracker.targets import parse_assignments, resolve_target

    if target is None:
        raise InputError("--base-commit/--head-commit need --target (and optionally --set)")
    settings = resolve_target(target).validate(parse_assignments(sets))
    query = {"target": resolve_target(target).name, **settings}
    runs = search_runs(
        {**query, "git_commit": commit}, tracking_uri=tracking_uri, experiment=experiment
    )
    if not runs and len(commit) < 40:  # an abbreviated SHA, as git prints it
        runs = [
            r
            for r in search_runs(query, tracking_uri=tracking_uri, experiment=experiment)
            if str(r.commit or "").startswith(commit)
        ]
    if not runs:
        raise InputError(f"no run of {target} {settings} on commit {commit!r} in {experiment!r}")
    return runs[0].run_id


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
    import datetime as dt

    from parity_tracker import diff as D
    from parity_tracker.expected import apply_expected, load_expected
    from parity_tracker.track import load_run

    if base_commit:
        base = _run_for_commit(base_commit, target, sets, tracking_uri, experiment)
    if head_commit:
        head = _run_for_commit(head_commit, target, sets, tracking_uri, experiment)
    if not base or not head:
        raise click.UsageError("give BASE and HEAD run ids, or --base-commit/--head-commit")
    base_run = load_run(base, tracking_uri=tracking_uri)
    head_run = load_run(head, tracking_uri=tracking_uri)
    table = D.diff_tables(base_run.modules, head_run.modules, worse_factor=worse_factor)
    if expected:
        today = dt.datetime.now(dt.timezone.utc).date()
        settings = head_run.settings
        table, _ = apply_expected(
            table,
            load_expected(expected),
            target=str(settings.get("target")),
            settings=settings,
            today=today,
        )
    counts = D.count_changes(table)
    shown = table if show_all else D.interesting(table)
    if as_json or fmt == "json":
        click.echo(
            D.to_json(shown, base=base, head=head)
            if not show_all
            else json.dumps(
                {"counts": counts, "rows": shown.to_pylist(), "base": base, "head": head},
                default=str,
            )
        )
    elif fmt == "markdown":
        click.echo(D.to_markdown(shown))
    else:
        _console().print(D.to_rich(shown, title=f"diff {base} -> {head}"))
        _console().print(", ".join(f"{k} {v}" for k, v in counts.items() if v) or "no rows")
    ctx.exit(EXIT_PARITY_FAILURE if counts.get("regression") else EXIT_OK)


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
    from parity_tracker.history import build_history
    from parity_tracker.targets import parse_assignments, resolve_target

    resolved = resolve_target(target)
    settings = resolved.validate(parse_assignments(sets))
    hist = build_history(
        resolved.name,
        settings,
        tracking_uri=tracking_uri,
        experiment=experiment,
        tag=tag,
        last=last,
    )
    if as_json:
        _emit_json(hist.to_dict())
        return
    from rich.table import Table

    table = Table(title=f"history of {resolved.name} {settings}" + (f" tag {tag}" if tag else ""))
    cols = ["commit", "run", "status", "compared", "failing", "output max abs diff", "sqnr dB"]
    for col in [*cols, *(["tag status"] if tag else [])]:
        table.add_column(col)
    for p in hist.points:
        mark = " <- first bad" if p.commit == hist.first_bad_commit else ""
        cells = [
            str(p.commit)[:12] + mark,
            p.run_id[:12],
            p.status,
            _n(p.tensors_compared),
            _n(p.tensors_failing),
            _n(p.output_max_abs_diff),
            _n(p.output_sqnr_db),
        ]
        table.add_row(*cells, *([str(p.tag_status)] if tag else []))
    con = _console()
    con.print(table)
    con.print(f"first bad commit: {hist.first_bad_commit or 'none (the newest passes)'}")


def _n(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if float(x).is_integer() and abs(x) < 1e12 else f"{x:.3g}"


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
    from dashboards.report import render_run_report
    from parity_tracker.store import parity_home
    from parity_tracker.track import load_run, log_artifact_files

    html = render_run_report(load_run(run_id, tracking_uri=tracking_uri))
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
@tracking_uri_option
@json_option
def sync(tracking_uri: str | None, as_json: bool) -> None:
    """Upload the runs spooled while the tracking store was unreachable (exactly once).

    Without --tracking-uri each run goes to the store it was meant for (recorded when it was
    spooled); --tracking-uri sends them all to that store instead.
    """
    from parity_tracker.track import sync_spool

    done = sync_spool(tracking_uri)
    if as_json:
        _emit_json({"uploaded": done})
        return
    for parity_id, run_id in done.items():
        click.echo(f"uploaded {parity_id} as run {run_id}")
    click.echo(f"{len(done)} spooled run(s) uploaded")


def ui_command(uri: str, host: str, port: int) -> list[str]:
    """The ``mlflow server`` command line serving the store at ``uri``."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]


@cli.command()
@click.option("--port", type=int, default=5000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address (loopback).")
@click.option("--dry-run", is_flag=True, help="Print the URL and command; start nothing.")
@tracking_uri_option
@json_option
@click.pass_context
def ui(
    ctx: click.Context,
    port: int,
    host: str,
    dry_run: bool,
    tracking_uri: str | None,
    as_json: bool,
) -> None:
    """Start the MLflow UI on the configured store (bound to 127.0.0.1) and print its URL."""
    import os
    import subprocess

    from parity_tracker.store import get_client, resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    if uri.startswith(("http://", "https://")):
        payload = {"url": uri, "command": None, "note": "the store is already an MLflow server"}
        if as_json:
            _emit_json(payload)
        else:
            click.echo(f"MLflow UI: {uri} (already a server)")
        return
    get_client(uri)  # create/migrate the store first, so the server starts on a ready database
    url = f"http://{host}:{port}"
    command = ui_command(uri, host, port)
    if as_json:
        _emit_json({"url": url, "command": command, "tracking_uri": uri})
    else:
        click.echo(f"MLflow UI for {uri}\n  open {url}   (Ctrl-C to stop)")
    if dry_run:
        return
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    ctx.exit(subprocess.call(command, env=env))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``parity-tracker``).

    MLflow's HTTP client retries 7 times with exponential backoff by default (minutes of silence
    before an unreachable server is reported); the CLI caps it at 2 retries unless
    ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` is set, so exit 3 and the spool path come in seconds.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    cli.main(args=argv, prog_name="parity-tracker")


if __name__ == "__main__":  # pragma: no cover
    main()
