"""The benchmark harness's own logic (not its figures: those are never timed tests)."""

from __future__ import annotations

import json
import time

import pyarrow.compute as pc
import pytest

from benchmarks import __main__ as bench_main
from benchmarks import bench_throughput, synthetic
from benchmarks._common import Contender, Row, alternate, find, judged, paired_ratio


def test_paired_ratio_is_median_of_per_repeat_ratios():
    times = {"run": [2.0, 4.0, 6.0], "plain": [1.0, 1.0, 3.0]}
    # per repeat: 2, 4, 2 -> median 2 (the ratio of medians would be 4 / 1 = 4)
    assert paired_ratio(times, "run", "plain") == 2.0


def test_alternate_reverses_order_every_other_repeat_and_warms_up():
    calls: list[str] = []
    contenders = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    times = alternate(contenders, repeats=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert sorted(times) == ["a", "b", "wall:a", "wall:b"]  # the cpu clock, wall kept aside
    assert all(len(t) == 3 for t in times.values())


def test_cpu_clock_does_not_bill_sleeping():
    times = alternate({"sleep": lambda: time.sleep(0.2)}, repeats=1, warmup=0)
    assert times["sleep"][0] < 0.1 <= 0.2 <= times["wall:sleep"][0]


def test_contender_setup_is_not_timed():
    c = Contender(run=lambda arg: arg, setup=lambda: time.sleep(0.2) or "x")
    wall, _cpu = c.once()
    assert wall < 0.1


def test_judged_limits_both_ways():
    assert judged("m", "c", 1.3, "×", 1.25).status == "missed"
    assert judged("m", "c", 1.25, "×", 1.25).passed is True
    row = judged("m", "c", 0.4, "×", 0.5, at_least=True)
    assert (row.passed, row.target) == (False, "≥ 0.5")


def test_find_reports_missing_pieces_without_raising():
    obj, why = find("benchmarks.no_such_module:run")
    assert obj is None and "not available yet" in why
    obj, why = find("benchmarks._common:no_such_name")
    assert obj is None and "no_such_name" in why
    obj, why = find("benchmarks._common:paired_ratio")
    assert obj is paired_ratio and why == ""


def test_synthetic_table_matches_schema_and_diff_finds_the_planted_changes():
    from parity_tracker.analysis.diff import count_changes, diff_tables
    from parity_tracker.files.tables import MODULES_SCHEMA

    base = synthetic.modules_table(3000, seed=1)
    head = synthetic.modules_table(3000, seed=2)
    assert base.schema.remove_metadata() == MODULES_SCHEMA.remove_metadata()
    assert pc.count_distinct(base["tag"]).as_py() == 3000
    bad = pc.equal(base["status"], "mismatch")
    same_hash = pc.equal(base["ref_hash"], base["cand_hash"])
    assert pc.all(pc.xor(bad, same_hash)).as_py()  # hashes differ exactly where mismatching
    base_bad = set(pc.filter(base["tag"], bad).to_pylist())
    head_bad = set(pc.filter(head["tag"], pc.equal(head["status"], "mismatch")).to_pylist())
    counts = count_changes(diff_tables(base, head))
    assert counts["regression"] == len(head_bad - base_bad)
    assert counts["fix"] == len(base_bad - head_bad)


def test_throughput_rows_from_bench_compare_dict():
    out = {
        "equal_over_copyto": 0.66,
        "full_over_copyto": 0.07,
        "copyto_gbps": 2.9,
        "equal_gbps": 1.9,
        "full_gbps": 0.2,
        "numel": 1 << 26,
        "repeats": 7,
    }
    rows = bench_throughput._rows_from_dict(out)
    assert [(r.case, r.value, r.status, r.target) for r in rows] == [
        ("2^26 float32 pair", 0.66, "ok", "≥ 0.5"),
        ("2^26 float32 pair", 0.07, "missed", "≥ 0.25"),
    ]
    # with CPU-time ratios present, the CPU clock (the default) takes them
    rows = bench_throughput._rows_from_dict(
        {**out, "equal_over_copyto_cpu": 0.4, "full_over_copyto_cpu": 0.3}
    )
    assert [(r.value, r.status) for r in rows] == [(0.4, "missed"), (0.3, "ok")]


@pytest.mark.parametrize(
    ("status", "code"), [("missed", 0), ("not available yet", 0), ("error", 1)]
)
def test_main_writes_json_and_exits_nonzero_only_on_error(tmp_path, monkeypatch, status, code):
    row = Row("9 fake", "case", None if status != "missed" else 2.0, "×", "≤ 1", None, status)
    monkeypatch.setattr(bench_main, "measure", lambda number, quick: ([row], 0.01))
    out = tmp_path / "r.json"
    assert bench_main.main(["--quick", "--only", "1", "--out", str(out)]) == code
    data = json.loads(out.read_text())
    assert data["meta"]["mode"] == "quick" and data["meta"]["torch_threads"] == 1
    # --quick never judges a figure against the full-size target: a missed row is info
    want = ("info", "full: ≤ 1") if status == "missed" else (status, "≤ 1")
    assert (data["rows"][0]["status"], data["rows"][0]["target"]) == want


def test_informational_lifts_only_judged_rows_and_states_why():
    from benchmarks._common import QUICK_REASON, informational

    row = informational(judged("1 m", "c", 5.6, "×", 1.25, detail="raw"))
    assert (row.status, row.passed, row.target) == ("info", None, "full: ≤ 1.25")
    assert row.detail == f"{QUICK_REASON}; raw"
    err = Row("9", "c", None, "", "≤ 1", None, "error", "boom")
    assert informational(err) is err


def test_quick_table_fits_100_columns(capsys):
    long = "transformer 2×128, seq 64, batch 2 (266 rows and a long tail of words)"
    rows = [
        judged(
            "1 module-level ÷ plain, a long measurement name",
            long,
            5.61,
            "×",
            1.25,
            detail="d" * 400,
        ),
        Row("3 peers", "x", None, "", "", None, "not available yet", "torchlens missing"),
    ]
    bench_main.print_table(rows, "t" * 150, ["n" * 250])
    lines = capsys.readouterr().out.splitlines()
    assert lines and max(len(line) for line in lines) <= 100
    assert "d" * 50 not in "".join(lines)  # details stay in the JSON file
