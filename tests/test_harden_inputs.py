"""Issue 14 items 3, 4, 7: bad input files and arguments are exit 2, nothing read from outside."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from parity_tracker.analysis.expected import load_expected
from parity_tracker.cli import cli
from parity_tracker.errors import InputError
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
    (f'[[matrix]]\ntarget = "{TINY}"\n[other]\nx = 1\n', ["other", "unknown key", "matrix"]),
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
