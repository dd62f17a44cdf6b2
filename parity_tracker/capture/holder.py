"""What the TensorChecker does with each captured tensor: hold a snapshot, or compare at once.

Deferred path: a counted snapshot (parameters pinned: ``Snapshotter.pin``). Eager path
(``TensorChecker(eager_mode=...)``): when the second side's tensor of a tag arrives it is compared
with the held one and both are released, unless the planned dump needs them (``DumpMode``), so peak
memory is one side's activations. A small pair is copied and held instead, and all held pairs are
compared together at ``check`` (:meth:`Holder.flush`, ``compare.batch``: issue 19), within a small
byte bound. In such a run a small snapshot is its bytes from the start (``HeldBytes``: one copy,
which the held pair reuses; :meth:`Holder.settle` turns those still held at the check into
tensors). Split out of ``parity_tracker.tensor_checker`` (the seed facade).
"""

from __future__ import annotations

from typing import Any

import torch

from parity_tracker.capture.modules import Capture, Group
from parity_tracker.capture.snapshot import param_bytes
from parity_tracker.capture.store import Spilled
from parity_tracker.compare.batch import (
    BULK_MAX_BYTES,
    PENDING_BYTES,
    PENDING_PAIRS,
    HeldBytes,
    HeldPairs,
)
from parity_tracker.compare.core import Comparison
from parity_tracker.compare.pairing import RELEASED, load, unreadable
from parity_tracker.compare.results import DumpMode
from parity_tracker.statuses import BUDGET, RUN_MODES, WEIGHT_KINDS, is_failing

#: the run modes whose small pairs may be compared in bulk (all but the error budget)
_BULK_MODES = frozenset(RUN_MODES) - {BUDGET}
_NOT = DumpMode.NOT


class Holder:
    """What the checker does with each captured tensor: hold a snapshot, or compare it at once.

    Deferred path: a counted snapshot (parameters pinned: ``Snapshotter.pin``). Eager path: when the
    second side's tensor of a tag arrives it is compared with the held one and both are released,
    unless the planned dump needs them. Also writes the dumps of a check.
    """

    def __init__(self, checker: Any) -> None:  # the TensorChecker facade that owns it
        self.c = checker
        self.eager_first: dict[bool, Group] = {}
        #: small eager pairs held for the bulk comparison, keyed (group, candidate index)
        self.held = HeldPairs()
        #: the largest snapshot held as its bytes this round (``_bytes_limit``; None: not known)
        self.bytes_max: int | None = None

    def reset(self) -> None:
        """Forget the state of a round (held pairs dropped: their captures are being cleared)."""
        self.eager_first = {}
        self.held = HeldPairs()
        self.bytes_max = None

    def on_tensor(self, g: Group, cap: Capture, value: torch.Tensor, alias: bool) -> None:
        """Take ``value``, just captured as ``cap`` of group ``g``: reduce, hold or compare it."""
        c = self.c
        if c.reduce_to is not None:
            cap.value = c.reduce_to(g.tag, g.step, value)
            return
        caps = g.captures
        n = len(caps)
        # the first capture of a group has nothing to be compared with; the rest of
        # _eager_reference inline (issue 19: fewer calls per capture)
        if n < 2 or c.eager_mode is None:
            self._keep(cap, value, alias)
            return
        i = g.ref_index
        if i is None:
            i = 0
        held = caps[i]
        held_value = held.value
        if held.side == cap.side:
            self._keep(cap, value, alias)
        elif type(held_value) is HeldBytes:  # the usual small pair: held for the bulk now
            if not self._bulk_bytes(g, i, n - 1, held, cap, held_value, value):
                self._eager_compare(g, i, n - 1, value, alias, bulk_tried=True)
        elif isinstance(held_value, (torch.Tensor, Spilled)):
            self._eager_compare(g, i, n - 1, value, alias)
        else:
            self._keep(cap, value, alias)

    def _bulk_bytes(self, g, held_i, new_i, held: Capture, new: Capture, held_value, value) -> bool:
        """:meth:`_eager_compare`'s first step for a held ``HeldBytes``, fused (issue 19).

        :meth:`_hold_for_bulk` of the pair ``held_value`` (bytes) and ``value`` (the live
        capture ``new``) with its tests in the same order, those that cannot hold for a
        ``HeldBytes`` side left out (it is no copy-on-write snapshot and no pinned
        parameter: ``Snapshotter.unverified`` finds those by identity among the
        snapshotter's own objects), then ``HeldPairs.add_live`` with the capture's
        shape (``meta``). Holds the pair for the bulk comparison and releases both captures;
        False: nothing done (:meth:`_eager_compare` goes on from there).
        """
        c = self.c
        if c.eager_mode not in _BULK_MODES or c.align is not None or c.dump_mode is not _NOT:
            return False
        if c._snap.unverified(value):
            return False
        pairs = self._room()
        if pairs is None:
            return False
        live_is_cand = new.side > held.side
        key = (g, new_i) if live_is_cand else (g, held_i)
        meta = new.meta
        try:
            added = pairs.add_live(
                key, g.tag, held_value, value, live_is_cand, meta[0] if meta else None
            )
        except Exception:  # a tensor whose bytes cannot be read: the per-pair path reports it
            return False
        if not added:
            return False
        g.ref_index = held_i if live_is_cand else new_i
        new.value = held.value = RELEASED  # the pair is held (its bytes as they are)
        return True

    def _room(self) -> HeldPairs | None:
        """The held pairs, with room for one more pair (:meth:`flush` first when full).

        None when the bound is too small to hold any pair. The bound: at most
        ``min(PENDING_BYTES, max_resident_bytes / 16)`` held bytes (both sides) and
        :data:`PENDING_PAIRS` pairs (see :meth:`_hold_for_bulk`).
        """
        limit = self.c._store.max_resident_bytes / 16  # c.max_resident_bytes, no property
        if limit > PENDING_BYTES:
            limit = PENDING_BYTES
        if limit < 2 * BULK_MAX_BYTES:  # a bound too small to hold a pair
            return None
        held = self.held
        if held.nbytes + 2 * BULK_MAX_BYTES > limit or len(held.keys) >= PENDING_PAIRS:
            self.flush()  # the next pair could pass the bound: compare the held ones first
            held = self.held
        return held

    def _keep(self, cap: Capture, value: torch.Tensor, alias: bool) -> None:
        """Hold ``value`` in ``cap``: parameters pinned (``Snapshotter.pin``), the rest counted.

        In a round whose small pairs are compared in bulk (:meth:`_bytes_limit`) a small tensor
        is taken as its bytes (``Snapshotter.take`` with ``bytes_max``: a ``HeldBytes``), and so
        is a small parameter that ``pin`` would hold copy-on-write (the values of capture time
        either way; a copy of at most ``BULK_MAX_BYTES``, counted in the store); other
        parameters (views of a larger buffer) stay pinned by reference, as before.
        """
        snap = self.c._snap
        limit = self.bytes_max
        if limit is None:
            limit = self.bytes_max = self._bytes_limit()
        if alias:
            meta = cap.meta  # what pin would copy-on-write: its bytes
            copy = param_bytes(value, limit, meta[0] if meta else None) if limit else None
            if copy is not None:
                cap.value = copy
                self.c._store.admit_small(copy, cap)
            else:
                cap.value = snap.pin(value)
            return
        snap.bytes_max = limit  # small ones held as their bytes (compare.batch)
        cap.value = copy = snap.take(value)
        if type(copy) is HeldBytes:  # store.admit's first test, inline (issue 19)
            self.c._store.admit_small(copy, cap)
        else:
            self.c._store.admit(copy, cap)

    def _bytes_limit(self) -> int:
        """``BULK_MAX_BYTES`` when this round's small pairs may be compared in bulk, else 0.

        The conditions of :meth:`_hold_for_bulk` that do not depend on the pair (issue 19): a
        small snapshot is then held as its bytes (``HeldBytes``: one copy), which the
        bulk comparison holds as they are when the other side arrives. Only a question of
        cost: a ``HeldBytes`` whose pair is not held (another dtype or shape, the checker's
        settings changed since) is compared as the tensor it loads (the values of capture
        time), and :meth:`settle` turns those still held at the check into tensors.
        """
        c = self.c
        if c.eager_mode not in _BULK_MODES or c.align is not None:
            return 0
        if c.dump_mode is not DumpMode.NOT or c.reduce_to is not None:
            return 0
        return (
            BULK_MAX_BYTES
            if min(PENDING_BYTES, c.max_resident_bytes / 16) >= 2 * BULK_MAX_BYTES
            else 0
        )

    def _eager_compare(
        self, g: Group, held_i: int, new_i: int, value: Any, alias: bool, bulk_tried: bool = False
    ) -> None:
        """Compare (or hold for the bulk) the new capture ``new_i`` with the held ``held_i``.

        ``bulk_tried``: :meth:`_bulk_bytes` already found the pair not holdable as it is.
        """
        held = g.captures[held_i]
        new = g.captures[new_i]
        new_is_ref = new.side < held.side
        ref_i, cand_i = (new_i, held_i) if new_is_ref else (held_i, new_i)
        held_value = held.value
        as_bytes = type(held_value) is HeldBytes  # a small snapshot's bytes (never pinned)
        ref, cand = (value, held_value) if new_is_ref else (held_value, value)
        if as_bytes and not bulk_tried and self._hold_for_bulk(g, cand_i, ref, cand):
            g.ref_index = ref_i
            new.value = held.value = RELEASED  # the pair is held (its bytes as they are)
            return
        try:
            if not isinstance(held_value, torch.Tensor):
                held_value = load(held_value)  # spilled, or bytes whose pair is not held
        except (OSError, RuntimeError) as exc:  # a spill file removed or cut during the run
            held_value, comp = None, unreadable(g.tag, self.c.eager_mode, exc)
        pinned = g.kind == "param" and not as_bytes
        if pinned and held_value is not None:  # the weight, not its copy (unpin)
            held_value = held.value = self.c._snap.unpin(held_value)
        ref, cand = (value, held_value) if new_is_ref else (held_value, value)
        if held_value is not None and not as_bytes and self._hold_for_bulk(g, cand_i, ref, cand):
            g.ref_index = ref_i
            new.value = held.value = RELEASED  # as below without a dump: the pair is held
            return
        if held_value is not None:
            budget = self.c.eager_mode == BUDGET
            pairs = self.c.budget.for_step(g.step) if budget else self.c._pairs
            comp = pairs.compare(g.tag, ref, cand, self.c.eager_mode, self.c._eager_tol, g.step)
            comp = self.c._snap.verified(g.tag, ref, cand, comp)  # copy-on-write snapshots
        g.ref_index = ref_i
        g.pairs[cand_i] = comp
        if self._eager_keep(g, comp):
            self._keep(new, value, alias)
            if pinned:  # kept for a dump: its values of now, pinned again
                held.value = self.c._snap.pin(held.value)
        else:
            new.value = held.value = RELEASED

    def _eager_keep(self, g: Group, comp: Comparison) -> bool:
        """Whether the planned dump needs this group's tensors after an eager comparison."""
        mode = self.c.dump_mode
        if mode is DumpMode.NOT:  # the runs' default: nothing is dumped, nothing kept
            return False
        failed = is_failing(comp.status)
        if mode is DumpMode.ALL:
            return True
        if mode is DumpMode.NOT_EQUAL:
            return failed
        if mode is DumpMode.FIRST_NOT_EQUAL and failed:
            weight = g.kind in WEIGHT_KINDS
            best = self.eager_first.get(weight)
            key = (g.captures[g.ref_index].exec_order, g.step)
            if best is not None and (best.captures[best.ref_index].exec_order, best.step) <= key:
                return False
            if best is not None:
                for c in best.captures:
                    if c.is_tensor:
                        c.value = RELEASED
            self.eager_first[weight] = g
            return True
        return False

    def _hold_for_bulk(self, g: Group, cand_i: int, ref: Any, cand: Any) -> bool:
        """Hold a small pair for :meth:`flush` (``compare.batch``) instead of comparing it now.

        Only pairs whose record cannot depend on the moment of comparison: ``equal`` /
        ``allclose`` without ``align`` or a dump (the dump plan reads each verdict at once),
        that ``HeldPairs.add`` holds (small plain CPU tensors of one dtype and shape), and
        whose sides ``Snapshotter.verified`` would pass now whatever the comparison (no
        copy-on-write snapshot or pinned parameter with a hash recorded at its capture, no
        pinned parameter written since its capture: ``Snapshotter.unverified``).
        ``HeldPairs.add`` copies both sides' bytes now (the live side may be written later;
        the held snapshot is released now, as on the per-pair path). Held bytes (both
        sides): at most ``min(PENDING_BYTES, max_resident_bytes / 16)``, and
        :data:`PENDING_PAIRS` pairs; past that, the held pairs are compared first.
        """
        c = self.c
        if c.eager_mode not in _BULK_MODES or c.align is not None or c.dump_mode is not _NOT:
            return False
        snap = c._snap
        if snap.unverified(ref) or snap.unverified(cand):
            return False
        held = self._room()
        if held is None:
            return False
        try:
            return held.add((g, cand_i), g.tag, ref, cand)
        except Exception:  # a tensor whose bytes cannot be read: the per-pair path reports it
            return False

    def settle(self) -> None:
        """:meth:`flush`, then give every capture still held as bytes a tensor of its values.

        Called at the check, before any group is read: one-sided groups, groups of more than
        two captures and dumps read ``Capture.value`` as a tensor (or a ``Spilled``). Each
        such tensor is ``HeldBytes.load`` (the values of capture time), counted in the store
        in place of its bytes.
        """
        self.flush()
        store = self.c._store
        for entry in store.payloads():
            held = entry()
            if type(held) is not HeldBytes:
                continue
            caps = [c for c in entry.caps if c.value is held]
            store.discard(entry.key)
            t = held.load()
            for cap in caps:
                cap.value = t
                store.admit(t, cap)

    def flush(self) -> None:
        """Compare the held pairs in bulk and record each verdict in its group (``g.pairs``).

        Identical pairs get their record from ``HeldPairs.compare``; the others (or all,
        should the bulk step fail) are compared one by one on their held values as the
        per-pair path does (``PairComparer.compare_alone``), but an alias of a pair compared
        so (``HeldPairs.alias_record``: the same values). ``on_compared`` is told of every
        pair, with the held values, in the order the pairs were held; a callback with a
        ``statuses`` attribute only of pairs of those statuses (``PairComparer``).
        """
        held, self.held = self.held, HeldPairs()
        if not len(held):
            return
        c = self.c
        mode, tol, pairs = c.eager_mode, c._eager_tol, c._pairs
        try:
            comps = held.compare(mode, tol)
        except Exception:  # never lose a pair: each is compared alone below
            comps = [None] * len(held)
        told = pairs.on_compared
        statuses = getattr(told, "statuses", None)
        alone: dict[int, Comparison] = {}  # the pairs compared one by one, for their aliases
        for i, ((g, cand_i), comp) in enumerate(zip(held.keys, comps, strict=True)):
            if comp is None:
                comp = held.alias_record(i, alone, mode, tol)  # its pair's values, compared
                if comp is None:
                    tensors = held.tensors(i)
                    comp = alone[i] = pairs.compare_alone(g.tag, *tensors, mode, tol, g.step)
                elif told is not None:  # told as compare_alone tells
                    pairs.tell(g.tag, g.step, *held.tensors(i), comp)
            elif told is not None and (statuses is None or comp.status in statuses):
                pairs.tell(g.tag, g.step, *held.tensors(i), comp)
            g.pairs[cand_i] = comp
