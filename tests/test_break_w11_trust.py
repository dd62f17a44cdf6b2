"""Adversarial cases against w11trust's pinned-weight checks and spill-pool lock (w11brk1).

Every case builds a reference whose weight (or buffer) is used, then changed after its
capture, and a candidate whose weight holds the values the reference's weight was changed
to. Expected, independently: the reference's weight at capture time differs from the
candidate's at every one of its ``numel`` elements (each is the capture value ``+ 1``), so
the row is ``mismatch`` with ``numel`` mismatches, or an ``error`` saying the weight changed
after it was captured (its capture-time value not kept); never ``equal``. A weight changed
and changed back before the candidate runs holds its capture-time values again: ``equal``.

Silent pass found here (fixed, ``capture.snapshot._pin_hashable``): a parameter that is a
view with gaps of a larger storage (a column slice, ``w[:, ::2]``), an overlapping
``as_strided`` view or a conjugate view was held by reference without a content hash
(``digestible`` refuses those layouts), so an uncounted write to it (``.data.copy_``, a numpy
view of its base taken before the capture) read ``equal``.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

CHANGED = "changed after it was captured"
MODIFIED = "modified in place after it was captured"


class Use(nn.Module):
    """Uses its weight (a parameter, or a buffer) in its forward."""

    def __init__(self, w: torch.Tensor, as_buffer: bool = False) -> None:
        super().__init__()
        if as_buffer:
            self.register_buffer("weight", w)
        else:
            grad = w.is_floating_point() or w.is_complex()
            self.weight = nn.Parameter(w, requires_grad=grad)

    def forward(self, x):
        return x + self.weight.sum().real.float()


class After(nn.Module):
    """Runs ``fn()`` in its forward: after the previous module's capture, inside the run."""

    def __init__(self, fn=None) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        if self.fn is not None:
            self.fn()
        return x + 0.0


def _rand(shape, dtype):
    g = torch.Generator().manual_seed(7)
    return (torch.rand(shape, generator=g) * 4).to(dtype)


# layout -> (view, base): the weight, a view of ``base`` (its whole storage)
def _layout(name: str, shape: tuple[int, int], dtype: torch.dtype):
    r, c = shape
    if name == "whole":
        b = _rand(shape, dtype)
        return b, b
    if name == "gapped":  # every other column of a (r, 2c) buffer
        b = _rand((r, 2 * c), dtype)
        return b[:, ::2], b
    if name == "colslice":  # the first c columns of a (r, c + 3) buffer
        b = _rand((r, c + 3), dtype)
        return b[:, :c], b
    if name == "overlap":  # rows overlapping by all but one element
        b = _rand((r + c,), dtype)
        return b.as_strided(shape, (1, 1), 0), b
    if name == "offset":  # all but the first row of a flat buffer
        b = _rand((r + 1, c), dtype)
        return b[1:], b
    if name == "transposed":
        b = _rand((c, r), dtype)
        return b.t(), b
    if name == "channels_last":  # (r, c, 3, 3) stored as (r, 3, 3, c)
        b = _rand((r, 3, 3, c), dtype)
        return b.permute(0, 3, 1, 2), b
    raise AssertionError(name)


def _raw(base: torch.Tensor) -> np.ndarray:
    """A numpy view of ``base``'s bytes (taken before the capture: torch never sees writes)."""
    if base.dtype == torch.bfloat16:
        return base.view(torch.int16).numpy()
    return base.numpy()


def _changer(how: str, w_of, view: torch.Tensor, base: torch.Tensor, new: torch.Tensor):
    """``fn()`` that sets the reference's weight to ``new`` (or back to itself) by ``how``."""
    arr = _raw(base)  # now: before the capture

    def image(values: torch.Tensor) -> np.ndarray:
        tmp = base.clone()
        tmp.as_strided(view.shape, view.stride(), view.storage_offset()).copy_(values)
        return _raw(tmp).copy()

    if how == "numpy":
        return lambda: arr.__setitem__(Ellipsis, image(new))
    if how == "data":
        return lambda: w_of().data.copy_(new)
    if how == "no_grad":

        def fn():
            with torch.no_grad():
                w_of().copy_(new)

        return fn
    if how == "data_swap":  # the module's weight now another tensor: the captured one kept

        def fn():
            w_of().data = new.clone()

        return fn
    if how == "write_back":  # changed, then its old bytes written back: unchanged

        def fn():
            old = _raw(base).copy()
            arr[...] = image(new)
            arr[...] = old

        return fn
    raise AssertionError(how)


def _models(layout, shape, dtype, how, as_buffer=False):
    view, base = _layout(layout, shape, dtype)
    new = view + 1
    ref_use = Use(view, as_buffer)
    fn = _changer(how, lambda: ref_use.weight, view, base, new)
    cand_w = view.clone() if how == "write_back" else new.clone()
    return nn.Sequential(ref_use, After(fn)), nn.Sequential(Use(cand_w, as_buffer), After())


def _weight_row(rows: list[dict]) -> dict:
    (row,) = [r for r in rows if r["tag"].endswith(".weight")]
    return row


def _assert_verdict(row: dict, how: str, numel: int) -> None:
    if how == "write_back":
        assert (row["status"], row["mismatch_count"]) == ("equal", 0), row
    elif row["status"] == "error":
        assert how in ("numpy", "data", "no_grad"), row  # never for a swapped .data
        assert CHANGED in row["message"] or MODIFIED in row["message"], row
    else:
        assert (row["status"], row["mismatch_count"]) == ("mismatch", numel), row


def _check(ref, cand, eager) -> list[dict]:
    checker = TensorChecker(verbose=False, eager_mode=eager)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(torch.ones(3))
        cand(torch.ones(3))
        return checker.check("equal").to_rows()


SILENT = ["gapped", "colslice", "overlap"]  # were held without a hash: equal (fixed)
HASHED = ["whole", "offset", "transposed", "channels_last"]
HOWS = ["numpy", "data", "no_grad", "data_swap", "write_back"]


DTYPES = [torch.float32, torch.bfloat16, torch.int8, torch.complex64]
SHAPES = pytest.mark.parametrize("shape", [(4, 8), (256, 128)], ids=["small", "large"])
EAGER = pytest.mark.parametrize("eager", ["equal", None], ids=["eager", "deferred"])


def _weight_case(shape, layout, dtype, how, eager, as_buffer=False):
    ref, cand = _models(layout, shape, dtype, how, as_buffer)
    numel = 9 * shape[0] * shape[1] if layout == "channels_last" else shape[0] * shape[1]
    row = _weight_row(_check(ref, cand, eager))
    _assert_verdict(row, how, numel)


@EAGER
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", SILENT)
@SHAPES
def test_a_view_weight_changed_after_capture_is_never_equal(shape, layout, dtype, how, eager):
    """The silent pass (fixed): views with gaps or overlaps, every dtype."""
    _weight_case(shape, layout, dtype, how, eager)


@EAGER
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", HASHED)
@SHAPES
def test_a_dense_weight_changed_after_capture_is_never_equal(shape, layout, dtype, how, eager):
    _weight_case(shape, layout, dtype, how, eager)


@EAGER
@pytest.mark.parametrize("how", ["numpy", "write_back"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["whole", "gapped", "overlap", "channels_last"])
@SHAPES
def test_a_buffer_changed_after_capture_is_never_equal(shape, layout, dtype, how, eager):
    _weight_case(shape, layout, dtype, how, eager, as_buffer=True)


@pytest.mark.parametrize("eager", ["equal", None], ids=["eager", "deferred"])
@pytest.mark.parametrize("n", [8, 20000])
def test_a_conjugate_view_weight_written_through_data_is_never_equal(n, eager):
    """A weight that is ``x.conj()`` (the conjugate bit set): ``digestible`` refuses it."""
    base = _rand((n,), torch.complex64)
    ref_use = Use(base.conj())
    assert ref_use.weight.is_conj()
    new = (base.conj() + 1).resolve_conj()
    ref = nn.Sequential(ref_use, After(lambda: ref_use.weight.data.copy_(new)))
    cand = nn.Sequential(Use(new.clone()), After())
    _assert_verdict(_weight_row(_check(ref, cand, eager)), "data", n)


@pytest.mark.parametrize("capture_ops", [False, True], ids=["modules", "ops"])
@pytest.mark.parametrize("how", ["numpy", "data"])
def test_run_parity_gapped_weight_written_after_capture(capture_ops, how):
    from parity_tracker.run import run_parity
    from parity_tracker.tensor_checker import DumpMode

    ref, cand = _models("gapped", (64, 64), torch.bfloat16, how)
    res = run_parity(
        ref, cand, (torch.ones(3),), mode="equal", dump_mode=DumpMode.NOT,
        capture_ops=capture_ops, environment={"commit": "w11brk1"},
    )  # fmt: skip
    _assert_verdict(_weight_row(res.modules.to_pylist()), how, 64 * 64)


@pytest.mark.parametrize("n", [8, 1 << 16])
def test_a_weight_tied_in_the_reference_and_written_between_its_uses(n):
    """One parameter used by two modules, set to ones through numpy between the uses; the
    candidate's two weights are zeros then ones: the first use's row compares zeros with
    zeros (``equal``, or an ``error`` when the write reached its hashed hold), the second's
    ones with ones (``equal``)."""
    p = nn.Parameter(torch.zeros(n))
    arr = p.detach().numpy()
    a, b = Use(torch.zeros(n)), Use(torch.zeros(n))
    a.weight = b.weight = p
    ref = nn.Sequential(a, After(lambda: arr.fill(1.0)), b)
    cand = nn.Sequential(Use(torch.zeros(n)), After(), Use(torch.ones(n)))
    for eager in ("equal", None):
        arr.fill(0.0)
        rows = {r["tag"]: r for r in _check(ref, cand, eager) if r["tag"].endswith(".weight")}
        first, second = rows["checker_0.weight"], rows["checker_2.weight"]
        assert first["status"] == ("equal" if n * 4 < 64 << 10 else "error"), first
        assert (second["status"], second["mismatch_count"]) == ("equal", 0), second


_RESIZE_BUG = (
    "torch 2.13 copy-on-write resize_ bug (c10/core/impl/COW.cpp:124) reaches "
    "capture/snapshot.py Snapshotter.pin: a >= COW_MIN_BYTES parameter is held as a lazy "
    "clone, and one grown with .data.resize_ then written after its capture crashes"
)


class GrowWeight(nn.Module):
    """Grows ``owner.weight`` by 4 elements through ``.data.resize_`` and writes them."""

    def __init__(self, owner: nn.Module) -> None:
        super().__init__()
        self.owner = [owner]  # not a submodule

    def forward(self, x):
        w = self.owner[0].weight.data
        n = w.numel()
        w.resize_(n + 4)
        w[n:] = 1.0
        return x * 1.0


def _grown(n: int):
    ref_use, cand_use = Use(torch.zeros(n)), Use(torch.zeros(n))
    return nn.Sequential(ref_use, GrowWeight(ref_use)), nn.Sequential(
        cand_use, GrowWeight(cand_use)
    )


def test_a_small_weight_grown_after_its_capture_compares():
    ref, cand = _grown(1000)
    row = _weight_row(_check(ref, cand, None))
    assert (row["status"], row["mismatch_count"]) == ("equal", 0), row


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason=_RESIZE_BUG)
def test_a_large_weight_grown_after_its_capture_compares():
    ref, cand = _grown(1 << 16)
    row = _weight_row(_check(ref, cand, None))
    assert (row["status"], row["mismatch_count"]) == ("equal", 0), row


def test_a_large_weight_grown_after_its_capture_compares_with_the_way_out(monkeypatch):
    import math

    from parity_tracker.capture import snapshot

    monkeypatch.setattr(snapshot, "COW_MIN_BYTES", math.inf)
    ref, cand = _grown(1 << 16)
    row = _weight_row(_check(ref, cand, None))
    assert (row["status"], row["mismatch_count"]) == ("equal", 0), row


# -- the spill pool's lock ---------------------------------------------------------------------


def _spill_arange(n: int = 64):
    from parity_tracker.capture.spill_pool import PooledSpillDir

    return PooledSpillDir(None).append(torch.from_numpy(np.arange(n, dtype=np.float32)))


def test_a_file_system_without_flock_still_spills(fresh_pool, tmp_path, monkeypatch):
    """Lustre mounted ``noflock`` (ENOSYS), NFS without lockd (ENOLCK): every spill raised
    (an op-level run then read its candidate as never called); now the folder has no lock
    file and the sweep falls back to ``kill(pid, 0)``, as before the lock."""
    import errno

    from parity_tracker.capture import spill_pool

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(spill_pool.fcntl, "flock", no_flock)
    rec = _spill_arange()
    folder = rec.pack.path.parent
    assert np.array_equal(rec.load().numpy(), np.arange(64, dtype=np.float32))
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]
    assert not (folder / spill_pool.LOCK_NAME).exists()
    spill_pool._remove_orphans(str(tmp_path))  # named for this live process: kept
    assert np.array_equal(rec.load().numpy(), np.arange(64, dtype=np.float32))


def test_an_earlier_versions_folder_goes_by_its_pid(fresh_pool, tmp_path):
    from parity_tracker.capture import spill_pool

    dead = tmp_path / f"{spill_pool._PREFIX}{4194305 + 1000}-old"  # above pid_max: no process
    live = tmp_path / f"{spill_pool._PREFIX}{os.getpid()}-old"
    for d in (dead, live):
        d.mkdir()
        (d / "pack-0.bin").write_bytes(b"x" * 16)
    spill_pool._remove_orphans(str(tmp_path))
    assert not dead.exists() and (live / "pack-0.bin").exists()


def test_a_lock_file_that_is_a_link_is_left_alone(fresh_pool, tmp_path):
    from parity_tracker.capture import spill_pool

    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    odd = tmp_path / f"{spill_pool._PREFIX}{4194305 + 1000}-link"
    odd.mkdir()
    (odd / spill_pool.LOCK_NAME).symlink_to(target)
    spill_pool._remove_orphans(str(tmp_path))
    assert odd.is_dir() and target.exists()


def test_a_forked_child_never_frees_its_parents_folder(fresh_pool, tmp_path):
    """The child spills into a folder of its own, sweeps (the parent's folder is locked by
    the parent and by the child's inherited descriptor) and exits; the parent's folder, its
    lock and its record survive."""
    from parity_tracker.capture import spill_pool

    rec = _spill_arange()
    folder = rec.pack.path.parent
    pid = os.fork()
    if pid == 0:  # the child: its own folder, a sweep, then a plain exit (finalizers run)
        code = 1
        try:
            child = _spill_arange(8)
            spill_pool._remove_orphans(str(tmp_path))
            code = 0 if child.pack.path.parent != folder and folder.is_dir() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    spill_pool._remove_orphans(str(tmp_path))
    assert folder.is_dir()
    assert np.array_equal(rec.load().numpy(), np.arange(64, dtype=np.float32))


class _Stepped(nn.Module):
    """Its weight used at two steps; ``change()`` runs after the first (a decode loop)."""

    def __init__(self, w: torch.Tensor, change=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(w)
        self.change = change

    def forward(self, x):
        return x + self.weight.sum().float()


def _two_steps(m: nn.Module, rec) -> None:
    for step in range(2):
        rec(step)
        m(torch.ones(3))
        if step == 0 and m.change is not None:
            m.change()


@pytest.mark.parametrize("mode", ["equal", "allclose"])
@pytest.mark.parametrize("how", ["numpy", "data"])
@pytest.mark.parametrize("layout,shape", [
    ("whole", (4, 8)), ("whole", (256, 128)), ("gapped", (64, 64)), ("transposed", (256, 128)),
])  # fmt: skip
def test_a_decode_loop_weight_changed_between_steps_is_never_equal(layout, shape, how, mode):
    """Step 0: the reference's capture-time weight vs the candidate's (every element + 1):
    ``mismatch`` or ``error``; step 1: both the changed values (``equal``). The tag's status
    over its steps is its first failing one: never ``equal``."""
    from parity_tracker.run import run_parity
    from parity_tracker.tensor_checker import DumpMode

    view, base = _layout(layout, shape, torch.float32)
    new = view + 1
    ref = _Stepped(view)
    ref.change = _changer(how, lambda: ref.weight, view, base, new)
    cand = _Stepped(new.clone())
    res = run_parity(
        ref, cand, drive=_two_steps, mode=mode, dump_mode=DumpMode.NOT,
        environment={"commit": "w11brk1"},
    )  # fmt: skip
    rows = [r for r in res.modules.to_pylist() if r["tag"] == "checker_weight"]
    assert rows and all(r["status"] != "equal" for r in rows), rows


def _bare(w: torch.Tensor) -> nn.Module:
    """A bare ``nn.Module`` with a weight and an instance-assigned ``forward`` (the pattern of
    libraries that wrap a module's forward on the instance)."""
    m = nn.Module()
    m.weight = nn.Parameter(w, requires_grad=False)
    m.forward = lambda x: x + m.weight.sum()
    return m


def test_a_weight_used_by_an_instance_forward_is_captured_when_used():
    """The reference's weight is zeros when used and set to ones through numpy afterwards;
    the candidate's is ones: at use, 8 of 8 elements differ (``mismatch``, 8)."""
    w = torch.zeros(8)
    arr = w.numpy()
    ref = nn.Sequential(_bare(w), After(lambda: arr.fill(1.0)))
    cand = nn.Sequential(_bare(torch.ones(8)), After())
    row = _weight_row(_check(ref, cand, "equal"))
    assert (row["status"], row["mismatch_count"]) == ("mismatch", 8), row


class Tagged(torch.Tensor):
    """A plain-storage tensor subclass (no ``__torch_dispatch__``: ``as_subclass``)."""


class _TaggedUse(nn.Module):
    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(w.as_subclass(Tagged), requires_grad=False)

    def forward(self, x):
        return x + self.weight.sum().as_subclass(torch.Tensor)


@pytest.mark.parametrize("eager", ["equal", None], ids=["eager", "deferred"])
@pytest.mark.parametrize("n", [8, 1 << 16])
@pytest.mark.parametrize("how", ["numpy", "data", "unchanged"])
def test_a_subclass_weight_written_after_capture_is_never_equal(how, n, eager):
    """A weight of a ``torch.Tensor`` subclass was held by reference unhashed: zeros when
    used, ones afterwards through numpy (or ``.data``), against the candidate's ones, read
    ``equal``. Expected: ``mismatch`` (n of n) or the ``error``; unchanged (zeros against
    zeros): ``equal``."""
    ref_use = _TaggedUse(torch.zeros(n))
    arr = ref_use.weight.detach().as_subclass(torch.Tensor).numpy()
    change = {
        "numpy": lambda: arr.fill(1.0),
        "data": lambda: ref_use.weight.data.fill_(1.0),
        "unchanged": None,
    }[how]
    ref = nn.Sequential(ref_use, After(change))
    cand = nn.Sequential(_TaggedUse(torch.zeros(n) if change is None else torch.ones(n)), After())
    row = _weight_row(_check(ref, cand, eager))
    _assert_verdict(row, "write_back" if change is None else how, n)


def test_wrapper_subclass_tensors_that_differ_are_never_equal():
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    from parity_tracker.compare.core import compare_tensors

    zeros = two_tensor.TwoTensor(torch.zeros(8), torch.zeros(8))
    ones = two_tensor.TwoTensor(torch.ones(8), torch.ones(8))
    assert compare_tensors(zeros, ones, mode="equal").status != "equal"


def test_a_lock_file_that_is_a_fifo_never_hangs_the_sweep(tmp_path):
    """Opening a FIFO for reading waits for a writer: every process's first spill in that
    temporary folder hung in ``_remove_if_orphan``. The sweep runs in a child here (a hang
    fails the test on its timeout instead of stalling the suite)."""
    import subprocess
    import sys

    from parity_tracker.capture import spill_pool

    odd = tmp_path / f"{spill_pool._PREFIX}{4194305 + 1000}-fifo"  # above pid_max: no process
    odd.mkdir()
    os.mkfifo(odd / spill_pool.LOCK_NAME)
    code = (
        "import sys; from parity_tracker.capture import spill_pool as s; "
        "s._remove_orphans(sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
    assert not odd.exists()  # its lock was free: an orphan, removed


def test_checkers_in_four_threads_keep_their_own_pins():
    """Four threads, each its own checker and models (layouts and writes of the cases above),
    ten rounds each: every verdict as in one thread."""
    import threading

    cases = [
        ("gapped", (64, 64), "data"), ("whole", (256, 128), "numpy"),
        ("whole", (4, 8), "numpy"), ("transposed", (256, 128), "write_back"),
    ]  # fmt: skip
    failures: list[str] = []

    def work(layout, shape, how):
        try:
            for _ in range(10):
                ref, cand = _models(layout, shape, torch.float32, how)
                _assert_verdict(_weight_row(_check(ref, cand, "equal")), how, shape[0] * shape[1])
        except BaseException as exc:  # reported below
            failures.append(f"{layout} {how}: {exc!r}")

    threads = [threading.Thread(target=work, args=c) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, failures


@pytest.mark.parametrize("n", [8, 1 << 16])
def test_a_weight_shared_by_reference_and_candidate_written_between_their_uses(n):
    """One parameter in both models: zeros at the reference's use, set to ones through numpy
    before the candidate's. Captured zeros vs ones: ``mismatch`` (n of n) or the ``error``
    (a hashed hold the write reached); with no write: ``equal``."""
    for write in (True, False):
        p = nn.Parameter(torch.zeros(n))
        arr = p.detach().numpy()
        ref_use, cand_use = Use(torch.zeros(n)), Use(torch.zeros(n))
        ref_use.weight = cand_use.weight = p
        ref = nn.Sequential(ref_use, After(functools.partial(arr.fill, 1.0) if write else None))
        cand = nn.Sequential(cand_use, After())
        row = _weight_row(_check(ref, cand, "equal"))
        _assert_verdict(row, "numpy" if write else "write_back", n)


@pytest.mark.parametrize("capture_ops", [False, True], ids=["modules", "ops"])
@pytest.mark.parametrize(
    "layout,shape", [("whole", (4, 8)), ("whole", (256, 128)), ("gapped", (64, 64))]
)
def test_back_to_back_runs_see_a_weight_changed_between_them(layout, shape, capture_ops):
    """Three ``run_parity`` runs of the same models in one process; between the first and the
    second the reference's weight gets + 1 through numpy, between the second and the third its
    old bytes back: ``equal``, ``mismatch`` at every element, ``equal``."""
    from parity_tracker.run import run_parity
    from parity_tracker.tensor_checker import DumpMode

    view, base = _layout(layout, shape, torch.float32)
    arr, old = _raw(base), _raw(base).copy()
    ref, cand = nn.Sequential(Use(view), After()), nn.Sequential(Use(view.clone()), After())
    seen = []
    for k in range(3):
        res = run_parity(
            ref, cand, (torch.ones(3),), mode="equal", dump_mode=DumpMode.NOT,
            capture_ops=capture_ops, environment={"commit": "w11brk1"},
        )  # fmt: skip
        row = _weight_row(res.modules.to_pylist())
        seen.append((row["status"], row["mismatch_count"]))
        arr[...] = old + 1 if k == 0 else old
    assert seen == [("equal", 0), ("mismatch", shape[0] * shape[1]), ("equal", 0)]


@pytest.mark.parametrize("eager", ["equal", None], ids=["eager", "deferred"])
@pytest.mark.parametrize("how", ["replace", "data_swap", "in_place"])
@pytest.mark.parametrize("n", [8, 1 << 16])
def test_a_buffer_replaced_or_written_after_capture(n, how, eager):
    """Zeros when used; afterwards the module's buffer is another tensor of ones, gets a
    ``.data`` of ones, or is filled with ones in place; the candidate's is ones: the captured
    zeros differ at all n elements (``mismatch``, n)."""
    use = Use(torch.zeros(n), as_buffer=True)

    def change():
        if how == "replace":
            use.weight = torch.ones(n)
        elif how == "data_swap":
            use.weight.data = torch.ones(n)
        else:
            use.weight.fill_(1.0)

    ref = nn.Sequential(use, After(change))
    cand = nn.Sequential(Use(torch.ones(n), as_buffer=True), After())
    row = _weight_row(_check(ref, cand, eager))
    assert (row["status"], row["mismatch_count"]) == ("mismatch", n), row
