"""Adversarial cases for the op-store spill pool (``capture.spill_pool``, w10brk2).

A pooled pack file is written again from offset 0; anything that can still read its old bytes
then reads another tensor's. Every expected value is a numpy copy taken before anything spills.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.capture import spill_pool, store
from parity_tracker.capture.spill_pool import PooledSpillDir, SpillPool
from parity_tracker.capture.tags import module_tag

pytestmark = pytest.mark.usefixtures("fresh_pool")  # tests/conftest.py: a pool of its own


def _values(seed: int, n: int = 1 << 12) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def _spill(values: np.ndarray, spill: PooledSpillDir | None = None):
    return (spill or PooledSpillDir(None)).append(torch.from_numpy(values.copy()))


def _overwrite_pool(n: int = 8) -> list:
    """Records that take every free file and write it from offset 0 (n × 16 KiB each)."""
    spill = PooledSpillDir(None)
    return [_spill(np.full(1 << 12, 1e6 + i, np.float32), spill) for i in range(n)]


# ------------------------------------------------------------------ records and aliases


def test_an_alias_outlives_its_base_and_the_file_stays_out_of_the_pool(fresh_pool):
    a = _values(0)
    rec = _spill(a)
    alias = rec.alias(torch.from_numpy(a.copy()))
    del rec
    gc.collect()
    junk = _overwrite_pool()
    assert all(j.pack is not alias.pack for j in junk)
    assert np.array_equal(alias.load().numpy(), a)


# w10brk2 bug (fixed): Spilled.delete() on a pooled record returns its file to the pool while
# the record (or an alias of it) can still load: the next spill rewrites the file and load()
# returns the other tensor's bytes silently (before: OSError on a closed file)
def test_a_deleted_record_never_loads_another_tensors_bytes(fresh_pool):
    a = _values(1)
    rec = _spill(a)
    rec.delete()
    junk = _overwrite_pool()
    try:
        got = rec.load().numpy()
    except OSError:
        return  # an error is fine
    assert np.array_equal(got, a), (got[:3], junk[0].pack.path)


# w10brk2 bug (fixed): Spilled.alias keeps its base alive but not the base's span: base.delete()
# pools the file while the alias (a borrowed snapshot) still reads it
def test_an_alias_survives_an_explicit_delete_of_its_base(fresh_pool):
    a = _values(2)
    rec = _spill(a)
    alias = rec.alias(torch.from_numpy(a.copy()))
    rec.delete()
    del rec
    junk = _overwrite_pool()
    try:
        got = alias.load().numpy()
    except OSError:
        return
    assert np.array_equal(got, a), (got[:3], len(junk))


# w10brk2 bug (fixed): the current pack is pooled when its last record dies DURING an append
# into it (a gc pass or another thread frees it inside SpillDir.append, after the owner check):
# the new record lies in a pooled file that the next spill rewrites from offset 0
def test_a_record_freed_during_an_append_does_not_pool_the_file_being_written(
    fresh_pool, monkeypatch
):
    a, b = _values(3), _values(4)
    spill = PooledSpillDir(None)
    box = [_spill(a, spill)]
    flat_cpu = store._flat_cpu

    def freeing(t):  # the last record of the current pack dies while the append runs
        box.clear()
        return flat_cpu(t)

    monkeypatch.setattr(store, "_flat_cpu", freeing)
    kept = spill.append(torch.from_numpy(b.copy()))
    monkeypatch.setattr(store, "_flat_cpu", flat_cpu)
    junk = _overwrite_pool()
    assert all(j.pack is not kept.pack for j in junk)
    assert np.array_equal(kept.load().numpy(), b)


def test_records_freed_by_another_thread_never_expose_a_live_span(fresh_pool):
    values = [_values(10 + i) for i in range(40)]
    kept, errors = [], []
    spill = PooledSpillDir(None)

    def writer(lo: int, hi: int) -> None:
        try:
            own = PooledSpillDir(None)
            for i in range(lo, hi):
                rec = _spill(values[i], own if i % 2 else spill)
                if i % 3 == 0:
                    kept.append((i, rec))  # the rest are freed at once
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k * 10, k * 10 + 10)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    junk = _overwrite_pool()
    assert not errors and len(junk) == 8
    for i, rec in kept:
        assert np.array_equal(rec.load().numpy(), values[i]), i


# ------------------------------------------------------------------ loaded views


def _kept_view(t: torch.Tensor, how: str):
    """What a user keeps of a loaded tensor ``t`` (``t`` itself is dropped on return)."""
    from parity_tracker.compare.hashing import array_in_place, numpy_in_place

    if how == "numpy":
        return t.numpy()
    if how == "in_place":
        return numpy_in_place(t)
    if how == "array_in_place":
        return array_in_place(t[::2])
    if how == "dlpack":
        return np.from_dlpack(t)
    if how == "view":
        return t[7:].view(torch.int32)
    return t


@pytest.mark.parametrize("how", ["tensor", "numpy", "in_place", "array_in_place", "dlpack", "view"])
def test_a_view_of_a_loaded_tensor_keeps_the_file_out_of_the_pool(fresh_pool, how):
    a = _values(5)
    rec = _spill(a)
    path = rec.pack.path
    keep = _kept_view(rec.load(), how)
    expected = {"array_in_place": a[::2], "view": a[7:].view(np.int32)}.get(how, a)
    del rec
    gc.collect()
    junk = _overwrite_pool()
    assert all(j.pack.path != path for j in junk)  # still read through ``keep``
    got = keep.numpy() if isinstance(keep, torch.Tensor) else np.asarray(keep)
    assert np.array_equal(got, expected)
    del keep
    gc.collect()
    assert fresh_pool.free_bytes >= 0


def test_a_private_write_to_a_loaded_tensor_never_reaches_the_file(fresh_pool):
    a = _values(6)
    rec = _spill(a)
    t = rec.load()
    t.mul_(3)  # a private map: the page is copied
    assert np.array_equal(rec.load().numpy(), a)
    del t, rec
    gc.collect()
    again = _spill(a)
    assert np.array_equal(again.load().numpy(), a)


# ------------------------------------------------------------------ fork, pool limit, folders


def _drop_in_child(box: list) -> None:
    box.clear()
    gc.collect()


# w10brk2 bug (fixed): a forked child that drops an inherited record closes and UNLINKS the
# parent's live pack file (SpillPool.put: not this pid -> _PooledPack.close), so the parent's
# next load raises 'removed or cut' (same as _PackFile.free before the pool)
def test_a_forked_child_dropping_an_inherited_record_leaves_the_parents_file(fresh_pool):
    a = _values(7)
    box = [_spill(a)]
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_drop_in_child, args=(box,))
    child.start()
    child.join()
    assert child.exitcode == 0
    assert np.array_equal(box[0].load().numpy(), a)


def _spill_in_child(path: str) -> None:
    rec = _spill(np.full(1 << 12, 99, np.float32))
    assert not str(rec.pack.path).startswith(path)


def test_a_forked_child_spilling_never_writes_a_pooled_parent_file(fresh_pool):
    a = _values(8)
    rec = _spill(a)
    path = rec.pack.path
    view = rec.load()  # keeps the bytes mapped; the record goes, the file is pooled after view
    del rec
    gc.collect()
    del view
    gc.collect()
    assert fresh_pool.free_bytes > 0
    with open(path, "rb") as f:
        before = f.read()
    child = multiprocessing.get_context("fork").Process(
        target=_spill_in_child, args=(str(path.parent),)
    )
    child.start()
    child.join()
    assert child.exitcode == 0
    with open(path, "rb") as f:
        assert f.read() == before
    again = _spill(a)
    assert again.pack.path == path and np.array_equal(again.load().numpy(), a)


def test_past_the_limit_a_file_is_closed_and_live_records_still_read(tmp_path, monkeypatch):
    pool = SpillPool(limit=1 << 14)  # one 16 KiB file
    monkeypatch.setattr(spill_pool, "pool", pool)
    vals = [_values(30 + i) for i in range(3)]
    recs = [_spill(v) for v in vals]  # three files (three writers)
    paths = [r.pack.path for r in recs]
    del recs[0], recs[0]
    gc.collect()
    assert pool.free_bytes == 1 << 14 and sum(p.exists() for p in paths[:2]) == 1
    junk = _overwrite_pool(3)
    assert np.array_equal(recs[0].load().numpy(), vals[2]) and len(junk) == 3


def test_a_file_truncated_while_free_is_never_reused(fresh_pool):
    a = _values(9)
    rec = _spill(a)
    path = rec.pack.path
    del rec
    gc.collect()
    os.truncate(path, 100)
    other = _spill(_values(10))
    assert other.pack.path != path and not path.exists()
    assert np.array_equal(other.load().numpy(), _values(10))


def test_a_changed_temp_folder_moves_the_pool_and_old_records_still_read(
    fresh_pool, tmp_path, monkeypatch
):
    a, b = _values(11), _values(12)
    rec = _spill(a)
    second = tmp_path / "second"
    second.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(second))
    other = _spill(b)
    assert str(other.pack.path).startswith(str(second))
    assert np.array_equal(rec.load().numpy(), a) and np.array_equal(other.load().numpy(), b)
    path = rec.pack.path
    del rec
    gc.collect()
    assert not path.exists()  # not of the pool's folder now: deleted with its record


def test_an_explicit_spill_root_inside_the_temp_folder_is_pooled(fresh_pool, tmp_path):
    root = tmp_path / "mine"
    spill = PooledSpillDir(root)
    rec = _spill(_values(13), spill)
    assert rec.pack.path.parent.parent == tmp_path  # the pool's folder, not under ``root``
    assert np.array_equal(rec.load().numpy(), _values(13))


# w10brk2 bug (fixed): _remove_orphans -> _alive(int(pid)) raises OverflowError for a folder
# 'parity-spill-pool-<huge number>-*' of this user (only OSError is suppressed): every op-level
# spill of the process then fails
def test_an_odd_orphan_folder_name_never_breaks_a_spill(fresh_pool, tmp_path):
    (tmp_path / "parity-spill-pool-99999999999999999999-x").mkdir()
    rec = _spill(_values(14))
    assert np.array_equal(rec.load().numpy(), _values(14))


def test_a_live_process_folder_is_not_removed_as_an_orphan(fresh_pool, tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        live = tmp_path / f"parity-spill-pool-{sleeper.pid}-x"
        live.mkdir()
        (live / "pack-0.bin").write_bytes(b"x" * 10)
        dead = tmp_path / "parity-spill-pool-0999999-y"  # no such pid (max 4194304)
        dead.mkdir()
        _spill(_values(15))
        assert live.is_dir() and (live / "pack-0.bin").exists() and not dead.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_nothing_is_left_in_the_temp_folder_after_the_process_exits(tmp_path):
    code = (
        "import gc, numpy as np, torch\n"
        "from parity_tracker.capture.spill_pool import PooledSpillDir\n"
        "keep = [PooledSpillDir(None).append(torch.ones(4096)) for _ in range(3)]\n"
        "loaded = keep[0].load()\n"
        "del keep[1]; gc.collect()\n"
        "again = PooledSpillDir(None).append(torch.zeros(4096))\n"
        "assert float(again.load().sum()) == 0 and float(loaded.sum()) == 4096\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ op-level runs


class _Chain(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale
        self.register_buffer("buf", torch.linspace(-1, 1, 1 << 14))

    def forward(self, x):
        for _ in range(4):
            x = torch.tanh(x * self.scale + self.buf)
        return x


def _numpy_chain(x: np.ndarray, scale: float) -> list[np.ndarray]:
    buf = torch.linspace(-1, 1, 1 << 14).numpy()
    outs = []
    for _ in range(4):
        x = np.tanh(x * np.float32(scale) + buf)
        outs.append(x)
    return outs


def test_back_to_back_op_level_runs_with_a_kept_result_compare_right(fresh_pool, monkeypatch):
    from parity_tracker import ops as ops_module
    from parity_tracker.run import run_parity
    from parity_tracker.tensor_checker import DumpMode

    monkeypatch.setattr(ops_module, "DEFAULT_MAX_RESIDENT_BYTES", 0)  # everything spills
    kw = {"mode": "equal", "dump_mode": DumpMode.NOT, "capture_ops": True}
    xs = [torch.from_numpy(_values(40 + i, 1 << 14)) for i in range(3)]
    scales = [(1.0, 1.0), (1.0, 1.01), (1.0, 1.0)]
    results = []
    for x, (sa, sb) in zip(xs, scales, strict=True):
        results.append(run_parity(_Chain(sa), _Chain(sb), inputs=(x,), **kw))
    for res, x, (sa, sb) in zip(results, xs, scales, strict=True):
        a = _numpy_chain(x.numpy().copy(), sa)
        b = _numpy_chain(x.numpy().copy(), sb)
        rows = {r["tag"]: r for r in res.ops.to_pylist()}
        tanhs = sorted((t for t in rows if "tanh" in t), key=lambda t: int(t.rsplit("#", 1)[1]))
        assert len(tanhs) == 4
        for tag, ea, eb in zip(tanhs, a, b, strict=True):
            want = float(np.max(np.abs(ea - eb)))
            assert rows[tag]["max_abs_diff"] == pytest.approx(want, abs=1e-6), tag
            assert (rows[tag]["status"] == "mismatch") == (want > 0), tag


def test_two_op_sessions_alive_at_once_keep_their_own_bytes(fresh_pool):
    from parity_tracker.capture.op_store import OpStore

    vals = [_values(50 + i, 1 << 14) for i in range(6)]
    sessions = [OpStore(0, None), OpStore(0, None)]
    loaded = []
    try:
        for i, v in enumerate(vals):
            s = sessions[i % 2]
            h = s.hold(torch.from_numpy(v.copy()) * 1)
            loaded.append((i, s, h))
        for i, _s, h in loaded:
            assert h.spilled is not None
            assert np.array_equal(h.get().numpy(), vals[i] * 1), i
        sessions[0].close()
        gc.collect()
        junk = _overwrite_pool()
        for i, s, h in loaded:
            if s is sessions[1]:
                assert np.array_equal(h.get().numpy(), vals[i]), (i, len(junk))
    finally:
        for s in sessions:
            s.close()


# w10brk2 bug (fixed, both kinds): two threads appending into ONE spill dir both read the pack's
# ``end`` before either sets it (``os.pwrite`` releases the GIL): both records get the same
# offset and the later write replaces the earlier record's bytes (before the pool a plain
# SpillDir had the same race; its lost ``live`` updates mostly showed as "removed or cut").
@pytest.mark.parametrize("kind", ["pooled", "plain"])  # plain: fixed after w10brk2 (_PACK_LOCK)
def test_two_threads_appending_into_one_spill_dir_never_share_a_span(fresh_pool, monkeypatch, kind):
    a, b = _values(60), _values(61)
    spill = PooledSpillDir(None) if kind == "pooled" else store.SpillDir(None)
    first = _spill(_values(62), spill)  # the pack exists (kept): both appends go into it
    barrier = threading.Barrier(2, timeout=0.5)
    pwrite = os.pwrite

    def meeting(fd, data, pos):  # both threads inside the write at once, if they can be
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        return pwrite(fd, data, pos)

    monkeypatch.setattr(os, "pwrite", meeting)
    out = {}
    threads = [
        threading.Thread(target=lambda k=k, v=v: out.__setitem__(k, _spill(v, spill)))
        for k, v in (("a", a), ("b", b))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.setattr(os, "pwrite", pwrite)
    assert out["a"].pack is first.pack is out["b"].pack
    assert out["a"].offset != out["b"].offset
    assert np.array_equal(out["a"].load().numpy(), a)
    assert np.array_equal(out["b"].load().numpy(), b)


class _Scale(nn.Module):
    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k


def test_back_to_back_runs_whose_snapshots_borrow_op_spills_compare_right(fresh_pool, monkeypatch):
    import parity_tracker.tensor_checker as checker_module
    from parity_tracker import ops as ops_module
    from parity_tracker.capture.snapshot import SnapshotStore
    from parity_tracker.run import run_parity
    from parity_tracker.tensor_checker import DumpMode

    monkeypatch.setattr(ops_module, "DEFAULT_MAX_RESIDENT_BYTES", 256 << 10)
    monkeypatch.setattr(checker_module, "OPS_RUN_RESIDENT_BYTES", 0)
    borrowed: list[int] = []
    real = SnapshotStore._borrow

    def spy(self, entry, lent, address, version):
        ok = real(self, entry, lent, address, version)
        borrowed.append(int(ok))
        return ok

    monkeypatch.setattr(SnapshotStore, "_borrow", spy)
    n = 1 << 15  # 128 KiB outputs: snapshotted copy-on-write, so borrowable
    ks = [1.0 + i / 64 for i in range(16)]
    for run, bad in enumerate([None, 3, None, 9]):
        x = torch.from_numpy(_values(70 + run, n))
        cand_ks = [k * (1.5 if i == bad else 1.0) for i, k in enumerate(ks)]
        res = run_parity(
            nn.Sequential(*[_Scale(k) for k in ks]),
            nn.Sequential(*[_Scale(k) for k in cand_ks]),
            (x,),
            mode="equal",
            capture_ops=True,
            dump_mode=DumpMode.NOT,
        )
        mods = {r["tag"]: r for r in res.modules.to_pylist()}
        a = b = x.numpy().copy()
        for i, (ka, kb) in enumerate(zip(ks, cand_ks, strict=True)):
            a, b = a * np.float32(ka), b * np.float32(kb)
            row = mods[module_tag(str(i))]
            assert row["status"] == ("equal" if np.array_equal(a, b) else "mismatch"), (run, i)
            if row["status"] == "mismatch":
                assert row["max_abs_diff"] == pytest.approx(float(np.max(np.abs(a - b))))
    assert sum(borrowed) > 0 and fresh_pool.reused > 0


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_another_users_orphan_folder_is_left_alone(fresh_pool, tmp_path):
    theirs = tmp_path / "parity-spill-pool-0999998-z"  # a dead pid, but not this user's
    theirs.mkdir()
    (theirs / "pack-0.bin").write_bytes(b"y" * 10)
    os.chown(theirs, 12345, 12345)
    _spill(_values(80))
    assert (theirs / "pack-0.bin").read_bytes() == b"y" * 10
