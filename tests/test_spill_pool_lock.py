"""Pool folders of live owners survive another process's orphan sweep (w11trust).

``capture.spill_pool`` used to call an owner dead when ``kill(pid, 0)`` said so: a live process
in another pid namespace sharing the temporary folder (a container) looks dead, and its folder
was removed under it (its next load raised). The owner now holds an ``fcntl.flock`` on the
folder's lock file for as long as it lives; the sweep removes a folder only when its own
non-blocking ``flock`` succeeds. The other namespace is simulated by renaming a live owner's
folder to a pid no process has (``kill`` says dead; the lock is the owner's still).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from parity_tracker.capture import spill_pool
from parity_tracker.capture.spill_pool import LOCK_NAME, PooledSpillDir

pytestmark = pytest.mark.usefixtures("fresh_pool")  # tests/conftest.py: a pool of its own

#: a pid above Linux's largest (``pid_max`` ≤ 2**22): ``kill`` says no such process
_NO_SUCH_PID = 4194305 + 1000

#: the owner: spills 4096 float32 of 0..4095, prints its folder, then on each line read from
#: stdin loads the record back and prints its sum (or the error), until stdin closes
_OWNER = """
import sys, torch
from parity_tracker.capture.spill_pool import PooledSpillDir
rec = PooledSpillDir(None).append(torch.arange(4096, dtype=torch.float32))
print(rec.pack.path.parent, flush=True)
for _line in sys.stdin:
    try:
        print(float(rec.load().double().sum()), flush=True)
    except Exception as exc:
        print("error", type(exc).__name__, flush=True)
"""


def _owner(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    folder = Path(proc.stdout.readline().strip())
    assert folder.parent == tmp_path and folder.name.startswith(f"parity-spill-pool-{proc.pid}-")
    return proc, folder


def _ask(proc: subprocess.Popen) -> str:
    proc.stdin.write("load\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def test_a_live_owner_whose_pid_looks_dead_keeps_its_folder(tmp_path):
    proc, folder = _owner(tmp_path)
    try:
        assert _ask(proc) == str(float(sum(range(4096))))  # 8386560.0, the spilled values
        elsewhere = tmp_path / f"parity-spill-pool-{_NO_SUCH_PID}-ns"  # as seen from another
        folder.rename(elsewhere)  # pid namespace: kill(pid, 0) says no such process
        with pytest.raises(ProcessLookupError):
            os.kill(_NO_SUCH_PID, 0)
        spill_pool._remove_orphans(str(tmp_path))  # another process's sweep
        assert elsewhere.is_dir() and (elsewhere / "pack-0.bin").exists()
        assert _ask(proc) == "8386560.0"  # the owner still reads its record
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    spill_pool._remove_orphans(str(tmp_path))  # the owner is gone now: its lock is free
    assert not elsewhere.exists()


def test_an_unlocked_folder_named_for_a_live_pid_is_removed(tmp_path):
    """The lock, not the pid, tells: a folder whose owner died (lock file free) is removed
    even when its pid now names a live process (reused, or this very test process)."""
    stale = tmp_path / f"parity-spill-pool-{os.getpid()}-old"
    stale.mkdir()
    (stale / LOCK_NAME).write_bytes(b"")
    (stale / "pack-0.bin").write_bytes(b"x" * 16)
    spill_pool._remove_orphans(str(tmp_path))
    assert not stale.exists()


def test_every_pool_folder_is_locked_by_its_owner(tmp_path):
    rec = PooledSpillDir(None).append(torch.from_numpy(np.arange(64, dtype=np.float32)))
    folder = rec.pack.path.parent
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]  # no work folder left
    fd = os.open(folder / LOCK_NAME, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    spill_pool._remove_orphans(str(tmp_path))  # this process's own folder: locked, kept
    assert np.array_equal(rec.load().numpy(), np.arange(64, dtype=np.float32))


def test_two_owners_sweeping_at_once_keep_both_folders(tmp_path):
    a, folder_a = _owner(tmp_path)
    b, folder_b = _owner(tmp_path)  # its own folder made after sweeping a's
    try:
        for name, proc in (("a", a), ("b", b)):
            assert _ask(proc) == "8386560.0", name
        assert folder_a.is_dir() and folder_b.is_dir()
    finally:
        for proc in (a, b):
            proc.stdin.close()
            proc.wait(timeout=60)
    deadline = time.monotonic() + 10
    while any(p.exists() for p in (folder_a, folder_b)) and time.monotonic() < deadline:
        time.sleep(0.05)  # each owner removes its own folder at exit
    assert list(tmp_path.iterdir()) == []
