"""Which held storages a write's byte range overlaps: an index of address ranges.

:class:`~parity_tracker.capture.op_store.OpStore` keys its captures by storage base address.
A second storage object can alias the same bytes at another base address (``torch.from_numpy``
of a ``.numpy()`` view of a slice, ``torch.from_dlpack`` of a slice): an in-place op through it
writes a held storage although its own address is no key. :class:`AddressRanges` answers
"which keys' byte ranges ``[start, end)`` overlap ``[a, b)``" in ``O(log n + k)`` for ``n``
keys and ``k`` hits (``bisect`` on the sorted starts of disjoint clusters).

Ranges that overlap each other (two live storages sharing bytes: an alias and its source) are
kept in one *cluster* whose bounds cover them all; clusters never overlap, so their ends are
sorted like their starts, and a query walks back from the last cluster starting before ``b``
until a cluster ends at or before ``a``. A cluster's bounds shrink to its members when one
leaves and the cluster leaves with its last member.

Issue 19: a range is added to the sorted clusters only when a query needs it. Until then it
waits in a dict (``O(1)`` to add and to remove): op-level runs hold and release a storage per
op output while in-place ops are a few per layer, so most ranges come and go without ever
being sorted. Each range enters the clusters at most once (``O(log n)``), at the first query
after it was added.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right


class AddressRanges:
    """Byte ranges ``[key, end)`` keyed by their start address; overlap queries by bisection.

    ``add`` and ``discard`` of a range not yet queried: ``O(1)``. A query: ``O(log n + k)``
    for ``n`` ranges and ``k`` hits, plus ``O(log n)`` for each range added since the previous
    query (moved into the sorted clusters once). Removing a sorted range: ``O(log n)``
    comparisons plus one list deletion (a ``memmove`` of at most ``n`` pointers).

    A cluster of one range (nearly all of them: storages rarely alias) is just its start in
    ``_starts`` and its end in ``_cend``; one of several ranges also has its members in
    ``_cmem``.
    """

    __slots__ = ("_cend", "_cmem", "_ends", "_pending", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []  # sorted cluster starts
        self._cend: dict[int, int] = {}  # cluster start -> cluster end
        self._cmem: dict[int, dict[int, int]] = {}  # start -> {key: end}, clusters of >= 2
        self._ends: dict[int, int] = {}  # key in a cluster -> end of its range
        self._pending: dict[int, int] = {}  # key not sorted yet -> end of its range

    def __len__(self) -> int:
        """The number of keys (ranges) indexed."""
        return len(self._ends) + len(self._pending)

    def end(self, key: int) -> int:
        """The end of ``key``'s range (0 when ``key`` is not indexed)."""
        return self._ends.get(key) or self._pending.get(key, 0)

    def add(self, key: int, end: int) -> None:
        """Index ``[key, end)`` (an indexed ``key`` keeps the larger of its two ends).

        Raises:
            ValueError: an empty range (``end <= key``).
        """
        if end <= key:
            raise ValueError(f"empty address range [{key}, {end})")
        sorted_end = self._ends.get(key)
        if sorted_end is None:
            pending = self._pending
            if end > pending.get(key, 0):
                pending[key] = end
        elif end > sorted_end:
            self._insert(key, end)

    def discard(self, key: int) -> None:
        """Forget ``key``'s range (nothing if it is not indexed)."""
        if self._pending.pop(key, None) is None and key in self._ends:
            self._remove(key)

    def overlapping(self, start: int, end: int) -> list[int]:
        """The keys whose range overlaps ``[start, end)`` (shares at least one byte)."""
        if self._pending:
            for key, e in self._pending.items():
                self._insert(key, e)
            self._pending.clear()
        starts, cend, cmem = self._starts, self._cend, self._cmem
        i = bisect_left(starts, end)  # clusters starting before ``end``: starts[:i]
        hits: list[int] = []
        while i:
            i -= 1
            s = starts[i]
            if cend[s] <= start:  # ends are sorted too: no earlier cluster reaches ``start``
                break
            members = cmem.get(s)
            if members is None:  # one range: the cluster's own
                hits.append(s)
                continue
            for k, e in members.items():
                if k < end and e > start:
                    hits.append(k)
        return hits

    def clear(self) -> None:
        """Forget every range."""
        self._starts.clear()
        self._cend.clear()
        self._cmem.clear()
        self._ends.clear()
        self._pending.clear()

    def _insert(self, key: int, end: int) -> None:
        """Put ``[key, end)`` (``end`` at least ``key``'s sorted end) into the clusters."""
        self._ends[key] = end
        starts, cend, cmem = self._starts, self._cend, self._cmem
        hi = bisect_left(starts, end)  # clusters starting before ``end``: starts[:hi]
        lo = hi
        while lo and cend[starts[lo - 1]] > key:
            lo -= 1
        if lo == hi:  # overlaps no cluster: a new one
            starts.insert(hi, key)
            cend[key] = end
            return
        first = starts[lo]
        if hi - lo == 1 and first <= key:  # inside (or extending) one cluster
            members = cmem.get(first)
            if members is None:
                if first == key:  # its own one-range cluster, extended
                    cend[key] = end
                    return
                members = cmem[first] = {first: cend[first]}
            members[key] = end
            if end > cend[first]:
                cend[first] = end
            return
        merged: dict[int, int] = {}
        top = end
        for s in starts[lo:hi]:  # merge every cluster [key, end) overlaps into one
            e = cend.pop(s)
            top = max(top, e)
            members = cmem.pop(s, None)
            if members is None:
                merged[s] = e
            else:
                merged.update(members)
        merged[key] = end  # after the merge: ``key`` may be a member with its old end
        start = min(first, key)
        starts[lo:hi] = [start]
        cend[start] = top
        cmem[start] = merged

    def _remove(self, key: int) -> None:
        """Take ``key`` (sorted) out of its cluster."""
        del self._ends[key]
        starts, cend, cmem = self._starts, self._cend, self._cmem
        i = bisect_right(starts, key) - 1  # the cluster holding ``key``: the last starting <= it
        s = starts[i]
        members = cmem.get(s)
        if members is None:  # its own one-range cluster
            del starts[i], cend[s]
            return
        del members[key]
        del cend[s], cmem[s]
        # shrink to the members left (their bounds stay between the neighbours': same slot)
        new = min(members)
        starts[i] = new
        cend[new] = max(members.values())
        if len(members) > 1:
            cmem[new] = members
