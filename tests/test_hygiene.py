"""The check that keeps test runs out of the checkout (conftest.py's session hooks) can fail."""

from __future__ import annotations

import subprocess

from helpers import git_status, new_changes


def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_a_file_written_into_the_checkout_is_reported(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text(".parity/\n__pycache__/\n")
    _git(repo, "add", ".gitignore")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "init")
    before = git_status(repo)
    assert before == set()
    (repo / "stray.txt").write_text("x")  # untracked
    (repo / ".parity" / "dumps").mkdir(parents=True)
    (repo / ".parity" / "dumps" / "a.npy").write_bytes(b"0")  # ignored, still reported
    (repo / "pkg" / "__pycache__").mkdir(parents=True)
    (repo / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"0")  # a tool cache: allowed
    after = git_status(repo)
    assert new_changes(before, after) == ["!! .parity/dumps/a.npy", "?? stray.txt"]


def test_no_git_checkout_disables_the_check(tmp_path):
    assert git_status(tmp_path / "missing") is None
