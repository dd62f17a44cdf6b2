"""Issue 14 items 3, 4, 7: bad input files and arguments are exit 2, nothing read from outside."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from parity_tracker.analysis.expected import load_expected
from parity_tracker.cli import cli
from parity_tracker.errors import InputError
from parity_tracker.files.safe_paths import resolve_inside
from parity_tracker.pipeline.config import load_matrix

TINY = "cli_targets:tiny"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _invoke(args: list[str]):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


# --------------------------------------------------------------------------- item 3: schemas

MATRIX_BAD = [
    ("matrix = 5\n", ["matrix = 5", "valid list"]),
    (f'[[matrix]]\ntarget = "{TINY}"\nops = "false"\n', ["ops = 'false'", "boolean"]),
    (f'[[matrix]]\ntarget = "{TINY}"\nrtol = true\natol = 1e-3\n', ["rtol = True", "numbers"]),
    (f'[[matrix]]\ntarget = "{TINY}"\natol = "1"\nrtol = 1\n', ["atol = '1'", "numbers"]),
    (f'[[matrix]]\ntarget = "{TINY}"\nmode = 3\n', ["mode = 3", "valid string"]),
    (f'[[matrix]]\ntarget = "{TINY}"\ndump_mode = "x"\n', ["dump_mode = 'x'", "FIRST_NOT_EQUAL"]),
    (f'[[matrix]]\ntarget = "{TINY}"\nperturb = {{ a = 1 }}\n', ["perturb", "non-empty list"]),
    (
        f'[[matrix]]\ntarget = "{TINY}"\n[other]\nx = 1\n',
        ["other", "unknown top-level keys", "matrix"],
    ),
    ("[[matrix]]\ntarget = 7\n", ["target = 7", "valid string"]),
    ('[[matrix]]\ntarget = "../../etc/passwd:x"\n', ["../../etc/passwd:x", "dotted module"]),
    ('[[matrix]]\ntarget = "../x:y"\n', ["../x:y", "dotted module"]),
    ('[[matrix]]\ntarget = "os:system; rm"\n', ["os:system; rm", "dotted module"]),
]


@pytest.mark.parametrize(("text", "needles"), MATRIX_BAD)
def test_matrix_schema_refuses_wrong_types_and_keys(tmp_path, text, needles):
    with pytest.raises(InputError) as info:
        load_matrix(_write(tmp_path, "nightly.toml", text))
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_matrix_values_keep_their_meaning(tmp_path):
    text = f'[[matrix]]\ntarget = "{TINY}"\nops = true\nrtol = 1\natol = 0.5\ndump_mode = "all"\n'
    (cell,) = load_matrix(_write(tmp_path, "nightly.toml", text))
    assert (cell.ops, cell.rtol, cell.atol, cell.dump_mode) == (True, 1.0, 0.5, "ALL")


EXPECTED_BAD = [
    ('[[expected]]\ntarget=1\ntag="*"\nreason="r"\nuntil=2030-01-01\n', ["target = 1"]),
    ('[[expected]]\ntarget="x"\ntag="*"\nreason="r"\nuntil=5\n', ["until = 5", "not a date"]),
    (
        '[[expected]]\ntarget="x"\ntag="*"\nreason="r"\nuntil=2030-01-01\nsettings=3\n',
        ["settings = 3", "dictionary"],
    ),
    (
        '[[expected]]\ntarget="x"\ntag="*"\nreason="r"\nuntil=2030-01-01\nsettings={a=[1]}\n',
        ["settings.a", "string, number or boolean"],
    ),
    ('expected = "x"\n', ["expected = 'x'", "valid list"]),
    (
        '[[expected]]\ntarget="x"\ntag="*"\nreason="r"\nuntil=2030-01-01\nwho="me"\n',
        ["expected[1].who", "unknown key", "allowed keys: reason, settings, tag, target, until"],
    ),
]


@pytest.mark.parametrize(("text", "needles"), EXPECTED_BAD)
def test_expected_schema_refuses_wrong_types_and_keys(tmp_path, text, needles):
    with pytest.raises(InputError) as info:
        load_expected(_write(tmp_path, "expected.toml", text))
    for needle in needles:
        assert needle in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "text",
    ["matrix = 5\n", '[[matrix]]\ntarget = "../../etc/passwd:x"\n', '[[matrix]]\nops="false"\n'],
)
def test_nightly_cli_bad_config_is_exit_2_without_traceback(tmp_path, text, in_tmp_cwd):
    config = _write(tmp_path, "nightly.toml", text)
    got = _invoke(["nightly", "--config", str(config), "--tracking-uri", "sqlite:///x.db"])
    assert got.exit_code == 2, got.output
    assert "Traceback" not in got.output


@pytest.mark.parametrize("spec", ["../x:y", "../../etc/passwd:x", "/abs/mod:fn", "a..b:c"])
def test_run_cli_bad_spec_is_exit_2_and_imports_nothing(spec, in_tmp_cwd):
    import sys

    before = set(sys.modules)
    got = _invoke(["run", spec, "--tracking-uri", "sqlite:///x.db"])
    assert got.exit_code == 2, got.output
    assert "dotted module path" in got.output
    assert not {m for m in set(sys.modules) - before if "passwd" in m or m in ("x", "y")}


# --------------------------------------------------------------------------- item 4: cells


def test_matrix_over_the_cell_limit_is_refused_before_expansion(tmp_path, monkeypatch):
    import parity_tracker.pipeline.config as config

    values = ", ".join(f'"v{i}"' for i in range(1000))
    text = f'[[matrix]]\ntarget = "{TINY}"\na = [{values}]\nb = [{values}]\n'
    path = _write(tmp_path, "nightly.toml", text)
    called = []
    monkeypatch.setattr(config, "expand", lambda *a, **k: called.append(1) or [])
    with pytest.raises(InputError, match=r"1,000,000 cells.*limit of 1,000.*--max-cells"):
        load_matrix(path)
    assert not called
    with pytest.raises(InputError, match="limit of 999,999"):
        load_matrix(path, max_cells=999_999)
    assert load_matrix(path, max_cells=10**6) == [] and len(called) == 1


def test_nightly_cli_max_cells_is_exit_2(tmp_path, in_tmp_cwd):
    axes = 'perturb = ["none", "fc2"]\nquantization = ["none", "bf16"]\n'
    text = f'[[matrix]]\ntarget = "{TINY}"\n{axes}'
    config = _write(tmp_path, "nightly.toml", text)
    got = _invoke(["nightly", "--config", str(config), "--max-cells", "3"])
    assert got.exit_code == 2 and "4 cells" in got.output, got.output


# --------------------------------------------------------------------------- item 7: folders


def _dump(tmp_path: Path) -> Path:
    import torch

    from parity_tracker.files.dump import DumpWriter

    writer = DumpWriter(tmp_path / "dumps")
    writer.write("checker_fc1", torch.arange(6.0).reshape(2, 3), side=0, role="reference")
    q = torch.quantize_per_channel(
        torch.randn(2, 3), torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0, torch.qint8
    )
    writer.write("checker_q", q, side=1, role="candidate")
    writer.close()
    return writer.folder


def _edit(folder: Path, change) -> None:
    index = folder / "index.json"
    payload = json.loads(index.read_text())
    change(payload)
    index.write_text(json.dumps(payload))


def test_resolve_inside_is_the_one_rule(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "secret.npy").write_bytes(b"x")
    os.symlink(tmp_path / "secret.npy", root / "link.npy")
    os.symlink(root / "sub", root / "inner")
    assert resolve_inside(root, "sub/a.npy") == (root / "sub" / "a.npy").resolve()
    assert resolve_inside(root, "inner/a.npy") == (root / "sub" / "a.npy").resolve()
    for bad in ("../secret.npy", str(tmp_path / "secret.npy"), "link.npy", "", "a\x00b", 5, None):
        with pytest.raises(InputError):
            resolve_inside(root, bad)


def test_load_dump_round_trip_still_works(tmp_path):
    from parity_tracker.files.dump import load_dump

    got = load_dump(_dump(tmp_path))
    assert [e["tag"] for e, _ in got] == ["checker_fc1", "checker_q"]
    np.testing.assert_array_equal(got[0][1].numpy(), np.arange(6.0).reshape(2, 3))


ESCAPES = {
    "dotdot": lambda p: p["files"][0].update(file="../../other/secret.npy"),
    "absolute": lambda p: p["files"][0].update(file="/etc/passwd"),
    "scales_dotdot": lambda p: p["files"][1].update(scales_file="../outside.npy"),
    "scales_absolute": lambda p: p["files"][1].update(zero_points_file="/tmp/x.npy"),
    "symlink": lambda p: p["files"][0].update(file="link.npy"),
}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_load_dump_refuses_paths_leaving_the_folder(case, tmp_path):
    from parity_tracker.files.dump import load_dump

    folder = _dump(tmp_path)
    secret = np.full(6, 42.0).reshape(2, 3)
    (tmp_path / "other").mkdir()
    for path in (tmp_path / "other" / "secret.npy", tmp_path / "dumps" / "outside.npy"):
        np.save(path, secret)
    os.symlink(tmp_path / "other" / "secret.npy", folder / "link.npy")
    _edit(folder, ESCAPES[case])
    with pytest.raises(InputError, match="leaves the dump folder"):
        load_dump(folder)


def _huge_npy(path: Path) -> None:
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000), }"
    header += " " * (63 - len(header) % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())


MALFORMED = {
    "bad_json": lambda f: (f / "index.json").write_text("{not json"),
    "not_object": lambda f: (f / "index.json").write_text("[1, 2]"),
    "files_not_list": lambda f: _edit(f, lambda p: p.update(files={"a": 1})),
    "entry_not_object": lambda f: _edit(f, lambda p: p.update(files=[5])),
    "file_not_str": lambda f: _edit(f, lambda p: p["files"][0].update(file=5)),
    "dtype_not_dtype": lambda f: _edit(f, lambda p: p["files"][0].update(dtype="load")),
    "dtype_not_str": lambda f: _edit(f, lambda p: p["files"][0].update(dtype=[1])),
    "shape_mismatch": lambda f: _edit(f, lambda p: p["files"][0].update(shape=[10**9, 10**9])),
    "axis_not_int": lambda f: _edit(f, lambda p: p["files"][1].update(axis="0")),
    "huge_header": lambda f: _huge_npy(f / "checker_fc1__ref.npy"),
    "truncated_npy": lambda f: (f / "checker_fc1__ref.npy").write_bytes(b"\x93NUMPY\x01"),
    "missing_npy": lambda f: (f / "checker_fc1__ref.npy").unlink(),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_load_dump_malformed_index_is_input_error(case, tmp_path):
    from parity_tracker.files.dump import load_dump

    folder = _dump(tmp_path)
    MALFORMED[case](folder)
    with pytest.raises(InputError):
        load_dump(folder)


def test_sync_refuses_a_spool_entry_with_a_symlink_out(tmp_path, sqlite_tracking_uri):
    """A spool entry someone else wrote cannot make sync upload a file from outside it."""
    from parity_tracker.errors import InfrastructureError
    from parity_tracker.track import sync_spool
    from parity_tracker.track.store import get_client

    spool = tmp_path / "spool"
    entry = spool / ("a" * 32)
    (entry / "artifacts").mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path / "secret.txt", entry / "artifacts" / "x.txt")
    meta = {"parity_run_id": "a" * 32, "experiment": "parity", "tracking_uri": sqlite_tracking_uri,
            "run_name": None, "parent_run_id": None, "params": {}, "metrics": {}, "tags": {},
            "status": "FINISHED", "start_time": 1, "end_time": 2}  # fmt: skip
    (entry / "run.json").write_text(json.dumps(meta))
    os.symlink(entry, spool / ("b" * 32))  # an entry that is itself a symlink is not read
    with pytest.raises(InfrastructureError, match="leaves the folder"):
        sync_spool(sqlite_tracking_uri, spool_dir=spool)
    client = get_client(sqlite_tracking_uri)
    exp = client.get_experiment_by_name("parity")
    assert exp is None or client.search_runs([exp.experiment_id]) == []
    (entry / "run.json").write_text(json.dumps({**meta, "start_time": "x"}))
    with pytest.raises(InfrastructureError, match="start_time = 'x'"):
        sync_spool(sqlite_tracking_uri, spool_dir=spool)
