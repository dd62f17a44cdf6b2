"""What the MLflow UI shows of parity runs (``track.browse``, ``files.csvfiles``, ``cells.csv``).

Expected strings and rows are written out by hand or derived with plain Python from the input
tables, never from the code under test.
"""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pytest

from parity_tracker.files.csvfiles import FAILING_CSV_MAX_ROWS, failing_rows, write_csv
from parity_tracker.files.tables import MODULES_SCHEMA, OPS_SCHEMA, rows_to_table
from parity_tracker.run.summary import RunSummary
from parity_tracker.track import browse

OK = {"equal", "close", "skipped"}  # written out here: the statuses that are not failing


def _summary(**kw):
    base = {
        "run_id": "a" * 32, "status": "completed", "passed": False, "mode": "allclose",
        "settings": {"target": "vae-tiny", "quantization": "int8", "mode": "allclose"},
        "tensors_compared": 40, "tensors_passing": 37, "tensors_failing": 3,
        "tensors_skipped": 0, "output_max_abs_diff": 0.0123456, "output_sqnr_db": 31.25,
        "first_divergence": {"tag": "checker_decoder.conv_in", "module": "decoder.conv_in",
                             "kind": "output", "step": 0, "exec_order": 7,
                             "status": "mismatch", "max_abs_diff": 0.000123456},
        "root_causes": [{"op": "aten.convolution.default", "module": "decoder.conv_in",
                         "step": 0, "status": "mismatch", "cause": "A"}],
    }  # fmt: skip
    return RunSummary.from_dict({**base, **kw})


def test_verdict_of_each_outcome():
    assert browse.run_verdict(_summary()) == "fail"
    assert browse.run_verdict(_summary(passed=True)) == "pass"
    err = {"type": "RuntimeError", "message": "boom", "side": "candidate"}
    assert browse.run_verdict(_summary(status="failed", error=err)) == "error"
    assert browse.run_verdict(_summary(status="killed")) == "killed"
    assert set(browse.VERDICTS) == {"pass", "fail", "error", "killed"}


def test_description_states_verdict_numbers_and_pointers():
    text = browse.describe_run(_summary(), failing_csv_rows=200, failing_total=250)
    lines = text.splitlines()
    assert lines[0] == (
        "**PARITY FAILS** (verdict `fail`) · `vae-tiny` quantization=int8 · mode allclose"
    )
    assert (
        "- first divergence: `checker_decoder.conv_in` (module `decoder.conv_in`, output, "
        "step 0, exec order 7): mismatch, max |Δ| 0.0001235"
    ) in lines
    assert "- output: max |Δ| 0.01235, SQNR 31.25 dB" in lines
    assert "- tensors: 40 compared, 37 passing, 3 failing, 0 skipped" in lines
    assert (
        "- root cause: op `aten.convolution.default` in module `decoder.conv_in` "
        "(step 0, mismatch, seed case A)"
    ) in lines
    assert "Failing rows: `tables/failing.csv` (the first 200 of 250)." in lines
    assert "Full report: `report.html` (Artifacts tab)." in lines
    # the first divergence comes before the counts: the run page folds all but the first lines
    assert text.index("first divergence") < text.index("- tensors:")


def test_description_of_a_pass_and_of_an_error():
    ok = browse.describe_run(
        _summary(passed=True, tensors_failing=0, first_divergence=None, root_causes=[],
                 output_equal=True, output_max_abs_diff=None, output_sqnr_db=None),
        report=False,
    )  # fmt: skip
    assert ok.startswith("**PARITY HOLDS** (verdict `pass`)")
    assert "- output: bitwise equal (max |Δ| 0, SQNR infinite)" in ok
    assert "failing.csv" not in ok and "report.html" not in ok
    err = {"type": "RuntimeError", "message": "shape bad", "side": "candidate"}
    text = browse.describe_run(_summary(status="failed", error=err))
    assert text.splitlines()[2] == "- error (candidate): RuntimeError: shape bad"


def test_description_is_cut_to_mlflows_tag_limit():
    causes = [{"op": "x" * 300, "module": "m", "step": 0, "status": "mismatch"}] * 3
    long = _summary(first_divergence={"tag": "t" * 9000, "status": "mismatch"},
                    root_causes=causes)  # fmt: skip
    text = browse.describe_run(long)
    assert len(text) == 8000
    assert text.endswith("… (cut; see report.html)\n")


def test_ui_tags():
    tags = browse.ui_tags(_summary(), browse.SOURCE_NIGHTLY, "desc")
    assert tags == {
        "verdict": "fail", "mlflow.note.content": "desc",
        "mlflow.source.name": "parity-tracker nightly", "mlflow.source.type": "JOB",
        "first_divergence": "checker_decoder.conv_in",
    }  # fmt: skip
    assert "first_divergence" not in browse.ui_tags(_summary(first_divergence=None), ("s", "LOCAL"))


def test_saved_view_is_the_envelope_the_ui_reads():
    env = json.loads(browse.saved_view(["quantization", "target"], now_ms=5))
    assert {k: env[k] for k in ("name", "createdAt", "updatedAt")} == {
        "name": "parity", "createdAt": 5, "updatedAt": 5,
    }  # fmt: skip
    state = json.loads(env["state"])
    assert state["selectedColumns"] == [
        "attributes.`Source`", "attributes.`Version`", "params.`target`",
        "params.`quantization`", "tags.`verdict`", "metrics.`tensors_failing`",
        "metrics.`output_max_abs_diff`", "metrics.`output_sqnr_db`", "metrics.`regressions`",
        "tags.`first_divergence`",
    ]  # fmt: skip
    assert state["searchFilter"] == "params.target LIKE '%'"
    assert state["orderByKey"] == "attributes.end_time" and state["orderByAsc"] is False
    tags = browse.experiment_tags()
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert "mlflow.sharedViewState.parity" in tags


def test_urls():
    base = "http://127.0.0.1:5000/"
    ml = "workflowType=machine_learning"
    assert browse.experiments_url(base) == f"http://127.0.0.1:5000/#/experiments?{ml}"
    assert browse.runs_url(base, "3") == (
        f"http://127.0.0.1:5000/#/experiments/3/runs?{ml}&viewStateShareKey=parity"
    )
    assert browse.run_url(base, "3", "r1") == f"http://127.0.0.1:5000/#/experiments/3/runs/r1?{ml}"
    assert browse.artifact_url(base, "3", "r1", "tables/failing.csv") == (
        f"http://127.0.0.1:5000/#/experiments/3/runs/r1/artifacts/tables/failing.csv?{ml}"
    )
    assert browse.server_base("sqlite:///x.db") is None
    assert browse.server_base("https://mlflow.example/") == "https://mlflow.example"


# --------------------------------------------------------------------------- failing.csv


def _modules(statuses):
    rows = [
        {"tag": f"t{i}", "module": f"m{i}", "kind": "output", "step": 0, "exec_order": i,
         "status": s, "max_abs_diff": float(i), "ref_shape": [2, i], "cand_shape": [2, i],
         "message": f"row, {i}"}
        for i, s in enumerate(statuses)
    ]  # fmt: skip
    return rows, rows_to_table(rows, MODULES_SCHEMA)


def test_failing_rows_keep_structure_differences_and_count_before_the_cap(tmp_path):
    statuses = ["equal", "mismatch", "close", "missing_candidate", "skipped",
                "missing_reference", "shape_mismatch", "error"]  # fmt: skip
    rows, modules = _modules(statuses)
    ops_rows = [{"tag": "op0", "op": "aten.add.Tensor", "op_index": 4, "status": "mismatch",
                 "kind": "op"}]  # fmt: skip
    ops = rows_to_table(ops_rows, OPS_SCHEMA)
    expected = [r["tag"] for r in rows if r["status"] not in OK] + ["op0"]
    table, total = failing_rows(modules, ops)
    assert total == len(expected) == 6
    assert table.column("tag").to_pylist() == expected
    capped, total = failing_rows(modules, ops, cap=2)
    assert total == 6 and capped.column("tag").to_pylist() == expected[:2]

    path = write_csv(table, tmp_path / "failing.csv")
    with open(path, newline="") as f:
        got = list(csv.DictReader(f))
    assert [r["tag"] for r in got] == expected
    assert got[0]["table"] == "modules" and got[-1]["table"] == "ops"
    assert got[0]["ref_shape"] == "[2, 1]" and got[0]["message"] == "row, 1"
    assert got[-1]["op"] == "aten.add.Tensor" and got[-1]["op_index"] == "4"
    assert got[0]["op"] == ""
    assert FAILING_CSV_MAX_ROWS == 200


def test_cells_csv_one_row_per_cell(tmp_path):
    from parity_tracker.pipeline.matrix import Cell
    from parity_tracker.pipeline.results import CellResult, cells_table

    def cell(q):
        return Cell(target="tiny", settings=(("q", q),))

    a = CellResult(cell("none"), run_id="r1", passed=True)
    b = CellResult(cell("int8"), run_id="r2", tensors_failing=4,
                   output_max_abs_diff=0.5, first_divergence="checker_fc2",
                   changes={"regression": 2})  # fmt: skip
    c = CellResult(cell("fp16"), error="RuntimeError: boom")
    path = write_csv(cells_table([a, b, c]), tmp_path / "cells.csv")
    with open(path, newline="") as f:
        got = list(csv.DictReader(f))
    assert [(r["cell"], r["status"], r["run_id"]) for r in got] == [
        ("tiny[q=none]", "pass", "r1"), ("tiny[q=int8]", "regression", "r2"),
        ("tiny[q=fp16]", "error", ""),
    ]  # fmt: skip
    assert json.loads(got[1]["settings"]) == {"q": "int8"}
    assert (got[1]["tensors_failing"], got[1]["regressions"]) == ("4", "2")
    assert float(got[1]["output_max_abs_diff"]) == 0.5
    assert got[2]["message"] == "RuntimeError: boom"


# --------------------------------------------------------------------------- logged runs


def test_logged_run_carries_the_ui_tags_and_failing_csv(tiny_pair, sqlite_tracking_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    from parity_tracker.run import run_parity
    from parity_tracker.track import log_run
    from parity_tracker.track.query import RunStore

    ref, cand, inputs = tiny_pair
    result = run_parity(ref, cand, inputs, settings={"target": "tiny", "quantization": "none"})
    run_id = log_run(result, tracking_uri=sqlite_tracking_uri, experiment="ui",
                     spool_dir=tmp_path / "spool", render=None,
                     source=browse.SOURCE_RUN)  # fmt: skip
    client = MlflowClient(sqlite_tracking_uri)
    run = client.get_run(run_id)
    tags = run.data.tags
    assert tags["verdict"] == "fail"
    assert tags["first_divergence"] == "checker_fc2_input_0"  # the injected divergence
    assert (tags["mlflow.source.name"], tags["mlflow.source.type"]) == (
        "parity-tracker run", "LOCAL",
    )  # fmt: skip
    note = tags["mlflow.note.content"]
    assert note.startswith("**PARITY FAILS** (verdict `fail`) · `tiny`")
    assert "`checker_fc2_input_0`" in note and "report.html" not in note  # render=None
    failing = [r["tag"] for r in result.modules.to_pylist() if r["status"] not in OK]
    assert f"Failing rows: `tables/failing.csv` (all {len(failing)})." in note
    local = client.download_artifacts(run_id, "tables/failing.csv", str(tmp_path))
    with open(local, newline="") as f:
        assert [r["tag"] for r in csv.DictReader(f)] == failing
    exp = client.get_experiment_by_name("ui")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "mlflow.sharedViewState.parity" in exp.tags
    store = RunStore(sqlite_tracking_uri, "ui")
    assert store.experiment_id() == exp.experiment_id
    assert store.run_url(run_id) is None  # an embedded store has no address
    assert store.run_url(run_id, base="http://h:1") == (
        f"http://h:1/#/experiments/{exp.experiment_id}/runs/{run_id}?workflowType=machine_learning"
    )


def test_prepare_ui_lists_the_settings_and_keeps_a_chosen_kind(tiny_equal_pair, sqlite_tracking_uri,
                                                               tmp_path):  # fmt: skip
    from mlflow.tracking import MlflowClient

    from parity_tracker.run import run_parity
    from parity_tracker.track import log_run
    from parity_tracker.track.query import RunStore

    ref, cand, inputs = tiny_equal_pair
    result = run_parity(ref, cand, inputs, settings={"target": "tiny", "cache": "kv"})
    log_run(result, tracking_uri=sqlite_tracking_uri, experiment="ui2", render=None,
            spool_dir=tmp_path / "spool")  # fmt: skip
    client = MlflowClient(sqlite_tracking_uri)
    exp = client.get_experiment_by_name("ui2")
    client.set_experiment_tag(exp.experiment_id, "mlflow.experimentKind", "genai_development")
    assert RunStore(sqlite_tracking_uri, "ui2").prepare_ui() == exp.experiment_id
    tags = client.get_experiment(exp.experiment_id).tags
    assert tags["mlflow.experimentKind"] == "genai_development"  # the user's choice is kept
    state = json.loads(json.loads(tags["mlflow.sharedViewState.parity"])["state"])
    params = [c for c in state["selectedColumns"] if c.startswith("params.")]
    assert params == ["params.`target`", "params.`cache`"]
    assert RunStore(sqlite_tracking_uri, "absent").prepare_ui() is None


@pytest.mark.parametrize("n", [0, 1])
def test_empty_tables_give_no_failing_rows(n):
    _, modules = _modules(["equal"] * n)
    table, total = failing_rows(modules, rows_to_table([], OPS_SCHEMA))
    assert total == 0 and table.num_rows == 0 and isinstance(table, pa.Table)
