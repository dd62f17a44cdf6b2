"""The TensorChecker's bounded, spilling store of module snapshots (split from ``snapshot``).

:class:`SnapshotStore` counts every snapshot a capture holds (a cloned or copy-on-write tensor
of :class:`~parity_tracker.capture.snapshot.Snapshotter`, or a small tensor's bytes,
:class:`~parity_tracker.compare.batch.HeldBytes`) within ``max_resident_bytes`` and spills the
oldest to disk past it. ``parity_tracker.capture.snapshot`` still exports it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any
from weakref import ref as _weak

import torch

from parity_tracker.capture import heap_trim
from parity_tracker.capture.snapshot import _COW, _DATA_ADDRESS, _IS_COW, _KeyRef
from parity_tracker.capture.store import BoundedStore, SmallCopies, Spilled
from parity_tracker.compare.batch import HeldBytes
from parity_tracker.compare.convert import tensor_version


class _Held(_KeyRef):
    """A snapshot in :class:`SnapshotStore`: a weak reference to the copy, and its captures.

    ``key``: the copy's id; ``caps``: the captures holding it;
    ``lent``: the op store's capture of the same buffer (``OpStore.lend``), ``address`` the
    buffer's data address when both were seen on it; ``done``: spilled or borrowed already.
    One object per snapshot (issue 19: it was a holder, a weak reference and a closure).
    """

    __slots__ = ("address", "caps", "done", "lent")


def _held(copy: torch.Tensor, callback: Callable[[_Held], None], key: int, cap: Any) -> _Held:
    entry = _Held(copy, callback)
    entry.key, entry.caps = key, [cap]
    entry.lent, entry.address, entry.done = None, 0, False
    return entry


#: share of the budget freed when small copies spill (``SnapshotStore._make_room``)
SMALL_SLACK = 0.125


class SnapshotStore(BoundedStore):
    """Module snapshots within ``max_resident_bytes``, the oldest spilled to ``spill_dir``.

    A snapshot is held by one or more captures (objects with a ``value`` attribute). Each
    snapshot is tracked by a weak reference: it stops counting as soon as no capture holds it
    (the eager path releasing a pair); spilling swaps every holder's ``value`` for the
    :class:`~parity_tracker.capture.store.Spilled` record, whose file is deleted once no
    capture holds the record.

    Borrowing (issue 19, an op-level run: ``lender`` is the op store): a copy-on-write snapshot
    whose buffer the op store also captured (same data address, both alive: the same bytes)
    is written to disk once. Whichever store spills first writes it (this one asks the lender
    to spill its capture now); the snapshot then reads the lender's file
    (``Spilled.alias``) if, right after that write, the copy still is that buffer (its data
    address and copy-on-write state), the lender's tensor had the version counter it had when
    the two were linked, and the copy still hashes as when it was taken (``intact``).
    Otherwise the snapshot spills on its own, as without a lender.
    """

    def __init__(self, max_resident_bytes: float, spill_dir: str | os.PathLike[str] | None):
        super().__init__(max_resident_bytes, spill_dir, self._spill_entry, "checker-spill-")
        self._ids = itertools.count()
        #: ``intact(copy) -> bool`` (``Snapshotter.intact``): a copy-on-write snapshot that no
        #: longer holds its captured values is kept in memory (and found by the comparison's
        #: check), never written to disk as if it did.
        self.intact: Callable[[Any], bool] = lambda _copy: True
        #: the op store whose captures snapshots may borrow (``OpStore``), or None
        self.lender: Any = None
        #: bytes of snapshots that read a lender's file instead of writing their own
        self.borrowed_bytes = 0
        #: the small copies (``HeldBytes``), counted per round (issue 19, ``SmallCopies``)
        self.small = SmallCopies()

    def clear(self) -> None:
        """Forget every snapshot, reset the counters and delete the spill folder."""
        self.close(reset_counters=True)
        self.borrowed_bytes = 0
        self.small = SmallCopies()

    def current_bytes(self) -> int:
        """The resident bytes, exact: the small copies released since the last count dropped."""
        if self.small.entries:
            self.resident_bytes -= self.small.recount()
        return self.resident_bytes

    def _make_room(self) -> None:
        """Spill past the budget: released small copies uncounted first, then the oldest.

        Regular entries (oldest first), then the small copies (oldest first) until a
        :data:`SMALL_SLACK` share of the budget is free: finding the live small copies is
        one pass over them all, so it runs once per that many bytes admitted, not once per
        admission (amortized, w8brk2). Spilling a little early changes no value.
        """
        small = self.small
        if small.entries and small.stale():
            self.resident_bytes -= small.recount()
        super()._make_room()
        if self.resident_bytes <= self.max_resident_bytes or not small.entries:
            return
        self.resident_bytes -= small.recount()  # exact before any small copy spills
        target = self.max_resident_bytes - self.max_resident_bytes * SMALL_SLACK
        for copy, caps in small.live().values():
            if self.resident_bytes <= target:
                return
            n = len(copy.data)
            self.resident_bytes -= n
            small.counted -= n
            copy.owner = None  # no longer counted (its captures now hold the file's record)
            if not self.intact(copy):
                continue
            spilled = self.write(copy.load())
            for c in caps:
                c.value = spilled
            self.spilled_bytes += n
            self.spilled_count += 1

    def payloads(self) -> list[Any]:
        """Payloads of the resident entries, oldest first (small copies made entries first)."""
        small = self.small
        if small.entries:
            self.resident_bytes -= small.counted
            for copy, caps in small.take_all():
                key = id(copy)
                self.discard(key)  # a stale entry under a reused id
                entry = _held(copy, self._gone, key, caps[0])
                entry.caps = caps
                super().admit(key, len(copy.data), entry)
        return super().payloads()

    def admit(self, copy: torch.Tensor | HeldBytes, cap: Any) -> None:  # type: ignore[override]
        """Count ``copy`` (held by ``cap``) and spill the oldest snapshots past the budget.

        A tensor counts its storage's bytes, a ``HeldBytes`` its ``data``; a ``Spilled``
        (``Snapshotter.take`` borrowed the op store's sealed file) counts nothing.
        """
        if type(copy) is HeldBytes:  # a small tensor's bytes: counted per round (issue 19)
            self.admit_small(copy, cap)
            return
        if type(copy) is Spilled:  # the op store's sealed file (``OpStore.sealed_spill``)
            self.borrowed_bytes += copy.nbytes  # nothing resident, nothing written
            return
        key = id(copy)
        held = self._resident.get(key)  # (nbytes, _Held): one look-up (issue 19)
        if held is not None:
            if held[1]() is copy:
                held[1].caps.append(cap)  # a snapshot shared with an earlier capture counts once
                return
            self.discard(key)  # a stale entry under a reused id
        entry = _held(copy, self._gone, key, cap)
        nbytes = copy.untyped_storage().nbytes()
        if self.lender is not None and _DATA_ADDRESS is not None and _COW and _IS_COW(copy):
            address = _DATA_ADDRESS(copy)
            lent = self.lender.lend(address, nbytes, copy.dtype)
            version = None if lent is None else tensor_version(lent.tensor)
            if version is not None:  # an inference tensor has no version: never borrowed
                entry.lent, entry.address = (lent, version), address
                self.lender.watch(lent, self._watcher(key, entry))
        super().admit(key, nbytes, entry)

    def admit_small(self, copy: HeldBytes, cap: Any) -> None:
        """:meth:`admit` of a ``HeldBytes`` (counted per round: ``SmallCopies.admit``, inline)."""
        small = self.small
        small.entries.append((_weak(copy), cap))  # no callback: the same ref every time
        if copy.owner is not small.token:  # counted once per round
            copy.owner = small.token
            n = len(copy.data)
            if n:
                small.counted += n
                resident = self.resident_bytes = self.resident_bytes + n
                if resident > self.max_resident_bytes:
                    self._make_room()
                if self.resident_bytes > self.peak_resident_bytes:
                    self.peak_resident_bytes = self.resident_bytes
                heap_trim.trimmer.admitted(n)
        if len(small.entries) >= small._next_recount:  # small.due()
            self.resident_bytes -= small.recount()

    def _gone(self, ref: _Held) -> None:
        """A snapshot died: stop counting it (not a newer one under its id)."""
        if self.get(ref.key) is ref:
            self.discard(ref.key)

    def _watcher(self, key: int, entry: _Held) -> Callable[[Any, int, int], None]:
        def watcher(lent: Any, address: int, version: int) -> None:
            borrowed = not entry.done and self._borrow(entry, lent, address, version)
            if borrowed and self.get(key) is entry:
                self.discard(key)

        return watcher

    def _borrow(self, entry: _Held, lent: Any, address: int, version: int) -> bool:
        """Point ``entry``'s captures at ``lent``'s file if it holds the copy's bytes."""
        copy = entry()
        if (
            copy is None
            or lent.spilled is None
            or (lent, version) != entry.lent
            or address != entry.address
            or not _IS_COW(copy)
            or _DATA_ADDRESS(copy) != address
            or not self.intact(copy)
        ):
            return False
        spilled = lent.spilled.alias(copy)
        for c in entry.caps:
            if c.value is copy:
                c.value = spilled
        entry.done = True
        self.borrowed_bytes += spilled.nbytes
        return True

    def _spill_entry(self, _key: int, entry: _Held) -> bool:
        if entry.lent is not None and not entry.done:
            self.lender.spill(entry.lent[0].id)  # its watcher borrows the file if it can
        if entry.done:
            return False  # borrowed: nothing written here
        entry.done = True
        copy = entry()
        if copy is None or not self.intact(copy):
            return False
        spilled = self.write(copy.load() if type(copy) is HeldBytes else copy)  # freed when
        # no capture holds the record
        for c in entry.caps:
            if c.value is copy:
                c.value = spilled
        return True
