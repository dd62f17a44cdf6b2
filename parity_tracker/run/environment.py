"""The environment a parity run was made in, recorded as MLflow params.

The keys are those of design.md, "A run's settings".

Git facts are read with the ``git`` executable from the working directory (or ``cwd``); each can
be overridden, because a CI checkout may be detached or not a git tree at all. Nothing here
imports mlflow.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import signal
import subprocess
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The environment keys of the contract; these are never part of a config fingerprint.
ENV_KEYS = (
    "git_commit",
    "git_branch",
    "git_dirty",
    "torch_version",
    "parity_tracker_version",
    "num_threads",
    "deterministic",
    "tf32",
)


def _git(args: list[str], cwd: str | os.PathLike[str] | None) -> str | None:
    """Output of ``git ARGS`` (stripped), or None when git is missing or this is no git tree."""
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_info(cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Commit, branch and dirty flag of the git tree at ``cwd`` (default: the working directory).

    Returns:
        ``{"git_commit": str | None, "git_branch": str | None, "git_dirty": bool | None}``;
        ``None`` where git is unavailable or ``cwd`` is not inside a git tree. A detached HEAD
        gives branch ``"HEAD"`` (``git rev-parse --abbrev-ref HEAD``). Dirty means
        ``git status --porcelain --untracked-files=no`` printed anything.
    """
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    one = _git_status_v2(cwd)
    return one if one is not None else _git_three(cwd)


def _git_three(cwd: Path) -> dict[str, Any]:
    """:func:`git_info` by three questions (when one ``git status`` could not answer)."""
    commit = _git(["rev-parse", "HEAD"], cwd)
    if commit is None:
        return {"git_commit": None, "git_branch": None, "git_dirty": None}
    branch = _git(["rev-parse", "--abbrev-ref", "HEAD"], cwd)
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    return {
        "git_commit": commit,
        "git_branch": branch,
        "git_dirty": None if status is None else bool(status),
    }


_STATUS_V2 = ["status", "--porcelain=v2", "--branch", "--untracked-files=no"]


def _git_status_v2(cwd: Path) -> dict[str, Any] | None:
    """:func:`git_info` from one ``git status --porcelain=v2 --branch`` call, or None.

    One process instead of three (each ``git`` start costs this process a fork: about 0.4 ms
    of CPU, a tenth of a small model's forwards). ``# branch.oid`` is the commit, ``#
    branch.head`` the branch (``(detached)`` → ``"HEAD"``, as ``rev-parse --abbrev-ref``
    says), any other line a tracked change. None (the caller asks the three questions) when
    git fails, or before the first commit (``(initial)``).
    """
    return _parse_status_v2(_git(_STATUS_V2, cwd))


def _parse_status_v2(out: str | None) -> dict[str, Any] | None:
    """The facts of ``git status --porcelain=v2 --branch`` output (see :func:`_git_status_v2`)."""
    if out is None:
        return None
    heads = dict(
        line[2:].split(" ", 1) for line in out.splitlines() if line.startswith("# branch.")
    )
    commit, branch = heads.get("branch.oid"), heads.get("branch.head")
    if commit is None or branch is None or commit == "(initial)":
        return None
    dirty = any(line and not line.startswith("#") for line in out.splitlines())
    branch = "HEAD" if branch == "(detached)" else branch
    return {"git_commit": commit, "git_branch": branch, "git_dirty": dirty}


def torch_flags() -> dict[str, Any]:
    """Thread count, determinism and TF32 flags of the running torch.

    ``tf32`` is True when either ``torch.backends.cuda.matmul.allow_tf32`` or
    ``torch.backends.cudnn.allow_tf32`` is on (TF32 changes float32 matmul/conv results on
    Ampere+ GPUs, so a run with it on cannot be expected to be bitwise equal to one without),
    and None (not applicable) when torch sees no CUDA device: the flags then affect nothing
    (``cudnn.allow_tf32`` defaults to True, which on a CPU machine would claim TF32 is in
    effect when it is not).
    """
    import torch

    return {
        "torch_version": torch.__version__,
        "num_threads": torch.get_num_threads(),
        "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
        "tf32": _tf32(torch),
    }


def _tf32(torch: Any) -> bool | None:
    """Whether TF32 may be used for float32 matmul/conv; None without a CUDA device."""
    if not torch.cuda.is_available():
        return None
    return bool(torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32)


def start_environment(cwd: str | os.PathLike[str] | None = None) -> Callable[[], dict[str, Any]]:
    """:func:`collect_environment` (no overrides), with git read while the caller works.

    ``git status`` is started now, in the background (:func:`_start_git`; with
    ``GIT_OPTIONAL_LOCKS=0``, as editors run it, so it never takes the index lock a user's own
    git command may need), and the torch flags are read now: the returned function waits for
    git (at most 10 s, then it is killed and the git keys are None) and gives the same dict
    :func:`collect_environment` would have given at this moment. ``run_parity`` starts it
    before the forwards and reads it after them: a small model's run no longer waits 2–5 ms
    of wall time for git (issue 19).
    """
    from parity_tracker import __version__

    work = Path(cwd) if cwd is not None else Path.cwd()
    flags = torch_flags()
    git = _start_git(work)

    def finish() -> dict[str, Any]:
        env = _parse_status_v2(None if git is None else git.answer())
        if env is None:  # no git, no tree, before the first commit: the three questions
            env = _git_three(work)
        env.update(flags)
        env["parity_tracker_version"] = __version__
        return {k: env.get(k) for k in ENV_KEYS}

    if git is not None:  # never read (the caller raised first): killed and reaped, no zombie
        weakref.finalize(finish, git.reap)
    return finish


#: seconds a background ``git status`` may take before it is killed (its git keys are None)
GIT_TIMEOUT_S = 10.0


def _start_git(work: Path) -> _SpawnedGit | _PopenGit | None:
    """``git status`` (``_STATUS_V2``) of the tree at ``work``, started now; None: not started.

    ``os.posix_spawnp`` where the platform has it (:class:`_SpawnedGit`), else
    ``subprocess.Popen`` (:class:`_PopenGit`).
    """
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    if hasattr(os, "posix_spawnp"):
        return _SpawnedGit.start(work, env)
    try:
        proc = subprocess.Popen(
            ["git", *_STATUS_V2], cwd=work, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=env,
        )  # fmt: skip
    except OSError:
        return None
    return _PopenGit(proc)


#: the signals Popen's ``restore_signals`` sets back to their defaults in the child (Python
#: ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored across ``exec``)
_RESTORED = tuple(
    getattr(signal, n) for n in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, n)
)


class _SpawnedGit:
    """A ``git status`` started with ``os.posix_spawnp``: its pid and its stdout's read end.

    Started as ``subprocess.Popen(["git", ...], cwd=work, stdout=PIPE, stderr=DEVNULL,
    text=True, env=env)`` would start it (``git`` looked up on ``PATH`` as ``execvp`` does,
    stdin inherited, the signals of ``restore_signals`` at their defaults, the answer decoded
    as Popen's text mode decodes it), without Popen's Python-level set-up: ≈ 0.25 instead of
    ≈ 0.56 ms of this process's CPU to start it and ≈ 0.02 instead of ≈ 0.045 ms to read it
    (issue 19, measured with torch imported, medians of 15 alternating rounds of 20).
    The working directory is given as ``git -C work`` (``posix_spawn`` has no ``cwd``; git
    then runs as if started there). Unlike Popen's ``close_fds=True``, descriptors this
    process marked inheritable stay open in git until it exits (Python opens none so, PEP
    446); git reads none of them.
    """

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd
        self.owner = os.getpid()  # a forked child's copy never kills its parent's git

    @classmethod
    def start(cls, work: Path, env: dict[str, str]) -> _SpawnedGit | None:
        """The started git, or None when it could not be started (no ``git`` on PATH)."""
        read, write = os.pipe()  # both ends non-inheritable (PEP 446): git gets stdout only
        actions = [
            (os.POSIX_SPAWN_DUP2, write, 1),
            (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
        ]
        try:
            pid = os.posix_spawnp("git", ["git", "-C", os.fspath(work), *_STATUS_V2], env,
                                  file_actions=actions, setsigdef=_RESTORED)  # fmt: skip
        except OSError:
            os.close(read)
            return None
        finally:
            os.close(write)
        return cls(pid, read)

    def answer(self) -> str | None:
        """Git's stripped stdout; None when it failed or ran past ``GIT_TIMEOUT_S`` (killed)."""
        data = self._read(time.monotonic() + GIT_TIMEOUT_S)
        if data is None:
            self.reap()
            return None
        if self._exit_code() != 0:
            return None
        return io.TextIOWrapper(io.BytesIO(data)).read().strip()  # as Popen's text mode reads

    def _read(self, deadline: float) -> bytes | None:
        """Everything git writes to stdout until it closes it; None past ``deadline``."""
        poll, chunks = select.poll(), []
        poll.register(self.fd, select.POLLIN)
        try:
            while (left := deadline - time.monotonic()) > 0 and poll.poll(left * 1000):
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
            return None
        finally:
            os.close(self.fd)
            self.fd = -1

    def _exit_code(self) -> int:
        """Wait for git's exit: its exit code (0 when already reaped elsewhere, as Popen)."""
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:  # SIGCHLD ignored: the kernel reaped it (subprocess: 0)
            return 0
        finally:
            self.pid = -1
        return os.waitstatus_to_exitcode(status)

    def reap(self) -> None:
        """Kill git if it still runs and wait for it; close the pipe (idempotent).

        In a process forked after the start, only the pipe's copy is closed: git is the
        parent's child (Popen's reap there finds no child and kills nothing either).
        """
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.pid > 0 and os.getpid() == self.owner:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = -1


class _PopenGit:
    """A ``git status`` started with ``subprocess.Popen`` (platforms without posix_spawnp)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def answer(self) -> str | None:
        """Git's stripped stdout; None when it failed or ran past ``GIT_TIMEOUT_S`` (killed)."""
        return _answer(self.proc)

    def reap(self) -> None:
        """Kill git if it still runs and wait for it; close its stdout."""
        _reap(self.proc)


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.returncode is None and proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _answer(proc: subprocess.Popen[str] | None) -> str | None:
    """A started git's stripped stdout, or None (not started, failed, or past 10 s: killed)."""
    if proc is None:
        return None
    try:
        out, _ = proc.communicate(timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    return out.strip() if proc.returncode == 0 else None


def collect_environment(
    *,
    commit: str | None = None,
    branch: str | None = None,
    dirty: bool | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Every environment key of the contract (``ENV_KEYS``), read now.

    Args:
        commit: overrides the commit read with git (e.g. ``$CI_COMMIT_SHA``).
        branch: overrides the branch read with git.
        dirty: overrides the dirty flag read with git.
        cwd: the directory whose git tree is read (default: the working directory).

    Returns:
        A dict with exactly the keys of ``ENV_KEYS``; values are str, int, bool or None (None:
        unknown or not applicable, e.g. no git tree, or ``tf32`` without CUDA; such a value is
        not logged as a param, ``track.stage.run_params``).
    """
    from parity_tracker import __version__

    env = git_info(cwd)
    if commit is not None:
        env["git_commit"] = commit
    if branch is not None:
        env["git_branch"] = branch
    if dirty is not None:
        env["git_dirty"] = dirty
    env.update(torch_flags())
    env["parity_tracker_version"] = __version__
    return {k: env.get(k) for k in ENV_KEYS}
