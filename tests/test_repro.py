"""Reproducers (issue 20): a standalone failing op/module test from a run's divergence."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import parity_tracker
from parity_tracker.errors import InputError
from parity_tracker.files import repro_data, repro_lib
from parity_tracker.repro.command import reproducer_from_material
from parity_tracker.repro.writer import write_reproducer
from parity_tracker.run import run_parity

PKG = Path(parity_tracker.__file__).resolve().parent


class GeluNet(torch.nn.Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.act = torch.nn.GELU(approximate=approximate)
        self.out = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


class SumRef(torch.nn.Module):
    def forward(self, x):
        return (x * 1.0).sum(dim=-1)


class SumTransposed(torch.nn.Module):
    """The same sum, fed a transposed (column-major, non-contiguous) copy of its input."""

    def forward(self, x):
        return (x * 1.0).t().contiguous().t().sum(dim=-1)


def _gelu_pair():
    torch.manual_seed(0)
    ref, cand = GeluNet(), GeluNet("tanh")
    cand.load_state_dict(ref.state_dict())
    return ref, cand, torch.randn(3, 8)


def _standalone(folder: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """pytest in ``folder`` as cwd, with a PYTHONPATH that only adds parity_tracker."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    if not (site / "parity_tracker").exists():
        (site / "parity_tracker").symlink_to(PKG)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def _kept(result) -> dict:
    return json.loads((result.dump_dir / "repro" / "kept.json").read_text())


@pytest.mark.slow
def test_gelu_op_reproducer_fails_standalone_then_passes_once_fixed(tmp_path):
    ref, cand, x = _gelu_pair()
    result = run_parity(ref, cand, (x,), capture_ops=True, dump_path=tmp_path / "dump")
    kept = _kept(result)
    assert kept["items"][0] == {"kind": "op", "tag": "act@0::gelu#0", "dir": "op-00", "cause": "A"}
    folder = reproducer_from_material(result.dump_dir / "repro", None, tmp_path / "r", "x").path
    assert not list(folder.glob("*.pkl")) and not list(folder.glob("*.pt"))
    proc = _standalone(folder, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with torch.no_grad():  # independent: erf vs tanh GELU of the same fc output
        h = torch.nn.functional.linear(x, ref.fc.weight, ref.fc.bias)
        want = torch.nn.functional.gelu(h) - torch.nn.functional.gelu(h, approximate="tanh")
    assert "aten::gelu.default" in proc.stdout and "kernel differs" in proc.stdout
    assert f"max abs diff {want.abs().max().item()!r}" in proc.stdout
    assert "approximate=None vs 'tanh'" in proc.stdout  # reference: the default
    # fixed: the candidate's output is now PyTorch's erf GELU of the same input
    np.save(folder / "cand_out_0.npy", torch.nn.functional.gelu(h).numpy(), allow_pickle=False)
    assert _standalone(folder, tmp_path).returncode == 0


def test_fixed_candidate_keeps_nothing_and_says_so(tmp_path):
    torch.manual_seed(0)
    ref = GeluNet()
    cand = copy.deepcopy(ref)  # its own module objects (run.validate)
    result = run_parity(ref, cand, (torch.randn(2, 8),), capture_ops=True, dump_path=tmp_path)
    assert result.passed and result.dump_dir is None
    with pytest.raises(InputError, match="--keep-repro"):
        reproducer_from_material(tmp_path / "nothing", None, tmp_path / "r", "run1")


@pytest.mark.slow
def test_case_b_reproducer_says_inputs_differ_in_stride(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(64, 4096)
    result = run_parity(SumRef(), SumTransposed(), (x,), capture_ops=True, dump_path=tmp_path)
    item = _kept(result)["items"][0]
    assert (item["tag"], item["cause"]) == ("model@0::sum#0", "B")
    folder = write_reproducer(result.dump_dir / "repro" / item["dir"], tmp_path / "r")
    proc = _standalone(folder, tmp_path)
    assert proc.returncode == 1
    assert "inputs differ in stride (input 0: [4096, 1] vs [1, 64])" in proc.stdout
    assert "gives the candidate's output" in proc.stdout and "kernel differs" not in proc.stdout


@pytest.mark.slow
def test_generated_test_imports_only_the_testing_module(tmp_path):
    code = (
        "import sys, parity_tracker.testing, importlib.util;"
        "spec = importlib.util.spec_from_file_location('r', sys.argv[1]);"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
        "bad = {'mlflow', 'pyarrow', 'pandas', 'click', 'rich', 'safetensors'} & "
        "{k.split('.')[0] for k in sys.modules}; print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code, repro_lib.__file__], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation:UserWarning")
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(4, 6).to(torch.bfloat16),
        lambda: torch.randn(4, 6).to(torch.float8_e4m3fn),
        lambda: torch.randn(4, 6).to(torch.float8_e5m2).t(),
        lambda: torch.quantize_per_tensor(torch.randn(4, 6), 0.05, 3, torch.qint8),
        lambda: torch.quantize_per_channel(
            torch.randn(4, 6),
            torch.tensor([0.1, 0.2, 0.3, 0.4]),
            torch.tensor([0, 1, 2, 3]),
            0,
            torch.quint8,
        ),
    ],
    ids=["bf16", "fp8e4m3", "fp8e5m2-transposed", "qint8", "quint8-per-channel"],
)
def test_lossless_round_trip(tmp_path, make):
    t = make()
    entry = repro_data.write_tensor(tmp_path, "t", t)
    back = repro_lib.load_tensor(tmp_path, entry)
    assert back.dtype == t.dtype and back.shape == t.shape
    if t.is_quantized:
        assert torch.equal(back.int_repr(), t.int_repr())
        assert torch.equal(back.dequantize(), t.dequantize())
    else:
        assert back.stride() == t.stride()
        bits = torch.uint8 if t.element_size() == 1 else torch.int16
        assert torch.equal(back.view(bits), t.view(bits))


def test_index_paths_must_stay_inside(tmp_path):
    repro_data.write_index(tmp_path, {"kind": "op", "run_id": "r", "inputs": [
        {"ref": {"file": "../escape.npy"}, "cand": None}]})  # fmt: skip
    with pytest.raises(InputError, match="leaves"):
        write_reproducer(tmp_path, tmp_path / "out")


def test_too_large_inputs_are_cut_to_the_worst_rows(tmp_path):
    ref, cand, _ = _gelu_pair()
    x = torch.randn(64, 8)
    row_bytes = 8 * 4 * 4  # ref/cand inputs and outputs: 8 float32 per row each
    result = run_parity(ref, cand, (x,), capture_ops=True, dump_path=tmp_path,
                        keep_repro=10 * row_bytes + 16)  # fmt: skip
    meta = repro_lib.read_index(result.dump_dir / "repro" / "op-00")
    with torch.no_grad():
        h = torch.nn.functional.linear(x, ref.fc.weight, ref.fc.bias)
        d = torch.nn.functional.gelu(h) - torch.nn.functional.gelu(h, approximate="tanh")
    worst = int(d.abs().argmax()) // 8
    s = meta["slice"]
    assert s["dim"] == 0 and s["of"] == 64 and s["stop"] - s["start"] == 10
    assert s["start"] <= worst < s["stop"]
    assert meta["inputs"][0]["ref"]["shape"] == [10, 8]


def _module_reproducer(tmp_path, target: str, settings: dict) -> Path:
    from parity_tracker.pipeline.run_target import build_case
    from parity_tracker.run import run_case

    case, _ = build_case(target, settings)
    # allclose at the per-dtype defaults: a bf16 cast fails there (it passes its error budget)
    result = run_case(case, dump_path=tmp_path / "dump", mode="allclose")
    items = [i for i in _kept(result)["items"] if i["kind"] == "module"]
    assert items, _kept(result)
    return write_reproducer(result.dump_dir / "repro" / "module", tmp_path / "r")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "settings"),
    [("vae-tiny", {"quantization": "bf16"}), ("llama-tiny", {"quantization": "bf16"})],
)
def test_module_reproducer_runs_standalone(tmp_path, target, settings):
    folder = _module_reproducer(tmp_path, target, settings)
    meta = repro_lib.read_index(folder)
    proc = _standalone(folder, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert meta["module_class"]["qualname"] in proc.stdout
    assert (folder / "README.md").read_text().count("cannot be rebuilt") == (not meta["rebuild"])


@pytest.mark.slow
def test_cli_repro_from_the_store_uploads_and_names_the_flag_for_old_runs(
    tmp_path, sqlite_tracking_uri, in_tmp_cwd
):
    from click.testing import CliRunner

    from parity_tracker.cli import cli
    from parity_tracker.track import log_run
    from parity_tracker.track.artifacts import download_folder

    ref, cand, x = _gelu_pair()
    result = run_parity(ref, cand, (x,), capture_ops=True, dump_path=tmp_path / "d1")
    run_id = log_run(result, tracking_uri=sqlite_tracking_uri)
    out = tmp_path / "repro-out"
    args = ["repro", run_id, "--out", str(out), "--upload", "--tracking-uri", sqlite_tracking_uri]
    res = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output)
    assert payload["item"]["tag"] == "act@0::gelu#0" and payload["artifact"] == "repro/op-00"
    got = download_folder(run_id, "repro/op-00", tmp_path / "dl", tracking_uri=sqlite_tracking_uri)
    assert got is not None and (got / "test_repro.py").is_file() and (got / "repro.json").is_file()
    assert _standalone(out, tmp_path).returncode == 1
    # the first divergent module by name, then an older run that kept nothing
    res = CliRunner().invoke(cli, [*args[:2], "--tag", "act", "--out", str(tmp_path / "m"),
                                   "--tracking-uri", sqlite_tracking_uri])  # fmt: skip
    assert res.exit_code == 0 and "checker_act" in res.output
    old = run_parity(ref, cand, (x,), dump_path=tmp_path / "d2", keep_repro=0)
    old_id = log_run(old, tracking_uri=sqlite_tracking_uri)
    res = CliRunner().invoke(cli, ["repro", old_id, "--tracking-uri", sqlite_tracking_uri])
    assert res.exit_code == 2 and "--keep-repro" in res.output and "--ops" in res.output


@pytest.mark.slow
def test_nightly_hook_uploads_and_report_links_it(tmp_path, sqlite_tracking_uri):
    from parity_tracker.dashboards.report import render_run_report
    from parity_tracker.repro import upload_first_reproducer
    from parity_tracker.track import log_run
    from parity_tracker.track.artifacts import download_folder

    ref, cand, x = _gelu_pair()
    result = run_parity(ref, cand, (x,), capture_ops=True, dump_path=tmp_path / "d")
    html = render_run_report(result)
    assert "parity-tracker repro RUN_ID --upload" in html
    assert 'href="repro/op-00/test_repro.py"' in html
    assert 'href="tensors/repro/op-00/repro.json"' in html
    run_id = log_run(result, tracking_uri=sqlite_tracking_uri)
    art = upload_first_reproducer(result, run_id, tracking_uri=sqlite_tracking_uri)
    assert art == "repro/op-00"
    got = download_folder(run_id, art, tmp_path / "dl", tracking_uri=sqlite_tracking_uri)
    assert got is not None and _standalone(got, tmp_path).returncode == 1


def test_module_reproducer_for_a_candidate_that_is_not_a_module(tmp_path):
    ref, cand, x = _gelu_pair()

    def cand_drive(_engine, rec):  # an engine registering its tensors by hand
        with torch.no_grad():
            h = cand.fc(x)
            for tag, t in [("model_input_0", x), ("fc_input_0", x), ("fc", h), ("act_input_0", h),
                           ("act", cand.act(h))]:  # fmt: skip
                rec.register(f"checker_{tag}", t)

    result = run_parity(ref, object(), drive=lambda m, rec: m(x), candidate_drive=cand_drive,
                        dump_path=tmp_path / "d")  # fmt: skip
    item = _kept(result)["items"][0]
    assert (item["kind"], item["tag"], item["rebuild"]) == ("module", "checker_act", True)
    meta = repro_lib.read_index(result.dump_dir / "repro" / "module")
    cand_out = repro_lib.load_tensor(result.dump_dir / "repro" / "module", meta["cand_outputs"][0])
    with torch.no_grad():
        want = torch.nn.functional.gelu(cand.fc(x), approximate="tanh")
    assert torch.equal(cand_out, want)


@pytest.mark.slow
def test_module_over_the_limit_keeps_a_slice_of_the_outputs(tmp_path):
    ref, cand, x = _gelu_pair()
    result = run_parity(ref, cand, (x,), dump_path=tmp_path / "d", keep_repro=200)
    folder = write_reproducer(result.dump_dir / "repro" / "module", tmp_path / "r")
    meta = repro_lib.read_index(folder)
    with torch.no_grad():
        h = torch.nn.functional.linear(x, ref.fc.weight, ref.fc.bias)
        d = (torch.nn.functional.gelu(h) - torch.nn.functional.gelu(h, approximate="tanh")).abs()
    worst = int(d.reshape(-1).argmax())
    s = meta["slice"]  # 200 bytes / (2 sides x 2 x 4 bytes) = 12 float32 elements of 24
    assert (s["dim"], s["of"], s["stop"] - s["start"], s["shape"]) == ("flat", 24, 12, [3, 8])
    assert s["start"] <= worst < s["stop"] and not meta["rebuild"]
    assert "cannot be rebuilt" in (folder / "README.md").read_text()
    assert _standalone(folder, tmp_path).returncode == 1
