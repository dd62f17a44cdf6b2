"""Start the ranks of a sharded run, capture on each, and hand rank 0's merge one folder.

Two ways in, one procedure (``record.py`` per rank, ``merge.py`` on rank 0):

- :func:`launch` (what ``parity-tracker run`` does for a :class:`ShardedCandidate`): spawns
  ``world_size`` processes with ``torch.multiprocessing`` (a free loopback port,
  ``MASTER_ADDR=127.0.0.1``), each initialises the process group (gloo on the CPU, nccl when
  the case runs on CUDA), builds its sharded candidate with ``candidate.build(rank,
  world_size)``, runs and records it, writes ``rank{r}.*`` and exits. The launching process,
  which holds the reference, then runs it once unsharded and merges.
- :func:`run_sharded` (a user's own launcher, e.g. ``torchrun``): called on every rank after
  ``init_process_group``; each rank records and writes, rank 0 waits for every rank's file
  (up to the timeout), runs the reference and merges, and returns the ``RunResult``; the other
  ranks return None.

No process protocol of our own: the ranks talk only through torch's collectives (inside the
candidate's forward, and one ``broadcast_object_list`` of the folder in ``run_sharded``) and
through their files. Every collective has the process group's timeout, so a rank that raises
makes the others' collectives fail after ``timeout_s`` instead of hanging; each rank still
writes what it captured and its error, and the merge turns a rank error into a FAILED run.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from parity_tracker.distributed.record import ShardRecorder, error_record, write_rank

#: Default collective timeout (seconds) of a launched run's process group.
DEFAULT_TIMEOUT_S = 120.0


@dataclass
class RankCase:
    """What ``ShardedCandidate.build(rank, world_size)`` may return instead of a module.

    Attributes:
        model: this rank's sharded candidate (``parallelize_module`` output, or a user's own
            Megatron-style module).
        inputs: this rank's positional inputs (a tuple or one tensor), e.g. its slice of the
            sequence under sequence parallelism. None: the case's inputs.
        drive: this rank's ``drive(model, rec)`` for multi-step runs (``rec(k)`` sets the step,
            ``rec.register(tag, t)`` registers a manual tensor).
    """

    model: torch.nn.Module
    inputs: Any = None
    drive: Callable[..., Any] | None = None


@dataclass
class ShardedCandidate:
    """A candidate sharded across ranks: how each rank builds it, and how to run the ranks.

    Give it as a ``ParityCase``'s ``candidate`` (``pipeline.run_target.run_case`` launches it)
    or to :func:`launch`.

    Attributes:
        build: ``build(rank, world_size) -> nn.Module | RankCase``, called in each rank's
            process after the process group is up (so it may create a ``DeviceMesh`` and call
            ``parallelize_module``). It must be picklable (a module-level function or a
            ``functools.partial`` of one): the ranks are spawned processes.
        world_size: number of ranks (processes).
        backend: ``"gloo"`` or ``"nccl"``; None: nccl when ``device`` is CUDA, else gloo.
        device: where the candidate runs (``"cpu"`` or ``"cuda"``); nccl ranks use
            ``cuda:{rank}``.
        placements: declared ``{glob: "shard(d)" | "replicate" | "partial"}`` for plain
            per-rank tensors whose placement cannot be inferred (``placements.py``).
        timeout_s: the process group's collective timeout, and the longest the launcher waits
            for a rank beyond it.
    """

    build: Callable[[int, int], Any]
    world_size: int
    backend: str | None = None
    device: str = "cpu"
    placements: Mapping[str, str] | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    def resolved_backend(self) -> str:
        """The backend to use (see ``backend``)."""
        if self.backend:
            return self.backend
        return "nccl" if str(self.device).startswith("cuda") else "gloo"


def free_port() -> int:
    """A TCP port free on the loopback interface now (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def capture_rank(
    rank_case: Any, inputs: Any, drive: Callable | None, recorder: ShardRecorder, seed: int
) -> None:
    """Run this rank's candidate once (or its drive) in eval mode, no grad, hooked."""
    from parity_tracker.run.run import _clone_inputs, _eval_mode, _forward, _seed_all

    case = rank_case if isinstance(rank_case, RankCase) else RankCase(rank_case)
    run_inputs = case.inputs if case.inputs is not None else inputs
    run_drive = case.drive if case.drive is not None else drive
    _seed_all(seed)
    with _eval_mode(case.model), torch.no_grad(), recorder.hooked(case.model):
        if run_drive is not None:
            run_drive(case.model, recorder)
        else:
            _forward(case.model, _clone_inputs(run_inputs))


def _rank_main(
    rank: int, candidate: ShardedCandidate, inputs: Any, out_dir: str, port: int, seed: int
) -> None:
    """One spawned rank: process group, build, capture, write; never raises."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    recorder, error = ShardRecorder(), None
    backend, n = candidate.resolved_backend(), candidate.world_size
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        timeout = datetime.timedelta(seconds=candidate.timeout_s)
        dist.init_process_group(backend, rank=rank, world_size=n, timeout=timeout)
        capture_rank(candidate.build(rank, n), inputs, None, recorder, seed)
    except BaseException as exc:  # recorded in the rank's file; the merge fails the run
        error = error_record(exc, rank)
    finally:
        write_rank(out_dir, rank, recorder, error)
        if dist.is_initialized():
            with contextlib.suppress(Exception):  # a broken group after a timeout
                dist.destroy_process_group()


def _wait(processes: list[Any], deadline: float) -> None:
    """Join every rank until ``deadline`` (monotonic); terminate the ones still running."""
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.terminate()
            p.join(5)


def spawn_ranks(candidate: ShardedCandidate, inputs: Any, out_dir: str, seed: int = 0) -> None:
    """Spawn the ranks (``torch.multiprocessing``), wait for them, return when all are done.

    Start method ``forkserver`` where the platform has it (Linux, macOS): a server process
    imports torch once and every rank of every run is forked from it, so a rank does not pay
    torch's import (seconds) again; ``spawn`` elsewhere. Either way a rank shares no state
    with the launching process: arguments travel pickled.

    A rank still running ``timeout_s + 60`` s after the start (beyond its own collective
    timeout plus start-up) is terminated; the merge reports it as having written no result.
    """
    import multiprocessing

    import torch.multiprocessing as mp

    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    if method == "forkserver":  # torch imported once, in the server; each rank forks from it
        multiprocessing.set_forkserver_preload(["torch", "parity_tracker.distributed.launch"])
    ctx = mp.start_processes(
        _rank_main, args=(candidate, inputs, out_dir, free_port(), seed),
        nprocs=candidate.world_size, join=False, start_method=method,
    )  # fmt: skip
    _wait(ctx.processes, time.monotonic() + candidate.timeout_s + 60)


def launch(
    reference: torch.nn.Module,
    candidate: ShardedCandidate,
    inputs: Any = None,
    *,
    drive: Callable[..., Any] | None = None,
    settings: Mapping[str, Any] | None = None,
    **run_kwargs: Any,
) -> Any:
    """Run a sharded candidate on spawned ranks against one unsharded reference run.

    The reference runs once, unsharded, in this process; the result is one ``RunResult``.

    Args:
        reference: the unsharded reference model.
        candidate: the :class:`ShardedCandidate`.
        inputs: positional inputs of one forward (every rank gets them unless its
            ``RankCase`` gives its own); exactly one of ``inputs`` and ``drive``.
        drive: the reference's ``drive(model, rec)``; the ranks' drives come from their
            ``RankCase``.
        settings: the run's settings (``merge.merge_run`` adds ``world_size``, ``backend``,
            ``placements``; ``distributed`` defaults to ``tp{world_size}``).
        **run_kwargs: ``mode``, ``tolerances``, ``dump_mode``, ``dump_path``, ``seed``,
            ``environment``, ``align`` (as ``run_parity``).

    Returns:
        The ``RunResult``: ``modules`` rows carry ``ranks``; ``summary["distributed"]`` holds
        world size, backend, placements used, rank errors and the merge's peak bytes.

    Raises:
        InputError: see ``merge.merge_run``.
    """
    from parity_tracker.distributed.merge import merge_run

    with tempfile.TemporaryDirectory(prefix="parity-ranks-") as out_dir:
        spawn_ranks(candidate, inputs, out_dir, int(run_kwargs.get("seed", 0)))
        return merge_run(
            reference, out_dir, candidate.world_size, inputs=inputs, drive=drive,
            placements=candidate.placements, backend=candidate.resolved_backend(),
            settings=settings, **run_kwargs,
        )  # fmt: skip


def run_sharded(
    candidate: torch.nn.Module | RankCase,
    *,
    reference: torch.nn.Module | None = None,
    inputs: Any = None,
    drive: Callable[..., Any] | None = None,
    reference_inputs: Any = None,
    reference_drive: Callable[..., Any] | None = None,
    placements: Mapping[str, str] | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    settings: Mapping[str, Any] | None = None,
    **run_kwargs: Any,
) -> Any:
    """A sharded run from a user's own launcher (``torchrun``): call it on every rank.

    The process group must be initialised. Every rank runs and records its candidate and
    writes its files into ``out_dir``; rank 0 then waits until every rank's file is there (or
    ``timeout_s`` passed), runs ``reference`` once unsharded and merges.

    Args:
        candidate: this rank's sharded model (or a :class:`RankCase`).
        reference: the unsharded reference; needed on rank 0 only.
        inputs: this rank's inputs (its sequence slice under sequence parallelism).
        drive: this rank's ``drive(model, rec)``, instead of ``inputs``.
        reference_inputs: the reference's inputs (default: ``inputs``).
        reference_drive: the reference's drive (default: ``drive``).
        placements: declared placements (``placements.py``).
        out_dir: a folder every rank can write and rank 0 can read (a shared filesystem
            across nodes); default: a temporary folder made by rank 0, sent to the others
            with ``broadcast_object_list`` and deleted after the merge.
        timeout_s: how long rank 0 waits for the other ranks' files.
        settings: the run's settings (see ``launch``).
        **run_kwargs: as ``launch``.

    Returns:
        The ``RunResult`` on rank 0 (log it with ``parity_tracker.track.log_run``), None on
        the other ranks.

    Raises:
        InputError: no process group, or no ``reference`` on rank 0.
    """
    import torch.distributed as dist

    from parity_tracker.errors import InputError

    if not dist.is_initialized():
        raise InputError("run_sharded needs torch.distributed.init_process_group() first")
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0 and reference is None:
        raise InputError("run_sharded: pass the unsharded `reference` on rank 0")
    tmp = None
    if out_dir is None:
        tmp = tempfile.mkdtemp(prefix="parity-ranks-") if rank == 0 else None
        box = [tmp]
        dist.broadcast_object_list(box, src=0)
        out_dir = box[0]
    recorder, error = ShardRecorder(), None
    try:
        capture_rank(candidate, inputs, drive, recorder, int(run_kwargs.get("seed", 0)))
    except Exception as exc:
        error = error_record(exc, rank)
    write_rank(out_dir, rank, recorder, error)
    if rank != 0:
        return None
    return _merge_when_written(
        reference, out_dir, n, timeout_s, tmp, inputs=reference_inputs or inputs,
        drive=reference_drive or drive, placements=placements,
        backend=dist.get_backend(), settings=settings, **run_kwargs,
    )  # fmt: skip


def _merge_when_written(reference, out_dir, n, timeout_s, tmp, **kwargs) -> Any:
    """Rank 0: wait for every ``rank{r}.json`` (or the timeout), merge, drop a temp folder."""
    import shutil

    from parity_tracker.distributed.merge import merge_run

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all((Path(out_dir) / f"rank{r}.json").exists() for r in range(n)):
            break
        time.sleep(0.2)
    try:
        return merge_run(reference, out_dir, n, **kwargs)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
