"""Content hashes: xxh3-64 over dtype, shape and raw bytes, checked against xxhash directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xxhash

from parity_tracker.compare.hashing import StreamHasher, content_hash


def _independent(header: str, raw: bytes) -> str:
    return xxhash.xxh3_64(header.encode() + raw).hexdigest()


def test_matches_xxh3_of_header_and_bytes() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = _independent("float32|(3, 4)|", a.tobytes())
    assert content_hash(torch.from_numpy(a)) == want


@pytest.mark.parametrize(
    ("dtype", "np_view"),
    [(torch.bfloat16, np.uint16), (torch.float8_e4m3fn, np.uint8), (torch.float16, np.uint16)],
)
def test_low_precision_bytes(dtype, np_view) -> None:
    t = torch.tensor([1.0, -2.0, 0.5], dtype=dtype)
    raw = t.view(torch.uint8).numpy().tobytes()
    assert len(raw) == 3 * t.element_size()
    assert content_hash(t) == _independent(f"{str(dtype)[6:]}|(3,)|", raw)


def test_equal_hash_iff_bitwise_identical() -> None:
    a = torch.randn(5, 6)
    assert content_hash(a) == content_hash(a.clone())
    b = a.clone()
    b[4, 5] = torch.nextafter(b[4, 5], torch.tensor(10.0))
    assert content_hash(a) != content_hash(b)
    assert content_hash(torch.tensor([0.0])) != content_hash(torch.tensor([-0.0]))
    assert content_hash(a) != content_hash(a.reshape(6, 5))  # same bytes, other shape
    assert content_hash(a) != content_hash(a.view(torch.int32))  # same bytes, other dtype


def test_views_hash_their_logical_contents() -> None:
    a = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    assert content_hash(a.t()) == content_hash(a.t().contiguous())
    e = torch.tensor([7], dtype=torch.int16).expand(4)
    assert content_hash(e) == _independent("int16|(4,)|", np.full(4, 7, np.int16).tobytes())
    z = torch.tensor(3.0, dtype=torch.float64)
    assert content_hash(z) == _independent("float64|()|", np.float64(3.0).tobytes())
    assert content_hash(torch.empty(0, 3)) == _independent("float32|(0, 3)|", b"")


def test_stream_equals_one_shot() -> None:
    a = torch.randn(1000, dtype=torch.float64)
    h = StreamHasher(a.dtype, (1000,))
    for lo in range(0, 1000, 333):
        h.update(a[lo : lo + 333])
    assert h.hexdigest() == content_hash(a)
    assert len(h.hexdigest()) == 16
