"""The per-run fixed cost's shortcuts give what the general paths give (issue 19, w11fix).

git started with ``os.posix_spawnp`` (``run.environment``), the summary's value cleaning and
output metrics (``run.summary``), the input clones (``run.run._clone_inputs``).
"""

from __future__ import annotations

import math
import os
import signal
import stat
import time
from collections import namedtuple

import pyarrow as pa
import pytest
import torch

from parity_tracker.run import environment
from parity_tracker.run.run import _clone_inputs
from parity_tracker.run.summary import _has_column, _json_clean, output_metrics

posix_only = pytest.mark.skipif(not hasattr(os, "posix_spawnp"), reason="no posix_spawnp")

# a commit id, a branch and one tracked change, as ``git status --porcelain=v2 --branch`` says
_OID = "0123456789abcdef0123456789abcdef01234567"
_STATUS = f"# branch.oid {_OID}\\n# branch.head feature/x\\n1 .M N... 100644 100644 100644 a b f\\n"


def _fake_git(folder, body: str):
    """A ``git`` executable in ``folder`` (a shell script running ``body``)."""
    folder.mkdir(exist_ok=True)
    git = folder / "git"
    git.write_text(f"#!/bin/sh\n{body}\n")
    git.chmod(git.stat().st_mode | stat.S_IXUSR)
    return folder


@posix_only
def test_spawned_git_runs_the_first_git_on_path_in_the_tree_with_signals_restored(
    tmp_path, monkeypatch
):
    work, out = tmp_path / "work", tmp_path / "seen"
    work.mkdir()
    # records its arguments, its working directory (after -C) and SIGPIPE's disposition
    body = (
        f'if [ "$1" = "-C" ]; then cd "$2"; shift 2; fi\n'
        f'echo "$@" > {out}.args; pwd -P > {out}.cwd\n'
        f"grep SigIgn /proc/self/status > {out}.sig 2>/dev/null\n"
        f"printf '{_STATUS}'"
    )
    bin_dir = _fake_git(tmp_path / "bin", body)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env = environment.start_environment(work)()
    assert (env["git_commit"], env["git_branch"], env["git_dirty"]) == (_OID, "feature/x", True)
    assert (out.parent / "seen.args").read_text().split() == environment._STATUS_V2
    assert (out.parent / "seen.cwd").read_text().strip() == str(work.resolve())
    sig = out.parent / "seen.sig"
    if sig.exists() and sig.read_text().strip():  # Linux: a hex mask of ignored signals
        ignored = int(sig.read_text().split()[1], 16)
        assert not ignored & (1 << (signal.SIGPIPE - 1))  # Python ignores it; git must not


@posix_only
def test_spawned_git_past_its_timeout_is_killed_reaped_and_gives_none(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    body = f'if [ "$1" = "-C" ]; then echo $$ > {pid_file}; exec sleep 30; fi\nexit 1'
    bin_dir = _fake_git(tmp_path / "bin", body)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(environment, "GIT_TIMEOUT_S", 0.5)
    start = time.monotonic()
    env = environment.start_environment(tmp_path)()
    assert time.monotonic() - start < 10  # not the sleep's 30 s
    assert (env["git_commit"], env["git_branch"], env["git_dirty"]) == (None, None, None)
    pid = int(pid_file.read_text())
    with pytest.raises(ChildProcessError):  # reaped: no zombie left behind
        os.waitpid(pid, os.WNOHANG)


@posix_only
def test_no_git_on_path_gives_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no git anywhere
    env = environment.start_environment(tmp_path)()
    assert (env["git_commit"], env["git_branch"], env["git_dirty"]) == (None, None, None)
    assert env["torch_version"] == torch.__version__


def test_json_clean_keeps_plain_values_and_cleans_the_rest():
    class Name(str):
        pass

    class Other:
        def __str__(self):
            return "other"

    value = {
        1: [1.5, math.nan, math.inf, True, None, "s", Name("n")],
        "t": (2, {"x": -math.inf}),
        "o": Other(),
        "i": 7,
    }
    assert _json_clean(value) == {
        "1": [1.5, None, None, True, None, "s", "n"],
        "t": [2, {"x": None}],
        "o": "other",
        "i": 7,
    }


def test_output_metrics_by_column_hand_worked():
    table = pa.table(
        {
            "module": ["model", "model", "model", "enc", None],
            "kind": ["output", "output", "output", "output", "output"],
            "status": ["equal", "skipped", "mismatch", "mismatch", "mismatch"],
            "max_abs_diff": [0.0, None, 0.25, 9.0, 9.0],
            "sqnr_db": [None, None, 31.5, 1.0, 1.0],
        }
    )
    # the root's three rows: max diff 0.25, worst sqnr 31.5; one judged row is a mismatch
    assert output_metrics(table) == {
        "output_max_abs_diff": 0.25,
        "output_sqnr_db": 31.5,
        "output_equal": False,
    }
    only_skipped = table.slice(1, 1)
    assert output_metrics(only_skipped)["output_equal"] is None
    assert output_metrics(table.slice(3, 2)) == dict.fromkeys(
        ("output_max_abs_diff", "output_sqnr_db", "output_equal")
    )


def test_has_column_answers_as_column_names():
    single = pa.table({"a": [1], "error_ratio": [None]})
    repeated = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"])
    assert _has_column(single, "error_ratio") and not _has_column(single, "b")
    assert _has_column(repeated, "x") and not _has_column(repeated, "y")


def test_clone_inputs_shortcut_copies_as_tree_map():
    x = torch.arange(6.0, requires_grad=True).reshape(2, 3)
    y = torch.ones(2)
    for inputs in ((x, y), x):
        copy = _clone_inputs(inputs)
        pairs = zip(copy, inputs, strict=True) if isinstance(inputs, tuple) else [(copy, inputs)]
        assert type(copy) is type(inputs)
        for c, o in pairs:
            assert torch.equal(c, o) and not c.requires_grad
            assert c.untyped_storage().data_ptr() != o.untyped_storage().data_ptr()
    pair = namedtuple("pair", "a b")(x, 3)  # not a plain tuple: the pytree walk, type kept
    copy = _clone_inputs(pair)
    assert type(copy) is type(pair) and copy.b == 3 and torch.equal(copy.a, x)
    assert copy.a.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    mixed = _clone_inputs((x, 2, [y]))
    assert mixed[1] == 2 and isinstance(mixed[2], list) and torch.equal(mixed[2][0], y)


@posix_only
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_copy_of_a_spawned_git_does_not_kill_the_parents_git(tmp_path, monkeypatch):
    body = f"sleep 1; printf '{_STATUS}'"
    bin_dir = _fake_git(tmp_path / "bin", body)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    git = environment._SpawnedGit.start(tmp_path, dict(os.environ))
    child = os.fork()
    if child == 0:  # the child's copy: reaped as its finalizer would at exit
        git.reap()
        os._exit(0)
    os.waitpid(child, 0)
    answer = git.answer()  # the parent's git ran to its end, unkilled
    assert environment._parse_status_v2(answer)["git_commit"] == _OID
