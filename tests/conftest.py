"""Shared test set-up: no telemetry, no network, tracking stores only under tmp paths.

Fixtures any test may use (mlflow is imported only when one of them is requested):

- ``sqlite_template`` (session): a SQLite MLflow database created and migrated once per
  session; never written to by tests, only copied.
- ``sqlite_tracking_uri`` (function): ``sqlite:///<tmp_path>/mlflow.db``, a fresh copy of the
  template, so each test starts from an empty, already-migrated store in well under a second.
  Experiments created through ``parity_tracker.track.store`` put their artifacts in
  ``<tmp_path>/artifacts``.
- ``mlflow_server`` (session, mark your test ``@pytest.mark.server``): a real ``mlflow server``
  on 127.0.0.1 at a free port, backend a copy of the template, artifacts proxied
  (``--serve-artifacts``) into a tmp folder, waited for on ``/health`` and stopped by its pid at
  the end of the session. Yields its ``http://127.0.0.1:PORT`` URI. Runs from all tests share
  it: use a unique experiment name per test (e.g. from ``request.node.name``).
- ``in_tmp_cwd`` (function): ``chdir`` into ``tmp_path`` so the embedded default store,
  ``./.parity/spool`` and ``./.parity/cache`` land there.
- ``compiled`` (function): the comparison's compiled loop (``compare.fused.kernel()``); the
  test is skipped without numba or with ``PARITY_NO_KERNEL`` (tests/test_budget_scan.py has
  its own ``compiled``: the budget's scan).
- ``night_env`` (function): ``in_tmp_cwd`` plus a fresh ``sqlite_tracking_uri`` as
  ``$MLFLOW_TRACKING_URI`` and the night tests' matrix (``tests/night_helpers.py``) as
  ``nightly.toml``; returns ``{"uri", "cwd", "cfg"}``.

Shared helpers (not fixtures) are in ``tests/helpers.py``.

Hygiene, for every session: target checkpoints are cached under a session tmp folder
(``PARITY_TRACKER_CACHE_DIR``), the system temporary folder (``tempfile.tempdir``,
``$TMPDIR``: default dumps, spill files) is a session tmp folder, and the session FAILS
when the run left a file in the checkout that was not there before (``git status
--porcelain --ignored``, tool caches aside), so ``make test`` leaves ``git status`` clean
and writes nothing into ``./.parity``.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis.configuration import set_hypothesis_home_dir

# Hypothesis keeps no example database and its caches in a temporary folder: tests write
# nothing into the checkout (./.hypothesis).
hypothesis_settings.register_profile("parity", database=None)
hypothesis_settings.load_profile("parity")
_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="parity-tests-hypothesis-")
set_hypothesis_home_dir(_HYPOTHESIS_HOME)
atexit.register(shutil.rmtree, _HYPOTHESIS_HOME, True)

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# A refused connection to a test server must fail fast, not after MLflow's default retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
# ...and parity_tracker's own retry window on server faults (default 90 s) is off unless a test
# sets it (tests/test_server_stack.py does, for its restart).
os.environ.setdefault("PARITY_TRACKER_STORE_RETRY_S", "0")


REPO = Path(__file__).resolve().parents[1]
_STATUS_KEY = pytest.StashKey[set]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Remember the checkout's status before any test runs."""
    from helpers import git_status

    before = git_status(REPO)
    if before is not None:
        session.stash[_STATUS_KEY] = before


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when tests left files in the checkout (see the module docstring)."""
    from helpers import git_status, new_changes

    before = session.stash.get(_STATUS_KEY, None)
    after = git_status(REPO) if before is not None else None
    if after is None:
        return
    left = new_changes(before, after)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "tests left files in the checkout (write under tmp_path):\n  " + "\n  ".join(left)
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def _target_cache(tmp_path_factory: pytest.TempPathFactory):
    """Target checkpoints (digits-cnn's trained weights) cached in a session tmp folder."""
    if "PARITY_TRACKER_CACHE_DIR" in os.environ:
        yield Path(os.environ["PARITY_TRACKER_CACHE_DIR"])
        return
    path = tmp_path_factory.mktemp("target-cache")
    os.environ["PARITY_TRACKER_CACHE_DIR"] = str(path)
    try:
        yield path
    finally:
        os.environ.pop("PARITY_TRACKER_CACHE_DIR", None)


@pytest.fixture(scope="session", autouse=True)
def _session_tempdir(tmp_path_factory: pytest.TempPathFactory):
    """The system temporary folder of the session is a pytest tmp folder.

    ``run_parity`` dumps under ``<system temp>/parity-dumps`` when no ``dump_path`` is given
    (``run.run.default_dump_root``): without this, every failing run of a test left a folder
    in the machine's ``/tmp`` (2,400 of them by 2026-12-01). ``tempfile.tempdir`` (this
    process) and ``$TMPDIR`` (subprocesses) point into the session's tmp folder, restored at
    the end; pytest's own base folder is fixed before (``mktemp`` first).
    """
    path = tmp_path_factory.mktemp("systemp")
    saved, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = str(path), str(path)
    try:
        yield path
    finally:
        tempfile.tempdir = saved
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a migrated, empty SQLite MLflow database (made once per session; copy it)."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "template.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{path}")
    client.search_experiments(max_results=1)  # creates and migrates the schema
    return path


@pytest.fixture
def sqlite_tracking_uri(sqlite_template: Path, tmp_path: Path) -> str:
    """``sqlite:///<tmp_path>/mlflow.db``: a private copy of the migrated template."""
    db = tmp_path / "mlflow.db"
    shutil.copyfile(sqlite_template, db)
    return f"sqlite:///{db}"


@pytest.fixture
def compiled():
    """The compiled comparison loop, or skip (no numba, or ``PARITY_NO_KERNEL`` set)."""
    pytest.importorskip("numba")
    from parity_tracker.compare import fused

    fn = fused.kernel()
    if fn is None:
        pytest.skip("compiled loop disabled (PARITY_NO_KERNEL)")
    return fn


@pytest.fixture
def in_tmp_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test with ``tmp_path`` as working directory; returns it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture
def night_env(in_tmp_cwd: Path, sqlite_tracking_uri: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A fresh store as ``$MLFLOW_TRACKING_URI`` and ``night_helpers.MATRIX`` written as
    ``nightly.toml`` in the tmp working directory: ``{"uri", "cwd", "cfg"}``."""
    from night_helpers import MATRIX

    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_tracking_uri)
    monkeypatch.delenv("PARITY_TEST_PERTURB", raising=False)
    cfg = in_tmp_cwd / "nightly.toml"
    cfg.write_text(MATRIX)
    return {"uri": sqlite_tracking_uri, "cwd": in_tmp_cwd, "cfg": str(cfg)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"mlflow server exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"mlflow server not healthy after {timeout_s}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def mlflow_server(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory):
    """A real ``mlflow server`` on 127.0.0.1 for the session; yields its http URI."""
    root = tmp_path_factory.mktemp("mlflow-server")
    db = root / "server.db"
    shutil.copyfile(sqlite_template, db)
    port = _free_port()
    log = root / "server.log"
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{db}",
        "--serve-artifacts", "--artifacts-destination", str(root / "artifacts"),
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the group led by our server's pid
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# ---------------------------------------------------------------------------------------------
# a small model pair with one injected divergence (used by the run / track tests; reuse freely)


def _tiny_classes():
    import torch
    from torch import nn

    class TinyNet(nn.Module):
        """fc1 (4→8) → ReLU → fc2 (8→3); float32."""

        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(4, 8)
            self.act = nn.ReLU()
            self.fc2 = nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.act(self.fc1(x)))

    class TinyNetScaled(TinyNet):
        """TinyNet with the injected divergence: the ReLU output is scaled by 1.001 (float32)
        between ``act`` and ``fc2``, so the first divergent tag is ``checker_fc2_input_0``."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.act(self.fc1(x)) * 1.001)

    return TinyNet, TinyNetScaled


@pytest.fixture
def tiny_pair():
    """``(reference, candidate, inputs)``: TinyNet vs TinyNetScaled with identical weights
    (seed 0) and ``inputs = (x,)``, ``x`` of shape (5, 4), float32 (seed 1)."""
    import torch

    tiny_net, tiny_scaled = _tiny_classes()
    torch.manual_seed(0)
    reference = tiny_net()
    candidate = tiny_scaled()
    candidate.load_state_dict(reference.state_dict())
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    return reference, candidate, (x,)


@pytest.fixture
def tiny_equal_pair():
    """``(reference, candidate, inputs)``: two TinyNet copies with identical weights."""
    import copy

    import torch

    tiny_net, _ = _tiny_classes()
    torch.manual_seed(0)
    reference = tiny_net()
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    return reference, copy.deepcopy(reference), (x,)


#: Headless Chromium flags of the browser tests (no network beyond localhost, no sandbox: CI
#: runs as root in a container).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _chromium() -> str | None:
    for path in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if path and os.access(path, os.X_OK):
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (playwright) for the browser tests; skips when chromium is missing."""
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium not found (install Debian's 'chromium' package: make browser)")
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def gc_state():
    """Restore the garbage collector's state whatever a test does to it."""
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


@pytest.fixture
def fresh_pool(tmp_path, monkeypatch):
    """A spill pool of this test's own (``capture.spill_pool.pool``), its files under
    ``tmp_path`` (the system temp folder for the test); drained afterwards."""
    from parity_tracker.capture import spill_pool

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pool = spill_pool.SpillPool()
    monkeypatch.setattr(spill_pool, "pool", pool)
    yield pool
    pool.drain()
