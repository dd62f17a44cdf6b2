"""Snapshots of captured tensors that later in-place operations cannot rewrite."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from parity_tracker.compare.batch import HeldBytes, readable_dtype
from parity_tracker.compare.batch import _copy as copy_bytes
from parity_tracker.compare.convert import tensor_version
from parity_tracker.compare.core import Comparison
from parity_tracker.compare.hashing import (
    _IS_COW_TENSOR as _IS_COW,
)
from parity_tracker.compare.hashing import (
    _NUMPY_DTYPES,
    c_order,
    content_hash,
    content_hash_in_place,
    digestible,
    storage_digest,
)

#: Smallest snapshot (bytes) taken copy-on-write (``torch._lazy_clone``) instead of cloned:
#: below it a clone costs less than the content hash a copy-on-write snapshot needs.
COW_MIN_BYTES = 64 << 10

_LAZY_CLONE = getattr(torch, "_lazy_clone", None)
_STORAGE_ADDRESS = getattr(torch._C, "_storage_address", None)
#: the address of a tensor's data, read without materializing a copy-on-write storage
_DATA_ADDRESS = getattr(torch._C, "_data_address", None)
_COW = None not in (_LAZY_CLONE, _IS_COW, _STORAGE_ADDRESS, _DATA_ADDRESS)
_C_ORDER = True  # permuted (channels-last) sources copied in C order


class _Entry:
    """What :class:`Snapshotter` remembers of one source tensor and its copy.

    ``copy_digest``: the copy's storage digest (computed on the first reuse); ``source_digest``:
    the source's storage digest when the copy was taken (a C-order copy of a permuted source,
    whose storage order differs from the copy's); ``storage``: the source's ``StorageImpl``
    address (copy-on-write snapshots, whose source must not be read: see :meth:`Snapshotter.take`).
    """

    __slots__ = (
        "copy", "copy_digest", "layout", "source", "source_digest", "storage", "version",
    )  # fmt: skip

    def __init__(self, source, version, layout, copy) -> None:
        self.source = source
        self.version = version
        self.layout = layout
        self.copy = copy
        self.copy_digest: int | None = None
        self.source_digest: int | None = None
        self.storage: int | None = None


class _KeyRef(weakref.ref):
    """A weak reference that knows its table key: one shared callback per table, no closure.

    Issue 19: a closure per snapshot (a function, a cell and the reference) was three
    garbage-collected objects and ≈ 0.1 µs more per snapshot; this is one.
    """

    __slots__ = ("key",)


def _key_ref(obj: Any, callback: Callable[[Any], None], key: int) -> _KeyRef:
    ref = _KeyRef(obj, callback)
    ref.key = key
    return ref


def _data_ptr(t: torch.Tensor) -> int:
    """The storage's data address, never materializing a copy-on-write storage.

    ``Tensor.data_ptr()`` would copy a pinned parameter given as a module input (``pin``).
    """
    return t.data_ptr() if _DATA_ADDRESS is None else _DATA_ADDRESS(t)


def _dropper(table: dict) -> Callable[[_KeyRef], None]:
    """The callback removing ``table[ref.key]`` when its object dies (not a newer entry)."""

    def dropped(ref: _KeyRef) -> None:
        entry = table.get(ref.key)
        if entry is not None and entry[0] is ref:
            del table[ref.key]

    return dropped


def _keyed_by_id(table: dict, dropped: Callable, obj: Any, value: Any) -> None:
    """``table[id(obj)] = (weak reference to obj, value)``, removed when ``obj`` dies.

    ``dropped``: the table's :func:`_dropper`.
    """
    key = id(obj)
    table[key] = (_key_ref(obj, dropped, key), value)


def _layout(t: torch.Tensor, ptr: bool = True) -> tuple:
    """Everything but the contents that a reuse must find unchanged (``.data =`` swaps them).

    The conjugate and negative bits too: ``y.data = y.conj()`` (or ``torch._C._set_conj``)
    changes the values ``y`` stands for over the same buffer, version and strides (w8brk1).

    ``ptr=False`` leaves out the data pointer: reading it from a copy-on-write tensor copies
    its storage (the pointer is then checked through the copy-on-write state instead).
    """
    return (
        _data_ptr(t) if ptr else None,
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
        t.is_conj(),
        t.is_neg(),
    )


def _small_plain(t: torch.Tensor) -> bool:
    """A plain contiguous non-empty CPU tensor of a numpy dtype under :data:`COW_MIN_BYTES`.

    One check for :meth:`Snapshotter.take`'s common case (issue 19): such a tensor is
    :func:`~parity_tracker.compare.hashing.digestible`, not copy-on-write eligible, not
    permuted and requires no grad (cloned as it is).
    """
    return (
        type(t) is torch.Tensor
        and _DATA_ADDRESS is not None
        and t.is_cpu
        and not t.requires_grad
        and t.dtype in _NUMPY_DTYPES
        and t.layout == torch.strided
        and t.is_contiguous()
        and 0 < t.nbytes < COW_MIN_BYTES
        and not t.is_conj()
        and not t.is_neg()
    )


def _permuted(t: torch.Tensor) -> bool:
    """A plain strided, non-quantized tensor that is not contiguous (copied in C order)."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and not t.is_quantized
        and not t.is_nested
        and not t.is_contiguous()
    )


def _lazy_clone(t: torch.Tensor) -> torch.Tensor | None:
    """``torch._lazy_clone(t)``, or None where torch refuses (the caller clones instead).

    torch 2.13 raises ``INTERNAL ASSERT FAILED ... Cannot set materializer`` for a tensor
    grown by ``resize_`` after an earlier lazy clone of it (torch alone:
    ``c = torch._lazy_clone(y); y.resize_(201, 200); torch._lazy_clone(y)``; w8brk1).
    """
    try:
        return _LAZY_CLONE(t)
    except RuntimeError:
        return None


def _cow_eligible(t: torch.Tensor) -> bool:
    """A plain, contiguous CPU tensor of a numpy dtype that fills its whole storage, large enough.

    The whole storage: a lazy clone shares (and pins) the whole storage, so a small view of a
    large buffer (a KV cache) would pin the buffer and make its next write copy all of it.
    """
    if not _COW or type(t) not in (torch.Tensor, torch.nn.Parameter) or t.requires_grad:
        return False
    if t.numel() * t.element_size() < COW_MIN_BYTES:  # first: most captures are small (issue 19)
        return False
    return _whole_storage(t)


def _whole_storage(t: torch.Tensor) -> bool:
    """A contiguous, strided CPU tensor of a numpy dtype, offset 0, filling its whole storage."""
    nbytes = t.numel() * t.element_size()
    if not t.is_cpu or t.layout != torch.strided or t.dtype not in _NUMPY_DTYPES:
        return False
    if t.is_conj() or t.is_neg() or not t.is_contiguous() or t.storage_offset() != 0:
        return False
    return t.untyped_storage().nbytes() == nbytes


def pinned_whole(t: torch.Tensor, limit: int) -> bool:
    """A parameter :meth:`Snapshotter.pin` holds copy-on-write, of at most ``limit`` bytes.

    Such a parameter may be held as its bytes instead (``compare.batch.HeldBytes``: the values
    of capture time, as the lazy clone keeps them, and also past a write through a raw view
    taken before the capture); a view of a larger buffer may not (``pin`` holds it by
    reference, and a counted write after its capture makes its pair an ``error``).
    """
    return _whole_nbytes(t, limit) >= 0


def _whole_nbytes(t: torch.Tensor, limit: int) -> int:
    """``t.nbytes`` when :func:`pinned_whole` holds, else -1 (its tests, issue 19)."""
    if not _COW or readable_dtype(t) is None:
        return -1
    n = t.nbytes  # numel * element_size of a strided tensor (torch's docs)
    if n > limit or not t.is_contiguous() or t.storage_offset() != 0:
        return -1
    return n if t.untyped_storage().nbytes() == n else -1


def param_bytes(t: torch.Tensor, limit: int, shape: tuple[int, ...] | None) -> HeldBytes | None:
    """The values of a :func:`pinned_whole` parameter ``t`` now, as bytes; else None.

    ``HeldBytes.of(t, shape)`` when ``pinned_whole(t, limit)`` holds, fused (issue 19: one
    read of each property). ``shape``: ``tuple(t.shape)`` when the caller has it (the
    capture's ``meta``).
    """
    n = _whole_nbytes(t, limit)
    if n < 0:
        return None
    return HeldBytes(copy_bytes(t, n), t.dtype, tuple(t.shape) if shape is None else shape)


class Snapshotter:
    """Detach-and-clone snapshots; one copy is shared only while its source provably is unchanged.

    A module's input is usually the previous module's output: the same tensor object, not
    modified in between. Handing out one copy for both halves the memory of a module-level
    capture. The version counter alone does not prove the tensor unchanged: writes through
    ``.data``, ``.numpy()`` and DLPack views, ``out=`` kernels of C++ extensions and custom ops
    that mutate their inputs do not bump it (issue 13, item 1). So a copy is reused only when
    the same object (weak reference: a freed object never aliases a new one), with the same
    version counter, data pointer, offset, shape, strides, dtype and device, also has the same
    bytes as the copy: the xxh3-64 digest (``compare.hashing.storage_digest``) of the source,
    read now, equals the copy's (computed once, the copy is never written). Anything whose
    bytes cannot be read cheaply (GPU, gaps or broadcasts, subclasses, quantized) is copied
    again. Cost:
    one hash of the source and, once per copy, of the copy (``benchmarks/README.md``, "Shared
    snapshots"). The cache holds the copies weakly: a copy lives exactly as long as some
    capture holds it, so releasing captures (the eager path) frees memory.
    """

    def __init__(self) -> None:
        self._seen: dict[int, _Entry] = {}
        self._copies: dict[int, weakref.ref] = {}
        #: id(copy-on-write snapshot) -> its content hash when taken (``content_hash``)
        self._hashes: dict[int, str] = {}
        #: id(parameter held by reference) -> (weak reference, version counter when captured)
        self._pinned: dict[int, tuple[weakref.ref, int]] = {}
        #: id(lazy clone of a parameter) -> (weak reference to it, the parameter's detached alias)
        self._pins: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        #: id(pin hold: lazy clone or parameter alias) -> (weak reference, content hash at pin)
        self._pin_hashes: dict[int, tuple[weakref.ref, str]] = {}
        self._forget = _forgetter(self._seen)
        self._drop_pin, self._drop_pinned = _dropper(self._pins), _dropper(self._pinned)
        self._drop_pin_hash = _dropper(self._pin_hashes)
        self._gone = _copy_gone(self._copies, self._hashes)
        #: largest tensor (bytes) :meth:`take` holds as its bytes (``HeldBytes``); 0: none. Set
        #: by the TensorChecker's holder in runs whose small pairs are compared in bulk.
        self.bytes_max = 0
        #: id(source) -> weak reference to the ``HeldBytes`` last taken of it (one copy shared
        #: by the captures of one unchanged activation, see :meth:`_take_bytes`)
        self._bytes_seen: dict[int, _KeyRef] = {}
        self._bytes_gone = _ref_gone(self._bytes_seen)
        self.sealed_spill: Callable[[torch.Tensor], Any] = lambda _t: None  # OpStore's (w9lend)

    def owns(self, value: object) -> bool:
        """True for a live copy this snapshotter made (nobody writes it: no re-check needed)."""
        ref = self._copies.get(id(value))
        return ref is not None and ref() is value

    def take(self, t: torch.Tensor) -> torch.Tensor | HeldBytes | Any:
        """A detached copy of ``t`` that no later write to ``t``, counted or not, can change.

        Four kinds of copy (issue 19, item 3):

        - with :attr:`bytes_max` set (a run comparing small pairs in bulk), a plain CPU
          tensor of at most that many bytes (and under :data:`COW_MIN_BYTES`): its bytes
          (``compare.batch.HeldBytes``, :meth:`_take_bytes`), not a tensor;
          ``HeldBytes.load`` gives the tensor back.

        - copy-on-write (``torch._lazy_clone``; a plain contiguous CPU tensor of at least
          :data:`COW_MIN_BYTES` filling its storage): no bytes copied now; torch copies the
          storage before any write to it through torch (in-place ops, ``.data``, ``out=``,
          ``.numpy()`` / DLPack / ``data_ptr()`` taken after this call), so the copy keeps the
          values of now. A write through a raw view taken BEFORE this call (a numpy array kept
          from earlier) reaches both: the content hash taken now (:meth:`recorded_hash`) is
          checked against the comparison's (:meth:`verified`), and a changed copy is an
          ``error`` pair, never a verdict on other values.
        - a C-order copy of a non-contiguous source (or the op store's sealed file of its bytes);
        - a clone (the rest).
        """
        limit = self.bytes_max
        if limit:  # holdable(t, min(bytes_max, COW_MIN_BYTES - 1)): its bytes, not a clone
            dtype = readable_dtype(t)
            if dtype is not None:
                n = t.nbytes
                if n <= limit and n < COW_MIN_BYTES:  # (never a copy-on-write copy)
                    return self._take_bytes(t, n, dtype)
        version = tensor_version(t)
        key = id(t)
        copy = self._reusable(key, t, version)
        if copy is not None:
            return copy
        if version is not None and _small_plain(t):  # most captures: checks made in one step
            return self._take_small(key, t)
        # a detached copy records no autograd graph; a plain tensor that requires no grad is
        # cloned as it is (the same copy, without the detached alias: issue 19)
        src = t if type(t) is torch.Tensor and not t.requires_grad else t.detach()
        if _cow_eligible(src):
            digest = content_hash_in_place(src)  # not numpy(): it would un-share a COW src
            copy = _lazy_clone(src)
            if copy is None:
                copy = src.clone()
            else:
                self._hashes[id(copy)] = digest
        elif _C_ORDER and _permuted(src):
            sealed = self.sealed_spill(src)  # op-level: the op store's file of these bytes
            if sealed is not None:
                return sealed
            copy = _c_order_copy(src)
        else:
            copy = src.clone()
        self._own(copy)
        if version is not None and digestible(t):
            self._remember(key, t, version, copy)
        return copy

    def _take_bytes(self, t: torch.Tensor, n: int, dtype: torch.dtype) -> HeldBytes:
        """:meth:`take`'s copy of a small tensor as its bytes (``HeldBytes.of``, issue 19).

        A module's input is usually the previous module's output: the ``HeldBytes`` last taken
        of the same object (same ``id``) is handed out again when it holds exactly the bytes,
        dtype and shape read now. The whole contents are compared (``bytes ==``), not a digest,
        so the shared copy holds the values of now whatever happened in between (a write
        counted or not, another object under a reused ``id``). Cost: one byte copy and, for an
        earlier copy of the same object, one ``memcmp``. ``n``: ``t.nbytes``; ``dtype``:
        ``t.dtype`` (``compare.batch.readable_dtype``).
        """
        data = copy_bytes(t, n)
        key, shape = id(t), t.shape  # a torch.Size equals the tuple of its sizes
        ref = self._bytes_seen.get(key)
        if ref is not None:
            old = ref()
            if old is not None and old.data == data and old.dtype == dtype and old.shape == shape:
                return old
        held = HeldBytes(data, dtype, tuple(shape))  # HeldBytes.of(t), its bytes read once
        self._bytes_seen[key] = _key_ref(held, self._bytes_gone, key)  # dropped when it dies
        return held

    def _take_small(self, key: int, t: torch.Tensor) -> torch.Tensor:
        """:meth:`take`'s clone of a :func:`_small_plain` ``t`` (no earlier copy to reuse).

        The same copy and reuse entry as the general path, without its re-checks: ``t`` is
        not copy-on-write eligible (under :data:`COW_MIN_BYTES`), not permuted, digestible,
        and its clone has its strides (so the copy's digest is the source's: no
        ``source_digest``).
        """
        copy = t.clone()
        self._own(copy)
        try:
            ref = _key_ref(t, self._forget, key)
        except TypeError:  # an object that refuses weak references gets no reuse
            return copy
        stride = t.stride()
        layout = (
            _DATA_ADDRESS(t), t.storage_offset(), tuple(t.shape), stride, t.dtype, t.device,
            False, False,  # _small_plain: neither conjugate nor negative
        )  # fmt: skip
        self._seen[key] = _Entry(ref, t._version, layout, weakref.ref(copy))
        return copy

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        """A parameter held with its value of capture time, or with what proves it unchanged.

        Three holds (issue 19; w11trust):

        - a small plain CPU parameter filling its storage (:func:`_small_plain`: under
          :data:`COW_MIN_BYTES`) is cloned: its capture-time values whatever is written to it
          later, through torch or through a raw view (``torch.from_numpy``, ``.numpy()``,
          DLPack, a pointer) taken before the capture;
        - a plain contiguous CPU parameter filling its storage is a lazy clone (≈ 1 µs, no
          bytes copied; torch copies the storage if either is written through torch while the
          capture lives);
        - any other parameter (a view of a flat buffer, GPU) stays a reference whose version
          counter is recorded: a counted write makes its pair an ``error`` (:meth:`verified`).

        The last two also record the content hash of the parameter's CPU bytes now (xxh3,
        read in place: ≈ 0.03 ms per MiB; a view with gaps or overlaps, or a conjugate view,
        through its C-order copy: :func:`_pin_hashable`). A write that torch does not see
        (through a raw view or pointer taken before the capture, which reaches the lazy
        clone's shared buffer too, or ``.data`` / numpy on a parameter held by reference)
        then makes the comparison an ``error`` naming the change (:meth:`verified`), never a
        verdict on other values. The check is free when the comparison hashes the side it
        compares (``Comparison.ref_hash`` / ``cand_hash``). Not covered: an uncounted write
        to a non-CPU parameter held by reference (its bytes are not hashed).
        """
        d = t.detach()
        if _small_plain(d) and d.storage_offset() == 0 and d.untyped_storage().nbytes() == d.nbytes:
            copy = d.clone()
            self._own(copy)
            return copy
        digest = _pin_digest(d) if _pin_hashable(d) else None
        if _COW and type(t) in (torch.Tensor, torch.nn.Parameter) and _whole_storage(d):
            try:
                copy = _LAZY_CLONE(d)
            except RuntimeError:  # an inference tensor or a storage torch will not share
                copy = None
            if copy is not None:
                _keyed_by_id(self._pins, self._drop_pin, copy, d)
                self._pin_digest(copy, d, digest)
                return copy
        version = tensor_version(d)
        if version is not None:
            _keyed_by_id(self._pinned, self._drop_pinned, d, version)
        self._pin_digest(d, None, digest)
        return d

    def _pin_digest(self, copy: torch.Tensor, alias: torch.Tensor | None, digest) -> None:
        """Record ``digest`` (the content hash at :meth:`pin`) for ``copy`` and ``alias``."""
        if digest is None:
            return
        _keyed_by_id(self._pin_hashes, self._drop_pin_hash, copy, digest)
        if alias is not None:
            _keyed_by_id(self._pin_hashes, self._drop_pin_hash, alias, digest)

    def pinned_hash(self, value: object) -> str | None:
        """The content hash a :meth:`pin` hold (lazy clone or parameter alias) had when pinned."""
        entry = self._pin_hashes.get(id(value))
        return entry[1] if entry is not None and entry[0]() is value else None

    def unpin(self, value: Any) -> Any:
        """The parameter itself for a :meth:`pin` copy that still shares its buffer, else ``value``.

        Sharing the buffer means no write through torch reached either since the capture, so
        the parameter holds the captured values, unless a raw view taken before the capture
        wrote the shared buffer (the hash recorded by :meth:`pin` is checked for either
        value: :meth:`verified`). Comparing the copy would read it through
        numpy, which copies the whole weight while the parameter shares it (≈ +30 % run time
        on a 128 MiB weight-heavy model, w5trust); the caller drops the copy, then compares
        the parameter (no copy).
        """
        entry = self._pins.get(id(value))
        if entry is None or entry[0]() is not value:
            return value
        alias = entry[1]
        return alias if _DATA_ADDRESS(alias) == _DATA_ADDRESS(value) else value

    def _changed_param(self, value: object) -> bool:
        """True for a parameter held by reference (:meth:`pin`) written since its capture."""
        entry = self._pinned.get(id(value))
        return entry is not None and entry[0]() is value and value._version != entry[1]

    def unverified(self, value: object) -> bool:
        """True for a value :meth:`verified` must check (not comparable in bulk as it is).

        A copy-on-write snapshot or a pinned parameter with a recorded hash, or a parameter
        held by reference written since its capture.
        """
        if self._hashes and self.recorded_hash(value) is not None:
            return True
        if self._pin_hashes and self.pinned_hash(value) is not None:
            return True
        return bool(self._pinned) and self._changed_param(value)

    def _remember(self, key: int, t: torch.Tensor, version: int, copy: torch.Tensor) -> None:
        """Keep the reuse entry of ``t`` and its fresh ``copy`` (see :meth:`_reusable`)."""
        try:  # a try, not contextlib.suppress (≈ 0.3 µs a call, issue 19)
            ref = _key_ref(t, self._forget, key)
            cow = id(copy) in self._hashes
            entry = _Entry(ref, version, _layout(t, ptr=not cow), weakref.ref(copy))
            if cow:
                entry.storage = _STORAGE_ADDRESS(t)
            elif copy.stride() != t.stride():
                entry.source_digest = storage_digest(t)
        except TypeError:  # an object that refuses weak references gets no reuse
            return
        self._seen[key] = entry

    def _reusable(self, key: int, t: torch.Tensor, version: int | None) -> torch.Tensor | None:
        """The earlier copy of ``t`` when every check above holds, else None.

        Same object (weak reference), version counter, layout, and the same bytes: the source
        hashes as the copy (or as itself when the copy was taken), or, for a copy-on-write
        copy, both still share one storage that was never copied (a write through torch
        would have given the source its own storage), so their bytes are the same bytes.
        """
        entry = self._seen.get(key)
        if entry is None or version is None or entry.source() is not t:
            return None
        copy = entry.copy()
        if copy is None or entry.version != version:
            return None
        if entry.storage is not None:
            same = (
                entry.layout == _layout(t, ptr=False)
                and _STORAGE_ADDRESS(t) == entry.storage
                and _IS_COW(t)
                and _IS_COW(copy)
            )
            if not same:
                return None
            if _DATA_ADDRESS(t) == _DATA_ADDRESS(copy):
                return copy  # one buffer: the same bytes
            # The source has its own buffer now: a read through numpy / data_ptr() copied it
            # (same bytes), or an uncounted write (``.data``, numpy) changed it before another
            # lazy clone (a second checker) made it copy-on-write again. Only the bytes tell.
            h = self._hashes.get(id(copy))
            return copy if h is not None and content_hash_in_place(t) == h else None
        if entry.layout != _layout(t):
            return None
        if entry.source_digest is not None:
            return copy if storage_digest(t) == entry.source_digest else None
        if entry.copy_digest is None:
            entry.copy_digest = storage_digest(copy)
        return copy if storage_digest(t) == entry.copy_digest else None

    def recorded_hash(self, value: object) -> str | None:
        """The content hash a copy-on-write snapshot had when taken (None for other values)."""
        h = self._hashes.get(id(value))
        return h if h is not None and self.owns(value) else None

    def intact(self, value: object) -> bool:
        """False for a copy-on-write snapshot whose bytes changed since it was taken.

        Read in place (``content_hash_in_place``): ``content_hash`` would give the snapshot a
        private copy of its bytes first, and keep the copy's data address off the buffer it
        shares (issue 19).
        """
        h = self.recorded_hash(value)
        return h is None or content_hash_in_place(value) == h

    def verified(self, tag: str, ref: Any, cand: Any, comp: Comparison) -> Comparison:
        """``comp``, or an ``error`` when a copy-on-write side no longer holds its captured values.

        Free in the common case: the comparison's own content hash of the side equals the one
        recorded when the snapshot was taken; otherwise (``align`` or a conversion changed
        what was hashed) the snapshot is hashed again.
        """
        for side, value, hashed in (
            ("reference", ref, comp.ref_hash),
            ("candidate", cand, comp.cand_hash),
        ):
            if self._pinned and self._changed_param(value):
                return Comparison(
                    status="error",
                    mode=comp.mode,
                    message=(
                        f"{tag}: the {side}'s parameter was modified in place after it was "
                        "captured (held by reference: a view or a non-CPU tensor); its value "
                        "at capture time was not kept; not compared"
                    ),
                )
            if self._pin_hashes:
                h = self.pinned_hash(value)
                if h is not None and hashed != h and content_hash(value) != h:
                    return _changed_pin(tag, side, comp)
            h = self.recorded_hash(value)
            if h is None or hashed == h or content_hash(value) == h:
                continue
            return Comparison(
                status="error",
                mode=comp.mode,
                message=(
                    f"{tag}: the {side}'s snapshot changed after it was captured (a write "
                    "through a numpy/DLPack view or pointer taken before the capture reached "
                    "the copy-on-write snapshot); not compared. Set "
                    "parity_tracker.capture.snapshot.COW_MIN_BYTES = math.inf to copy instead"
                ),
            )
        return comp

    def _own(self, copy: torch.Tensor) -> None:
        key = id(copy)
        self._copies[key] = _key_ref(copy, self._gone, key)

    def __len__(self) -> int:
        return len(self._seen)

    def clear(self) -> None:
        """Forget every snapshot (they stay alive where someone else holds them)."""
        self._seen.clear()
        self._copies.clear()
        self._hashes.clear()
        self._pinned.clear()
        self._pins.clear()
        self._pin_hashes.clear()
        self._bytes_seen.clear()


def _pin_hashable(d: torch.Tensor) -> bool:
    """A CPU tensor :meth:`Snapshotter.pin` hashes: plain, strided, not quantized, any layout.

    Not only :func:`~parity_tracker.compare.hashing.digestible` ones: a parameter that is a
    view with gaps (a column slice of a flat buffer, ``w[:, ::2]``), an overlapping
    ``as_strided`` view or a conjugate view is held by reference, so an uncounted write to it
    (``.data``, a numpy view taken before the capture) read ``equal`` unless its C-order
    contents are hashed (a copy of the view, ``content_hash``; w11brk1).

    A subclass without a ``__torch_dispatch__`` of its own (``as_subclass``, ``_make_subclass``:
    the tensor's own storage under another Python type) too: it was held by reference unhashed
    and a numpy write after its capture read ``equal`` (w11brk1).
    """
    return (
        d.is_cpu
        and (
            type(d) in (torch.Tensor, torch.nn.Parameter)
            or type(d).__torch_dispatch__ is torch.Tensor.__torch_dispatch__
        )
        and d.layout == torch.strided
        and not d.is_quantized
        and not d.is_nested
    )


def _pin_digest(d: torch.Tensor) -> str | None:
    """``content_hash_in_place(d)``; None where ``content_hash`` refuses the view or subclass.

    (A refusal leaves the parameter held as before this check: never a failed capture.)
    """
    if type(d) in (torch.Tensor, torch.nn.Parameter) and digestible(d):
        return content_hash_in_place(d)
    try:
        return content_hash(d)
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return None


def _changed_pin(tag: str, side: str, comp: Comparison) -> Comparison:
    """The ``error`` of a pinned parameter whose bytes differ from those hashed at its pin."""
    return Comparison(
        status="error",
        mode=comp.mode,
        message=(
            f"{tag}: the {side}'s parameter changed after it was captured (its bytes differ "
            "from those hashed at the capture: a write torch does not count, through a "
            "numpy/DLPack view or pointer taken before the capture, .data or numpy); its "
            "value at capture time was not kept; not compared"
        ),
    )


def _forgetter(seen: dict[int, _Entry]) -> Callable[[_KeyRef], None]:
    """The callback dropping a dead source's reuse entry (not a newer one under its id)."""

    def callback(ref: _KeyRef) -> None:
        entry = seen.get(ref.key)
        if entry is not None and entry.source is ref:
            del seen[ref.key]

    return callback


def _c_order_copy(src: torch.Tensor) -> torch.Tensor:
    """A C-order copy of a permuted ``src``; never a view of it (then a plain clone).

    ``hashing.c_order`` is 2–4× faster than ``clone(memory_format=torch.contiguous_format)``
    for a batch-1 channels-last activation (w7ops, issue 19).
    """
    copy = c_order(src)
    if _data_ptr(copy) == _data_ptr(src):
        copy = src.clone(memory_format=torch.contiguous_format)
    return copy


def _ref_gone(table: dict) -> Callable[[_KeyRef], None]:
    """The callback removing ``table[ref.key]`` when it is still ``ref`` (not a newer one)."""

    def callback(ref: _KeyRef) -> None:
        if table.get(ref.key) is ref:
            del table[ref.key]

    return callback


def _copy_gone(copies: dict, hashes: dict) -> Callable[[_KeyRef], None]:
    """The callback dropping a dead copy from ``owns`` and its recorded hash."""

    def callback(ref: _KeyRef) -> None:
        if copies.get(ref.key) is ref:
            del copies[ref.key]
            hashes.pop(ref.key, None)

    return callback


class VerifiedPairs:
    """A pair comparer whose verdicts pass through :meth:`Snapshotter.verified`.

    Args:
        pairs: anything with ``compare(tag, ref, cand, mode, tol, step)`` (``PairComparer``,
            the budget's per-step comparer).
        snap: the snapshotter whose copy-on-write snapshots are checked.
    """

    def __init__(self, pairs: Any, snap: Snapshotter) -> None:
        self.pairs, self.snap = pairs, snap

    def compare(self, tag: str, ref: Any, cand: Any, mode: str, tol: Any, step: int = 0):
        """``pairs.compare(...)``, turned into an ``error`` if a snapshot side changed."""
        comp = self.pairs.compare(tag, ref, cand, mode, tol, step)
        return self.snap.verified(tag, ref, cand, comp)


def __getattr__(name: str) -> Any:
    """``SnapshotStore`` lives in ``capture.snapshot_store`` (split out); still importable here."""
    if name == "SnapshotStore":
        from parity_tracker.capture.snapshot_store import SnapshotStore

        return SnapshotStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
