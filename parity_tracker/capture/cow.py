"""Read a storage's address without materializing a copy-on-write storage (``torch._lazy_clone``).

The op recorder (:mod:`parity_tracker.capture.ops`) holds op outputs by reference, indexed by
the address of their storage's data, so that an in-place op first gives each holder a private
copy (``OpStore.before_write``). A module snapshot (``capture.snapshot``) lazily clones the
same tensors; reading the address with ``untyped_storage().data_ptr()`` materialized the
copy-on-write storage: a full copy, and the tensor moved to a new buffer, so the held capture
was no longer found under its address and the in-place write rewrote it (the op row then
compared the written value: ``equal`` for outputs that differed; w5trust,
``tests/test_trust_fastpaths.py``). :func:`storage_address` reads the same address without
materializing (``torch._C._data_address``: the storage's data pointer, const).
"""

from __future__ import annotations

import torch

_DATA_ADDRESS = getattr(torch._C, "_data_address", None)


def storage_address(t: torch.Tensor) -> int:
    """The address of ``t``'s storage data (0 for an empty storage), never materializing it.

    Args:
        t: a strided tensor with a storage (not a wrapper subclass).

    Returns:
        The data address of the storage (the same for every view of it, whatever the offset);
        ``untyped_storage().data_ptr()`` where torch has no ``_data_address``.
    """
    storage = t.untyped_storage()
    if not storage.nbytes():
        return 0
    if _DATA_ADDRESS is None:
        return storage.data_ptr()
    return _DATA_ADDRESS(t)  # the storage's data, whatever the view's offset
