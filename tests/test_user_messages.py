"""What a new user reads: error text cut at words, one line per warning, headers that add up.

Each expected text is written out by hand from the situation (not from the code's output).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from parity_tracker.errors import brief

MLFLOW_REFUSED = (
    "API request to http://127.0.0.1:9/api/2.0/mlflow/experiments/search failed with exception "
    "HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: "
    '/api/2.0/mlflow/experiments/search (Caused by NewConnectionError("HTTPConnection(host='
    "'127.0.0.1', port=9): Failed to establish a new connection: [Errno 111] Connection "
    'refused"))'
)


# --------------------------------------------------------------------------- error text


def test_brief_never_cuts_a_word_and_keeps_the_reason_at_the_end():
    text = brief(MLFLOW_REFUSED, 300)
    assert len(MLFLOW_REFUSED) > 300 and len(text) <= 300
    assert text.endswith('Connection refused"))')  # the why, at the end of MLflow's text
    words = set(MLFLOW_REFUSED.split())
    assert all(w in words for w in text.split() if w != "…")  # only whole words
    assert text.count(" … ") == 1


def test_brief_keeps_short_text_and_flattens_whitespace():
    assert brief("a  b\n c") == "a b c"
    assert brief("x" * 50, 10) == "x" * 50  # one word longer than the limit: kept whole


def test_spooled_error_quotes_the_cause_by_whole_words(tmp_path):
    from parity_tracker.track.log import SpooledError

    message = str(SpooledError(tmp_path, RuntimeError(MLFLOW_REFUSED)))
    assert "Connection refused" in message
    cause = message.split("(RuntimeError: ", 1)[1].split("); run spooled to", 1)[0]
    assert cause.endswith('Connection refused"))')
    assert all(w in MLFLOW_REFUSED.split() for w in cause.split() if w != "…")


# --------------------------------------------------------------------------- warnings


PROBE = """
import warnings, click
from parity_tracker.cli import cli
from parity_tracker.track import log

@cli.command("probe")
def probe():
    ours = "warnings.warn('nightly files not rendered: boom', RuntimeWarning)"
    exec(compile(ours, log.__file__, "exec"), {"warnings": warnings})
    spool = "warnings.warn('parity run ab12 not logged to http://h:9: spooled to /s/ab12', "
    exec(compile(spool + "RuntimeWarning)", log.__file__, "exec"), {"warnings": warnings})
    warnings.warn_explicit("a library's own", UserWarning, "/elsewhere/lib.py", 7)
    click.echo("done")

cli.main(["probe"], prog_name="parity-tracker")
"""


@pytest.mark.slow
def test_cli_shows_our_warnings_as_one_line_and_drops_the_spool_warning(tmp_path):
    """A real process (pytest records warnings instead of printing them)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    err = done.stderr.splitlines()
    assert "warning: nightly files not rendered: boom" in err
    assert not any("RuntimeWarning" in line or "warnings.warn" in line for line in err)
    assert not any("spooled to" in line for line in err)  # the command's own line says it
    assert "/elsewhere/lib.py:7: UserWarning: a library's own" in err  # others: Python's format
    assert done.stdout == "done\n"


# --------------------------------------------------------------------------- digest header


def _night(shard, missing=(), problems=()):
    from parity_tracker.pipeline.results import NightlyResult

    return NightlyResult("p1", "abc", shard, [], [], "regression", night="N1",
                         missing_shards=list(missing), shard_problems=list(problems))  # fmt: skip


def _header(result) -> str:
    from parity_tracker.dashboards.digest import render_digest

    return render_digest(result).splitlines()[2]


def test_digest_header_counts_the_shards_that_reported():
    assert " · all 2 shards · " in _header(_night((0, 2)))
    incomplete = _header(_night((0, 2), missing=["2/2"]))
    assert " · 1 of 2 planned shards reported · " in incomplete and "all 2" not in incomplete
    # 1/2 and 1/3 reported: 2 runs, 3 missing (2/2, 2/3, 3/3), 5 planned over both splits
    mixed = _night((0, 5), missing=["2/2", "2/3", "3/3"], problems=["shards disagree on N"])
    assert " · 2 of 5 planned shards reported; shards disagree (see Shard problems) · " in (
        _header(mixed)
    )
    assert " · shard 1/2 · " in _header(_night((1, 2)))


# --------------------------------------------------------------------------- budget words


def _budget_line(e_cand, e_twin, floor):
    from parity_tracker.compare.results import format_line

    ratio = e_cand / max(e_twin, floor) if max(e_twin, floor) else math.inf
    comparison = SimpleNamespace(status="close" if ratio <= 2 else "mismatch",
                                 golden_max_abs_err=e_cand, twin_max_abs_err=e_twin,
                                 error_ratio=ratio)  # fmt: skip
    r = SimpleNamespace(n_tensors=2, tag="checker_fc1", step=0, comparison=comparison)
    return format_line(r, "budget")


def test_budget_ratio_names_its_denominator():
    # twin error 1e-3 > floor 1e-4: ratio 0.5 of PyTorch's own error
    assert _budget_line(5e-4, 1e-3, 1e-4) == (
        "TensorChecker: 2 tensors within budget (0.5x PyTorch's own error) in checker_fc1"
    )
    # floor 1e-3 > twin error 1e-5: ratio 0.28 of the floor, not of PyTorch's own error
    assert _budget_line(2.8e-4, 1e-5, 1e-3) == (
        "TensorChecker: 2 tensors within budget (0.28x floor eps·max|golden|, above PyTorch's "
        "own error) in checker_fc1"
    )


def test_report_budget_verdict_names_both_denominators():
    from parity_tracker.dashboards.budget_chart import budget_verdict

    text = budget_verdict({"mode": "budget", "worst_error_ratio": 0.2802, "passed": True,
                           "worst_error_ratio_tag": "checker_model"})  # fmt: skip
    assert "max(PyTorch's own error, floor eps·max|golden|)" in text


# --------------------------------------------------------------------------- no internal refs


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"quantization": "bf16"}, "quantization=bf16 (approximate arithmetic); error budget "
         "against a float64 golden instead of a tolerance"),
        ({"cache": "on"}, "cache=on (some computation is skipped or reused)"),
    ],
)  # fmt: skip
def test_mode_reasons_say_what_they_mean(settings, reason):
    from parity_tracker.run.mode import choose_mode

    assert choose_mode(settings)[1] == reason


def _help(*args: str) -> str:
    from parity_tracker.cli import cli

    return " ".join(CliRunner().invoke(cli, [*args, "--help"], terminal_width=200).stdout.split())


def test_help_texts_cite_no_internal_references_and_say_what_happens():
    from parity_tracker.cli import cli

    for name in cli.commands:
        text = _help(name)
        assert "issue 1" not in text and "§" not in text and "seed's section" not in text, name
    run = _help("run")
    assert "[not|all|not_equal|first_not_equal]" in run and "[default: not_equal]" in run
    repro = _help("repro")
    assert "straight into DIR" in repro and "./.parity/repro/RUN_ID/op-NN" in repro
    sync = _help("sync")
    assert "spooled for" in sync and "default: $MLFLOW_TRACKING_URI, else" in sync


# --------------------------------------------------------------------------- base branch


def test_run_for_branch_takes_the_newest_complete_run_of_that_branch(monkeypatch):
    from parity_tracker.errors import InputError
    from parity_tracker.pipeline import select
    from parity_tracker.track.query import RunStore

    runs = [  # newest first, as RunStore.find returns them
        SimpleNamespace(run_id="pr1", branch="feature", incomplete=False),
        SimpleNamespace(run_id="m3", branch="main", incomplete=True),
        SimpleNamespace(run_id="m2", branch="main", incomplete=False),
        SimpleNamespace(run_id="m1", branch="main", incomplete=False),
    ]
    seen = {}

    def find(self, **settings):
        seen.update(settings)
        return runs

    monkeypatch.setattr(RunStore, "find", find)
    where = {"tracking_uri": "sqlite:////nowhere/m.db", "experiment": "parity"}
    got = select.run_for_branch("main", "no_such_pkg:f", {"quantization": "int8"}, **where)
    assert got == "m2"
    assert seen == {"target": "no_such_pkg:f", "quantization": "int8"}
    with pytest.raises(InputError, match="no baseline yet"):
        select.run_for_branch("release", "no_such_pkg:f", {}, **where)
