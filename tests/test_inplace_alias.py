"""In-place writes through another storage object aliasing held bytes (wave 8, w8trust).

``OpStore.before_write`` finds the held storages a write touches by byte range
(``capture.address_ranges.AddressRanges``), not only by the written storage's own address: a
``torch.from_numpy`` / DLPack view of a slice is a second storage object over some of a held
storage's bytes. Every held value here is checked against a numpy copy the test makes before
the write; ranges against a brute-force list of intervals.
"""

from __future__ import annotations

import gc
import random
import tempfile
import weakref

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from parity_tracker.capture.address_ranges import AddressRanges
from parity_tracker.capture.op_store import OpStore
from parity_tracker.ops import OpSession


@pytest.fixture(autouse=True)
def _tmp_spills(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)


# ---------------------------------------------------------------------------------------------
# AddressRanges against a brute-force list of intervals


def test_ranges_boundaries_hand_worked():
    r = AddressRanges()
    r.add(100, 148)  # [100, 148)
    r.add(200, 212)
    assert r.overlapping(148, 160) == []  # starts at the end: no shared byte
    assert r.overlapping(90, 100) == []  # ends at the start
    assert r.overlapping(147, 148) == [100]  # the last byte
    assert r.overlapping(90, 101) == [100]  # the first byte
    assert sorted(r.overlapping(0, 1 << 40)) == [100, 200]
    r.add(104, 140)  # nested: one cluster with [100, 148)
    assert sorted(r.overlapping(120, 121)) == [100, 104]
    assert r.overlapping(100, 104) == [100]
    r.add(140, 200)  # overlaps [100, 148) and touches [200, 212): no merge with it
    assert sorted(r.overlapping(199, 200)) == [140]
    assert sorted(r.overlapping(199, 201)) == [140, 200]
    r.discard(100)
    assert sorted(r.overlapping(100, 104)) == []  # the cluster shrank to its members
    assert sorted(r.overlapping(139, 141)) == [104, 140]
    for k in (104, 140, 200, 999):  # 999: never indexed
        r.discard(k)
    assert len(r) == 0 and r.overlapping(0, 1 << 40) == []
    with pytest.raises(ValueError, match="empty address range"):
        r.add(5, 5)


def test_ranges_a_sorted_key_extended_over_another_cluster():
    """A key already sorted (queried once) re-added with a larger end that reaches the next
    cluster: the merged cluster keeps the larger end for it."""
    r = AddressRanges()
    r.add(100, 110)
    r.add(120, 130)
    assert r.overlapping(0, 1000) == [120, 100]  # sorted now; two clusters
    r.add(100, 125)
    assert sorted(r.overlapping(112, 113)) == [100]
    assert sorted(r.overlapping(124, 125)) == [100, 120]
    assert r.end(100) == 125
    r.discard(120)
    assert r.overlapping(126, 200) == [] and r.overlapping(124, 200) == [100]


def _check_clusters(r: AddressRanges, live: dict[int, int]) -> None:
    """Internal invariants: sorted disjoint clusters covering their members (a cluster of one
    range: its start and end only); every live key either sorted (with its end) or pending."""
    assert r._starts == sorted(r._starts) and set(r._starts) == set(r._cend)
    assert set(r._cmem) <= set(r._starts)
    prev_end = None
    seen = {}
    for start in r._starts:
        members = r._cmem.get(start, {start: r._cend[start]})
        assert len(members) >= 1 and (len(members) > 1) == (start in r._cmem)
        assert min(members) == start and max(members.values()) == r._cend[start]
        assert prev_end is None or prev_end <= start
        prev_end = r._cend[start]
        seen.update(members)
    assert seen == r._ends
    assert {**r._ends, **r._pending} == live and not set(r._ends) & set(r._pending)


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "discard", "query"]),
        st.integers(0, 400),
        st.integers(1, 120),
    ),
    max_size=80,
)


@settings(max_examples=500, deadline=None)
@given(_OPS)
def test_ranges_match_brute_force(ops):
    """Random adds (overlapping, nested, touching, re-added keys), discards and queries: every
    query equals the keys a linear scan over the live intervals finds."""
    r, live = AddressRanges(), {}
    for op, a, n in ops:
        if op == "add":
            r.add(a, a + n)
            live[a] = max(live.get(a, 0), a + n)
        elif op == "discard":
            key = min(live, key=lambda k: abs(k - a)) if live else a
            r.discard(key)
            live.pop(key, None)
        _check_clusters(r, live)
        if op == "query" or a % 3 == 0:  # others stay pending a while
            want = sorted(k for k, e in live.items() if k < a + n and e > a)
            assert sorted(r.overlapping(a, a + n)) == want
            _check_clusters(r, live)
        assert len(r) == len(live)
        assert all(r.end(k) == e for k, e in live.items())
    for k in list(live):
        r.discard(k)
    assert len(r) == 0 and r._starts == [] and r._cend == r._cmem == r._pending == {}


# ---------------------------------------------------------------------------------------------
# OpStore: hold aliases, write through another, every held value is its pre-write copy


def _store(budget=1 << 30):
    return OpStore(budget, None)


def _held_values(store, helds):
    return [h.get().numpy().copy() for h in helds]


def _write(store, target, value):
    """What the recorder does for an in-place op: copy-on-write first, then the write."""
    store.before_write(target)
    target.fill_(value)


def _assert_kept(store, helds, before):
    for h, b in zip(helds, before, strict=True):
        np.testing.assert_array_equal(h.get().numpy(), b)


def _hold_all(store, tensors, counted=True):
    return [store.hold(t, counted=counted) for t in tensors]


def test_write_through_alias_of_a_slice_copies_the_held_source():
    """The two ex-xfail cases at the store level: from_numpy and DLPack of a slice."""
    for alias in (torch.from_numpy, torch.from_dlpack):
        store = _store()
        y = torch.arange(12, dtype=torch.float32)
        (h,) = _hold_all(store, [y])
        part = y[1:]
        target = alias(part.numpy()) if alias is torch.from_numpy else alias(part)
        _write(store, target, -1.0)
        np.testing.assert_array_equal(h.get().numpy(), np.arange(12, dtype=np.float32))
        assert y[1:].eq(-1).all()  # the write landed (in the model's tensor, not the capture)
        store.close()


def test_held_alias_is_copied_when_its_source_is_written():
    """The reverse: the held storage is the alias (a slice's from_numpy), the write goes to the
    larger storage holding its bytes."""
    store = _store()
    y = torch.arange(12, dtype=torch.float32)
    a = torch.from_numpy(y.numpy()[4:8])
    helds = _hold_all(store, [a])
    before = _held_values(store, helds)
    _write(store, y, 7.0)
    _assert_kept(store, helds, before)


def test_overlapping_held_ranges_all_copied():
    """Three held storages over one buffer, overlapping each other (nested and straddling);
    a write through a fourth alias touching all three copies each."""
    buf = np.arange(32, dtype=np.float32)
    held = [torch.from_numpy(buf[0:16]), torch.from_numpy(buf[4:8]), torch.from_numpy(buf[12:20])]
    store = _store()
    helds = _hold_all(store, held)
    before = _held_values(store, helds)
    _write(store, torch.from_numpy(buf[6:14]), -5.0)
    _assert_kept(store, helds, before)
    assert (buf[6:14] == -5).all()


def test_write_at_the_exact_end_boundary_copies_nothing():
    """[B, B+24) held; a write to [B+24, B+48) shares no byte: the capture stays a reference
    (same data address), one byte earlier it is copied."""
    buf = np.arange(12, dtype=np.float32)
    held = torch.from_numpy(buf[:6])
    store = _store()
    (h,) = _hold_all(store, [held])
    _write(store, torch.from_numpy(buf[6:]), 3.0)
    assert h.tensor is held and h.get().data_ptr() == buf.ctypes.data
    np.testing.assert_array_equal(h.get().numpy(), np.arange(6, dtype=np.float32))
    _write(store, torch.from_numpy(buf[5:]), 4.0)
    assert h.get().data_ptr() != buf.ctypes.data
    np.testing.assert_array_equal(h.get().numpy(), np.arange(6, dtype=np.float32))


def test_write_before_the_start_boundary_copies_nothing():
    buf = np.arange(12, dtype=np.float32)
    held = torch.from_numpy(buf[6:])
    store = _store()
    (h,) = _hold_all(store, [held])
    _write(store, torch.from_numpy(buf[:6]), 3.0)
    assert h.tensor is held
    _write(store, torch.from_numpy(buf[:7]), 3.0)
    assert h.tensor is not held
    np.testing.assert_array_equal(h.get().numpy(), np.arange(6, 12, dtype=np.float32))


def test_held_view_with_storage_offset_and_target_view_with_storage_offset():
    """The held tensor is a view with a storage offset (its key: the storage's base); the
    target is a view with a storage offset of another alias: both ranges are whole storages."""
    y = torch.arange(24, dtype=torch.float32)
    held = y.view(4, 6)[2:]  # storage offset 12
    assert held.storage_offset() == 12
    store = _store()
    helds = _hold_all(store, [held])
    before = _held_values(store, helds)
    alias = torch.from_numpy(y.numpy()[1:20])[15:]  # its own storage offset 15: y[16:20]
    assert alias.storage_offset() == 15
    _write(store, alias, 9.0)
    _assert_kept(store, helds, before)
    assert (y[16:20] == 9).all()


def test_non_contiguous_slices():
    """A held non-contiguous slice (every other column) and a non-contiguous DLPack alias of
    the other columns as the target: they share the storage's bytes span."""
    y = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    held = y[:, ::2]
    store = _store()
    helds = _hold_all(store, [held, y.t()])
    before = _held_values(store, helds)
    target = torch.from_dlpack(y[1:, 1::2])
    assert not target.is_contiguous()
    _write(store, target, -2.0)
    _assert_kept(store, helds, before)


def test_second_from_numpy_view_of_the_same_array():
    """Two storages made from one numpy array (from_numpy twice): the held first view is copied
    when the second (of a slice, another base address) is written."""
    arr = np.arange(20, dtype=np.float64).reshape(4, 5)
    first = torch.from_numpy(arr)
    store = _store()
    helds = _hold_all(store, [first * 1, first], counted=False)  # counted or not: indexed
    before = _held_values(store, helds)
    second = torch.from_numpy(arr[:, 2:])  # non-contiguous, base 2 elements in
    _write(store, second, 0.5)
    _assert_kept(store, helds, before)
    assert (arr[:, 2:] == 0.5).all()


def test_uncounted_holding_is_indexed_by_its_whole_storage():
    """A parameter-like holding (counted=False: Held.nbytes is 0) is protected all the same,
    by its storage's full byte range, not only the held view's elements."""
    y = torch.arange(16, dtype=torch.float32)
    store = _store()
    (h,) = _hold_all(store, [y[:4]], counted=False)
    assert h.nbytes == 0
    assert store._ranges.end(h.ptr) - h.ptr == 64
    _write(store, torch.from_numpy(y.numpy()[12:]), 1.0)  # outside the view, inside the storage
    assert h.tensor is not None and h.get().data_ptr() != y.data_ptr()
    np.testing.assert_array_equal(h.get().numpy(), np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("budget", [0, 60, 100, 1 << 30])
def test_copies_that_spill_other_holders(budget):
    """Copying one holder admits bytes that may spill another holder touched by the same write
    before its turn: that one's file holds the pre-write bytes; every value is kept."""
    buf = np.arange(16, dtype=np.float32)
    store = _store(budget)
    helds = [
        store.hold(torch.from_numpy(buf[:12]), counted=True),
        store.hold(torch.from_numpy(buf[2:10]), counted=False),
        store.hold(torch.from_numpy(buf[8:]), counted=False),
    ]
    before = [
        np.arange(16, dtype=np.float32)[s] for s in (slice(0, 12), slice(2, 10), slice(8, 16))
    ]
    _write(store, torch.from_numpy(buf), -1.0)
    _assert_kept(store, helds, before)


@pytest.mark.parametrize("alias", [False, True])
def test_a_holder_spilled_by_an_earlier_copy_is_not_copied(alias):
    """An uncounted holder of 12 elements held before a counted one (its storage: 64 bytes,
    resident), budget 100: copying the first admits 48 bytes (64 + 48 > 100) and spills the
    second before its turn. It is not copied (its spill file has the pre-write bytes) and
    nothing fails (main 4df3f7a asserted ``h.tensor is not None``, failing the recorder, for
    two holders of one storage)."""
    buf = np.arange(16, dtype=np.float32)
    src = torch.from_numpy(buf)
    store = _store(100)
    first = torch.from_numpy(buf[:12]) if alias else src[:12]
    helds = [store.hold(first, counted=False), store.hold(src[8:], counted=True)]
    assert helds[1].tensor is not None
    _write(store, src, -1.0)
    assert helds[1].tensor is None and helds[1].spilled is not None  # spilled, not copied
    want = [np.arange(12, dtype=np.float32), np.arange(8, 16, dtype=np.float32)]
    _assert_kept(store, helds, want)


def test_released_and_collected_storages_leave_the_index():
    """Release (and spill) drop the storage's range: the index is empty again, a write over
    the old range copies nothing still held, and the buffer is freed (no reference kept)."""
    store = _store()
    a = torch.arange(12, dtype=torch.float32)
    b = torch.arange(12, dtype=torch.float32)
    ha, hb = store.hold(a[2:]), store.hold(b)
    hb2 = store.hold(b[1:], counted=False)  # a second holder of b's storage: one key
    assert len(store._ranges) == 2
    store.release(ha)
    assert len(store._ranges) == 1
    alias = torch.from_numpy(a.numpy())
    _write(store, alias, 5.0)  # a's old range: nothing held there any more
    assert hb.tensor is b and hb2.get().data_ptr() == b.data_ptr() + 4
    ref = weakref.ref(a)
    del a, alias, ha
    gc.collect()
    assert ref() is None  # the store kept no reference to the released storage
    store.release(hb)
    assert len(store._ranges) == 1  # hb2 still holds b
    store.release(hb2)
    assert len(store._ranges) == 0 and store._by_ptr == {}


def test_spilled_storages_leave_the_index_and_close_empties_it():
    store = _store(0)  # everything spills as it is admitted
    ys = [torch.full((8,), float(i)) for i in range(5)]
    helds = [store.hold(y) for y in ys]
    assert len(store._ranges) == 0 and all(h.tensor is None for h in helds)
    store.hold(ys[0], counted=False)  # never spilled
    assert len(store._ranges) == 1
    store.close()
    assert len(store._ranges) == 0 and store._by_ptr == {}


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_aliases_keep_every_held_value(seed):
    """Random strided from_numpy/DLPack aliases of one buffer, held counted or not, under a
    random budget; random writes through other aliases: every held value stays the numpy copy
    taken when it was held, and releasing all leaves an empty index."""
    rng = random.Random(seed)
    buf = np.arange(64, dtype=np.float32) * 1.5

    def alias():
        lo = rng.randrange(0, 60)
        hi = rng.randrange(lo + 1, 65)
        step = rng.choice([1, 1, 2, 3])
        view = buf[lo:hi:step]
        return torch.from_numpy(view) if rng.random() < 0.5 else torch.from_dlpack(view)

    store = _store(rng.choice([0, 64, 256, 1 << 30]))
    helds, before = [], []
    for _ in range(rng.randint(1, 6)):
        t = alias()
        helds.append(store.hold(t, counted=rng.random() < 0.5))
        before.append(t.numpy().copy())
        if rng.random() < 0.5:
            _write(store, alias(), rng.uniform(-9, 9))
    _assert_kept(store, helds, before)
    for h in helds:
        store.release(h)
    assert len(store._ranges) == 0 and store._by_ptr == {}


# ---------------------------------------------------------------------------------------------
# through the op recorder (OpSession): both sides identical, every row equal


class _Fn(nn.Module):
    def __init__(self, fn, side):
        super().__init__()
        self.fn, self.side = fn, side

    def forward(self, x):
        return self.fn(self.side, x)


def _session(fn, x, budget):
    s = OpSession(mode="equal", max_resident_bytes=budget)
    for side in (0, 1):
        m = _Fn(fn, side)
        with torch.no_grad(), s.recording(side, model=m):
            m(x.clone())
    return s


def _session_rows(fn, x, budget):
    s = _session(fn, x, budget)
    try:
        return {r["tag"]: r["status"] for r in s.rows()}
    finally:
        s.close()


_BUDGETS = [0, 1 << 30]


@pytest.mark.parametrize("budget", _BUDGETS)
def test_out_argument_aliasing_a_held_output(budget):
    """``torch.mul(..., out=alias)`` where ``alias`` is a from_numpy view of rows 1-2 of the
    held ``mul#0`` output: mul#0 keeps its op-time value (was ``error`` on main 4df3f7a)."""

    def fn(side, x):
        y = x * 2
        out = torch.from_numpy(y.numpy()[1:3])
        torch.mul(x[1:3], 5, out=out)
        return y + 1

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    rows = _session_rows(fn, x, budget)
    assert rows["model@0::mul#0"] == "equal"
    assert set(rows.values()) == {"equal"}, rows


@pytest.mark.parametrize("budget", _BUDGETS)
def test_write_via_second_from_numpy_view_in_a_run(budget):
    """A first from_numpy view of an op output's array feeds an op; an in-place op through a
    second (non-contiguous, offset) view of the same array: every row equal."""

    def fn(side, x):
        y = x * 2
        arr = y.numpy()
        z = torch.from_numpy(arr) + 1
        torch.from_numpy(arr[:, 1:]).mul_(3)
        return z + y

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    rows = _session_rows(fn, x, budget)
    assert rows["model@0::mul#0"] == "equal"
    assert set(rows.values()) == {"equal"}, rows


@pytest.mark.parametrize("budget", _BUDGETS)
def test_write_into_the_source_of_a_held_alias_input(budget):
    """The candidate holds an op input that is a from_numpy alias of a slice of ``y`` (rows
    1-2); then it writes ``y`` itself in place: the held input is copied first. Truth by hand:
    ``mul#1``'s input ``y[1:]`` was ``2 * x[1:]`` on both sides when it ran (its inputs pass;
    main 4df3f7a said 'failing', comparing the rewritten capture); ``add#0`` reads the written
    ``y`` on the candidate only (a true mismatch)."""

    def fn(side, x):
        y = x * 2
        part = torch.from_numpy(y.numpy()[1:])
        z = part * 3  # input: the alias (held by the candidate; its key is not y's)
        if side:
            y.add_(1)
        return z + y[1:]

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    s = _session(fn, x, budget)
    try:
        rows = {r["tag"]: (r["status"], r["inputs_status"]) for r in s.rows()}
    finally:
        s.close()
    assert rows["model@0::mul#0"] == ("equal", "passing")
    assert rows["model@0::mul#1"] == ("equal", "passing")
    assert rows["model@0::add#0"] == ("mismatch", "failing")


def _aliasing_fn(side, x):
    y = x * 2
    part = torch.from_numpy(y.numpy()[1:])
    z = part * 3
    torch.from_dlpack(y[:, 2:]).add_(1)
    return z + y[1:]


@pytest.mark.parametrize("budget", _BUDGETS)
def test_session_index_follows_the_store_and_empties(budget):
    """Through a run: the range index has exactly the store's keys, and none once the rows are
    compared and the session closed (no stale range left behind)."""
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    s = _session(_aliasing_fn, x, budget)
    store = s._store
    try:
        assert sorted(store._ranges._ends) == sorted(store._by_ptr)
        rows = {r["tag"]: r["status"] for r in s.rows()}
        assert set(rows.values()) == {"equal"}, rows
        assert sorted(store._ranges._ends) == sorted(store._by_ptr)
    finally:
        s.close()
    assert len(store._ranges) == 0 and store._by_ptr == {}
