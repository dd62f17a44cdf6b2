"""Input normalisation: every input kind of issue 2 §3 becomes a dense CPU tensor or a status."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from parity_tracker.compare.convert import to_tensor


def test_tensor_kept_and_device_recorded() -> None:
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    conv = to_tensor(t)
    assert conv.status is None and conv.device == "cpu" and conv.dtype == "int32"
    assert conv.shape == (2, 3) and torch.equal(conv.tensor, t)


def test_requires_grad_detached() -> None:
    t = torch.ones(3, requires_grad=True) * 2
    conv = to_tensor(t)
    assert not conv.tensor.requires_grad
    assert conv.tensor.tolist() == [2.0, 2.0, 2.0]


def test_non_contiguous_and_expanded_materialised() -> None:
    base = torch.arange(12.0).reshape(3, 4)
    conv = to_tensor(base.t())
    assert conv.tensor.is_contiguous() and conv.shape == (4, 3)
    assert conv.tensor.numpy().tolist() == np.arange(12.0).reshape(3, 4).T.tolist()
    e = torch.tensor([1.5, 2.5]).expand(3, 2)
    conv = to_tensor(e)
    assert conv.tensor.stride() == (2, 1)
    assert conv.tensor.numpy().tolist() == [[1.5, 2.5]] * 3


def test_conjugate_view_resolved() -> None:
    z = torch.tensor([1 + 2j, 3 - 1j])
    conv = to_tensor(z.conj())
    assert not conv.tensor.is_conj()
    assert conv.tensor.tolist() == [1 - 2j, 3 + 1j]


def test_quantized_dequantized_with_params() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_tensor(torch.tensor([0.1, 0.5, -0.2]), 0.1, 3, torch.qint8)
    conv = to_tensor(q)
    assert conv.dtype == "qint8" and conv.tensor.dtype == torch.float32
    # stored ints round(x/0.1) + 3 = [4, 8, 1]; dequantized (q - 3)·0.1
    assert conv.quant.int_repr.tolist() == [4, 8, 1]
    assert (conv.quant.scale, conv.quant.zero_point) == (0.1, 3)
    assert conv.tensor.numpy() == pytest.approx(np.array([1, 5, -2]) * 0.1, abs=1e-7)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_to_dense(layout) -> None:
    dense = np.array([[0.0, 2.0], [3.0, 0.0]])
    t = torch.from_numpy(dense)
    sparse = t.to_sparse() if layout == "coo" else t.to_sparse_csr()
    conv = to_tensor(sparse)
    assert conv.status is None and conv.tensor.layout == torch.strided
    assert conv.tensor.numpy().tolist() == dense.tolist()


def test_meta_skipped() -> None:
    conv = to_tensor(torch.empty(2, 3, device="meta"), "candidate")
    assert conv.status == "skipped" and conv.tensor is None
    assert "candidate" in conv.message and conv.shape == (2, 3) and conv.device == "meta"


def test_numpy_arrays() -> None:
    a = np.array([[1, 2], [3, 4]], dtype=">i4")  # big-endian: converted to native order
    conv = to_tensor(a)
    assert conv.dtype == "int32" and conv.tensor.tolist() == [[1, 2], [3, 4]]
    ro = np.arange(3.0)
    ro.setflags(write=False)
    assert to_tensor(ro).tensor.tolist() == [0.0, 1.0, 2.0]
    assert to_tensor(np.float32(2.5)).dtype == "float32"
    assert to_tensor(np.arange(6)[::2]).tensor.tolist() == [0, 2, 4]
    bad = to_tensor(np.array(["a", "b"]))
    assert bad.status == "error" and "<U1" in bad.message


class _DLPackOnly:
    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class _ArrayOnly:
    def __array__(self, dtype=None, copy=None):
        return np.array([[7.0, 8.0]], dtype=np.float64)


def test_dlpack_and_array_protocols() -> None:
    conv = to_tensor(_DLPackOnly(np.array([1.5, -2.0], dtype=np.float32)))
    assert conv.status is None and conv.dtype == "float32"
    assert conv.tensor.tolist() == [1.5, -2.0]
    conv = to_tensor(_ArrayOnly())
    assert conv.dtype == "float64" and conv.tensor.tolist() == [[7.0, 8.0]]


@pytest.mark.parametrize(
    ("value", "dtype"),
    [(True, "bool"), (3, "int64"), (2.5, "float64"), (1 - 1j, "complex128")],
)
def test_python_scalars_zero_d(value, dtype) -> None:
    conv = to_tensor(value)
    assert conv.dtype == dtype and conv.shape == () and conv.tensor.item() == value


def test_python_int_too_large() -> None:
    conv = to_tensor(2**70)
    assert conv.status == "error" and "int64" in conv.message


def test_none_and_unsupported_types() -> None:
    conv = to_tensor(None, "candidate")
    assert conv.status == "error" and "candidate is None" in conv.message
    conv = to_tensor({"a": 1})
    assert conv.status == "error" and "builtins.dict" in conv.message
    conv = to_tensor([1.0, 2.0])
    assert conv.status == "error" and "builtins.list" in conv.message


class _BrokenArray:
    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("boom")


def test_broken_protocol_object_is_an_error_not_a_raise() -> None:
    conv = to_tensor(_BrokenArray())
    assert conv.status == "error" and "_BrokenArray" in conv.message and "boom" in conv.message


def test_complex32_widened_exactly() -> None:
    z = torch.tensor([1 + 2j, 0.5 - 0.25j], dtype=torch.complex64).to(torch.complex32)
    conv = to_tensor(z)
    assert conv.dtype == "complex32" and conv.tensor.dtype == torch.complex64
    assert conv.tensor.tolist() == [1 + 2j, 0.5 - 0.25j]


def test_zero_d_numpy_keeps_shape_and_matches_torch() -> None:
    from parity_tracker.compare import compare_tensors

    conv = to_tensor(np.array(2.5, dtype=np.float32))
    assert conv.shape == () and tuple(conv.tensor.shape) == ()
    got = compare_tensors(np.array(2.5, dtype=np.float32), torch.tensor(2.5))
    assert got.status == "equal" and got.ref_shape == ()


def test_dense_cpu_is_lossless_and_shared_by_dump():
    """``dense_cpu``: sparse to dense, conjugate bit resolved, quantized kept; meta refused."""
    import pytest

    from parity_tracker.compare.convert import dense_cpu, is_dtensor
    from parity_tracker.errors import InputError

    dense = np.array([[0.0, 2.5], [-1.0, 0.0]], dtype=np.float32)
    sparse = torch.from_numpy(dense).to_sparse()
    out = dense_cpu(sparse)
    assert out.layout == torch.strided and np.array_equal(out.numpy(), dense)
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    conj = dense_cpu(z.conj())
    assert not conj.is_conj()
    assert np.array_equal(conj.numpy(), np.array([1 - 2j, 3 + 1j], dtype=np.complex64))
    q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0]), 0.5, 0, torch.quint8)
    kept = dense_cpu(q)
    assert kept.is_quantized and kept.int_repr().tolist() == [1, 2]
    assert not is_dtensor(torch.zeros(1))
    with pytest.raises(InputError):
        dense_cpu(torch.empty(2, device="meta"))
