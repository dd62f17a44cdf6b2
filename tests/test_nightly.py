"""The nightly's pure parts: matrix expansion, sharding, baseline choice, expected entries,
verdict and digest (no store, no models)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from parity_tracker.analysis.expected import apply_expected, expired_entries, load_expected
from parity_tracker.dashboards.digest import render_digest
from parity_tracker.errors import InputError
from parity_tracker.pipeline.baseline import choose_baseline
from parity_tracker.pipeline.config import load_matrix
from parity_tracker.pipeline.matrix import Cell, parse_shard, shard_cells
from parity_tracker.pipeline.results import (
    CellResult,
    NightlyResult,
    cell_status,
    regressions_table,
)

TINY = "cli_targets:tiny"
REPO = Path(__file__).resolve().parents[1]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_matrix_expands_axes_fills_defaults_and_dedupes(tmp_path):
    cfg = write(
        tmp_path,
        "m.toml",
        f'[[matrix]]\ntarget = "{TINY}"\nperturb = ["none", "fc2"]\n'
        'quantization = ["none", "bf16"]\n'
        f'[[matrix]]\ntarget = "{TINY}"\nquantization = "bf16"\n',  # a duplicate of cell 2
    )
    cells = load_matrix(cfg)
    names = [c.name for c in cells]
    assert names == [
        f"{TINY}[perturb=none,quantization=none]",
        f"{TINY}[perturb=none,quantization=bf16]",
        f"{TINY}[perturb=fc2,quantization=none]",
        f"{TINY}[perturb=fc2,quantization=bf16]",
    ]
    # same settings but ops=true: one name for two cells, a merge could not tell them apart
    cfg.write_text(cfg.read_text() + f'[[matrix]]\ntarget = "{TINY}"\nops = true\n')
    with pytest.raises(InputError, match=r"#3: cell .*perturb=none,quantization=none.* of .*#1"):
        load_matrix(cfg)


def test_matrix_cell_options_tolerance_and_dump_mode(tmp_path):
    cfg = write(
        tmp_path,
        "m.toml",
        f'[[matrix]]\ntarget = "{TINY}"\nrtol = 0.01\natol = 2e-3\ndump_mode = "all"\n'
        f'[[matrix]]\ntarget = "{TINY}"\nquantization = "bf16"\n',
    )
    first, second = load_matrix(cfg)
    assert (first.rtol, first.atol, first.dump_mode) == (0.01, 0.002, "ALL")
    assert (second.rtol, second.atol, second.dump_mode) == (None, None, "FIRST_NOT_EQUAL")


def test_builtin_matrix_has_every_target_and_at_least_14_cells():
    cells = load_matrix(REPO / "pipelines" / "nightly.toml")
    assert len(cells) >= 14
    assert {c.target for c in cells} == {
        "digits-cnn", "vae-tiny", "llama-tiny", "flux-tiny", "silero-vad"
    }  # fmt: skip
    settings = {(c.target, tuple(sorted(dict(c.settings).items()))) for c in cells}
    assert len(settings) == len(cells)  # no duplicate cell


def test_builtin_matrix_chooses_no_tolerance_and_casts_run_in_budget_mode():
    """Issue 15: no rtol/atol in the nightly; every fp16/bf16 cast cell is an error budget."""
    text = (REPO / "pipelines" / "nightly.toml").read_text()
    assert "rtol" not in text and "atol" not in text
    cells = load_matrix(REPO / "pipelines" / "nightly.toml")
    casts = [c for c in cells if dict(c.settings).get("quantization") in ("fp16", "bf16")]
    assert len(casts) == 5 and all(c.mode == "budget" for c in casts)
    assert all(c.rtol is None and c.atol is None for c in cells)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[[matrix]]\ntarget = "x"\nfoo = [\n', "m.toml:3"),
        ('[[matrix]]\nperturb = "none"\n', "needs target"),
        (
            f'[[matrix]]\ntarget = "{TINY}"\nmode = "fuzzy"\n',
            "allowed: auto, equal, allclose, budget",
        ),
        (f'[[matrix]]\ntarget = "{TINY}"\nmode = "budget"\nrtol = 1\natol = 1\n', "no rtol/atol"),
        (f'[[matrix]]\ntarget = "{TINY}"\nperturb = []\n', "non-empty list"),
        (f'[[matrix]]\ntarget = "{TINY}"\n[[matrix]]\ntarget = "{TINY}"\nx = "1"\n', "#2"),
        (f'[[matrix]]\ntarget = "{TINY}"\nrtol = 0.01\n', "rtol without atol"),
        (f'[[matrix]]\ntarget = "{TINY}"\nrtol = "a"\natol = 1\n', "must be numbers"),
        (f'[[matrix]]\ntarget = "{TINY}"\ndump_mode = "some"\n', "allowed: NOT, ALL"),
    ],
)
def test_matrix_errors_name_file_and_entry(tmp_path, text, needle):
    with pytest.raises(InputError, match=needle.replace("[", r"\[")):
        load_matrix(write(tmp_path, "m.toml", text))


def test_shards_are_disjoint_deterministic_and_complete():
    cells = [Cell("t", (("i", str(i)),)) for i in range(16)]
    shards = [shard_cells(cells, i, 3) for i in (1, 2, 3)]
    assert [len(s) for s in shards] == [6, 5, 5]
    assert sorted(c.name for s in shards for c in s) == sorted(c.name for c in cells)
    assert shards[1] == [cells[k] for k in (1, 4, 7, 10, 13)]
    assert shard_cells(cells, 1, 1) == cells
    assert parse_shard("2/3") == (2, 3) and parse_shard(None) == (1, 1)
    for bad in ("0/2", "3/2", "a/b", "1"):
        with pytest.raises(InputError, match="--shard"):
            parse_shard(bad)


@dataclass
class R:
    run_id: str
    commit: str
    branch: str | None
    start_time: int
    status: str = "FINISHED"


def test_choose_baseline_rules():
    head = R("h", "c9", "feature", 100)
    runs = [  # newest first, as the search returns them
        head,
        R("same", "c9", "feature", 90),
        R("feat", "c8", "feature", 80),
        R("failed", "c7", "main", 75, "FAILED"),
        R("main", "c6", "main", 70),
        R("old", "c5", "main", 60),
    ]
    # other commit, finished, main preferred (newest main: c6)
    assert choose_baseline(runs, head_run_id="h", head_commit="c9").run_id == "main"
    # no main run: newest other commit
    nomain = [r for r in runs if r.branch != "main"]
    assert choose_baseline(nomain, head_run_id="h", head_commit="c9").run_id == "feat"
    # only runs of the same commit (a re-run): the newest earlier one
    assert choose_baseline(runs[:2], head_run_id="h", head_commit="c9").run_id == "same"
    assert choose_baseline([head], head_run_id="h", head_commit="c9") is None
    # a later run never becomes the baseline
    later = [R("later", "c1", "main", 200), head]
    assert choose_baseline(later, head_run_id="h", head_commit="c9") is None


def _diff(rows):
    cols = ("tag", "change", "head_status", "base_status")
    return pa.table({c: pa.array([r.get(c) for r in rows], pa.string()) for c in cols})


def test_expected_entries_apply_to_failing_matching_rows_only(tmp_path):
    path = write(
        tmp_path,
        "expected.toml",
        '[[expected]]\ntarget = "llama-tiny"\nsettings = { quantization = "bf16" }\n'
        'tag = "checker_model.layers.*"\nreason = "bf16 rounding"\nuntil = 2030-01-01\n'
        '[[expected]]\ntarget = "llama-tiny"\ntag = "*"\nreason = "old"\nuntil = 2020-01-01\n',
    )
    entries = load_expected(path)
    today = dt.date(2026, 11, 29)
    assert [e.source for e in expired_entries(entries, today)] == [f"{path}#2"]
    diff = _diff(
        [
            {"tag": "checker_model.layers.0", "change": "regression", "head_status": "mismatch"},
            {"tag": "checker_model.layers.1", "change": "unchanged", "head_status": "equal"},
            {"tag": "checker_model.norm", "change": "regression", "head_status": "mismatch"},
            {"tag": "checker_model.layers.2", "change": "removed", "head_status": None},
            {"tag": "checker_model.layers.3", "change": "unchanged", "head_status": "skipped"},
        ]
    )
    out, used = apply_expected(
        diff, entries, target="llama-tiny", settings={"quantization": "bf16"}, today=today
    )
    assert out.column("change").to_pylist() == [
        "expected", "unchanged", "regression", "removed", "unchanged"
    ]  # fmt: skip
    assert [e.reason for e in used] == ["bf16 rounding"]
    other, used = apply_expected(
        diff, entries, target="llama-tiny", settings={"quantization": "none"}, today=today
    )
    assert other.column("change").to_pylist() == diff.column("change").to_pylist() and not used


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[[expected]]\ntarget = "x"\n', "tag: missing key"),
        ('[[expected]]\ntarget="x"\ntag="*"\nreason="r"\nuntil="soon"\n', "not a date"),
        ('[[expected]]\ntarget="x"\ntag="*"\nreason="r"\nuntil=2030-01-01\nwho="me"\n', "who"),
        ("expected = [\n", "expected.toml:1"),
    ],
)
def test_expected_file_errors(tmp_path, text, needle):
    with pytest.raises(InputError, match=needle):
        load_expected(write(tmp_path, "expected.toml", text))


def test_missing_expected_file_is_empty(tmp_path):
    assert load_expected(tmp_path / "absent.toml") == [] and load_expected(None) == []


def test_builtin_expected_entries_name_real_targets_and_settings():
    import datetime as dt

    from parity_tracker.pipeline.targets import resolve_target

    entries = load_expected(REPO / "pipelines" / "expected.toml")
    assert {e.target for e in entries} == {"digits-cnn", "llama-tiny", "flux-tiny"}
    for e in entries:
        allowed = resolve_target(e.target).settings
        assert all(v in allowed[k] for k, v in e.settings.items()), e.source
        assert e.reason and e.until > dt.date(2026, 11, 29)


def _result(cells, fail_on="regression", expired=()):
    return NightlyResult("p1", "abc", (1, 1), cells, list(expired), fail_on)


def test_verdict_by_fail_on():
    ok = CellResult(Cell("t", ()), run_id="r1", passed=True, changes={"regression": 0})
    failing = CellResult(Cell("u", ()), run_id="r2", passed=False, unexpected_failing=3,
                         changes={"regression": 0})  # fmt: skip
    regressed = CellResult(Cell("v", ()), run_id="r3", changes={"regression": 2})
    broken = CellResult(Cell("w", ()), error="RuntimeError: boom")
    assert _result([ok, failing]).exit_code == 0
    assert _result([ok, failing], "mismatch").exit_code == 1
    assert _result([ok, regressed]).exit_code == 1
    assert _result([ok, regressed], "never").exit_code == 0
    assert _result([ok, broken]).exit_code == 1
    assert _result([ok], expired=["e"]).exit_code == 1
    spooled = CellResult(Cell("x", ()), error="not logged", spool_path="/s/1")
    assert _result([ok, spooled], "never").exit_code == 3
    assert _result([ok, spooled]).spooled == ["/s/1"]
    assert [cell_status(c) for c in (ok, failing, regressed, broken)] == [
        "pass", "fail", "regression", "error"
    ]  # fmt: skip


def test_digest_and_regressions_table():
    diff = pa.table(
        {
            "tag": ["checker_fc2", "checker_fc1"],
            "step": pa.array([0, 0], pa.int32()),
            "change": ["regression", "unchanged"],
            "base_status": ["equal", "equal"],
            "head_status": ["mismatch", "equal"],
            "base_max_abs_diff": [0.0, 0.0],
            "head_max_abs_diff": [0.25, 0.0],
        }
    )
    cell = CellResult(Cell("toy", (("q", "none"),)), run_id="r1", baseline_run_id="r0",
                      changes={"regression": 1}, diff=diff, tensors_failing=1)  # fmt: skip
    res = _result([cell])
    digest = render_digest(res)
    assert digest.startswith("# Parity nightly — FAIL")
    assert "| toy[q=none] | checker_fc2 | 0 | equal → mismatch | 0 → 0.25 |" in digest
    table = regressions_table([cell])
    assert table.num_rows == 1
    row = table.to_pylist()[0]
    assert row["tag"] == "checker_fc2" and row["baseline_run_id"] == "r0"
    assert row["settings"] == '{"q": "none"}'
    assert regressions_table([]).num_rows == 0
