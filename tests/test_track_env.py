"""Recorded environment (git read from the working tree) and store resolution / retry."""

from __future__ import annotations

import subprocess

import pytest
import torch

from parity_tracker.run.environment import ENV_KEYS, collect_environment, git_info
from parity_tracker.track import store


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    _git(tmp_path, "init", "-q", "-b", "nightly-test")
    _git(tmp_path, "config", "user.email", "t@example.com")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "f.txt").write_text("a")
    _git(tmp_path, "add", "f.txt")
    _git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_git_info_reads_commit_branch_dirty(repo):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert git_info(repo) == {"git_commit": head, "git_branch": "nightly-test", "git_dirty": False}
    (repo / "f.txt").write_text("b")
    assert git_info(repo)["git_dirty"] is True
    (repo / "untracked.txt").write_text("x")  # untracked files do not make a tree dirty
    (repo / "f.txt").write_text("a")
    assert git_info(repo)["git_dirty"] is False


def test_not_a_git_tree_gives_none(tmp_path):
    assert git_info(tmp_path) == {"git_commit": None, "git_branch": None, "git_dirty": None}


def test_collect_environment_overrides_and_torch_flags(repo):
    env = collect_environment(commit="abc", branch="rel", dirty=True, cwd=repo)
    assert tuple(env) == ENV_KEYS
    assert (env["git_commit"], env["git_branch"], env["git_dirty"]) == ("abc", "rel", True)
    assert env["torch_version"] == torch.__version__
    assert env["num_threads"] == torch.get_num_threads()
    assert env["deterministic"] is torch.are_deterministic_algorithms_enabled()
    assert env["parity_tracker_version"] == "0.1.0"


def test_tracking_uri_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    default = f"sqlite:///{tmp_path.resolve() / '.parity' / 'mlflow.db'}"
    assert store.resolve_tracking_uri() == default
    assert store.artifact_root(default) == (tmp_path.resolve() / ".parity" / "artifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert store.resolve_tracking_uri() == "http://127.0.0.1:5999"
    assert store.resolve_tracking_uri("sqlite:////x/y.db") == "sqlite:////x/y.db"
    assert store.artifact_root("http://127.0.0.1:5999") is None
    assert store.resolve_tracking_uri("runs.db") == f"sqlite:///{tmp_path.resolve() / 'runs.db'}"


def test_retry_backs_off_on_locked_and_raises_others(monkeypatch):
    sleeps = []
    monkeypatch.setattr(store.time, "sleep", sleeps.append)
    monkeypatch.setattr(store.random, "uniform", lambda a, b: 1.0)  # no jitter
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "ok"

    assert store.retry(flaky) == "ok" and len(calls) == 3
    assert sleeps == pytest.approx([0.05, 0.1])  # 0.05 s, doubling
    with pytest.raises(ValueError, match="other"):
        store.retry(lambda: (_ for _ in ()).throw(ValueError("other")))

    def always_locked():
        raise RuntimeError("database is locked")

    with pytest.raises(RuntimeError, match="locked"):
        store.retry(always_locked)
    assert len(sleeps) == 2 + store.RETRY_ATTEMPTS - 1
    assert sleeps[2:] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0])  # capped at 2 s


def test_start_environment_reads_git_in_the_background_as_collect_environment(
    repo, tmp_path_factory
):
    from parity_tracker.run.environment import start_environment

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    (repo / "f.txt").write_text("changed")  # dirty when started
    finish = start_environment(repo)
    (repo / "f.txt").write_text("a")  # clean again before the answer is read: git ran already
    env = finish()
    assert tuple(env) == ENV_KEYS
    assert (env["git_commit"], env["git_branch"]) == (head, "nightly-test")
    assert env["num_threads"] == torch.get_num_threads()
    assert env == {**collect_environment(cwd=repo), "git_dirty": env["git_dirty"]}
    outside = tmp_path_factory.mktemp("outside")  # beside the repo, not inside it
    env = start_environment(outside)()
    assert (env["git_commit"], env["git_branch"], env["git_dirty"]) == (None, None, None)
    start_environment(repo)  # never read: reaped by its finalizer, no error, no zombie
