"""Dumps (issue 3, section 3): modes, safe names, index, lossless storage, no overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from parity_tracker.errors import InputError
from parity_tracker.examples import seed_demo
from parity_tracker.files.dump import DumpWriter, load_dump, sanitize, to_numpy
from parity_tracker.tensor_checker import DumpMode, TensorChecker


def index_of(folder: Path) -> dict:
    return json.loads((folder / "index.json").read_text())


def test_not_equal_dumps_only_failing_tags(tmp_path):
    checker = TensorChecker(verbose=False)
    ref, cand, x = seed_demo.build()
    from parity_tracker.tensor_checker import module_register_tensor_checker

    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(x)
        cand(x)
    with torch.no_grad():
        expected = ref.downsample(ref.conv_in(x))
    result = checker.check_equal(dump_mode=DumpMode.NOT_EQUAL, dump_path=tmp_path)
    failing = {r.tag for r in result.results if r.failed}
    assert failing == {"checker_downsample.1", "checker_downsample", "checker_model_output_1"}
    dumped = {r.tag for r in result.results if r.dump_paths}
    assert dumped == failing
    r = result["checker_downsample.1"]
    assert r.dump_paths == (
        "check-0001/checker_downsample.1__ref.npy",
        "check-0001/checker_downsample.1__cand.npy",
    )
    assert r.to_row()["dump_path"] == "check-0001/checker_downsample.1__ref.npy"
    saved = np.load(tmp_path / r.dump_paths[0], allow_pickle=False)
    np.testing.assert_array_equal(saved, expected.numpy())
    entries = index_of(tmp_path / "check-0001")["files"]
    assert len(entries) == 6
    e = entries[0]
    assert e == {
        "tag": "checker_downsample.1",
        "step": 0,
        "side": 0,
        "role": "reference",
        "dtype": "float32",
        "shape": [1, 8, 8, 8],
        "device": "cpu",
        "stored_dtype": "float32",
        "file": "checker_downsample.1__ref.npy",
    }
    assert result.dump_dir == "check-0001"


def _two_failures(checker):
    checker.register_tensor("b_late", torch.ones(2))
    checker.register_tensor("a_early", torch.ones(2))
    checker.register_tensor("a_early", torch.zeros(2))
    checker.register_tensor("b_late", torch.zeros(2))
    checker.register_tensor("ok", torch.ones(1))
    checker.register_tensor("ok", torch.ones(1))


def test_first_not_equal_and_all(tmp_path):
    checker = TensorChecker(verbose=False)
    _two_failures(checker)
    first = checker.check_equal(dump_mode=DumpMode.FIRST_NOT_EQUAL, dump_path=tmp_path)
    # b_late's reference was captured first: it is first in execution order
    assert [r.tag for r in first.results if r.dump_paths] == ["b_late"]
    every = checker.check_equal(dump_mode=DumpMode.ALL, dump_path=tmp_path)
    assert sum(len(r.dump_paths) for r in every.results) == 6
    # a second check into the same dump_path never overwrites the first one's files
    assert every.dump_dir == "check-0002"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["check-0001", "check-0002"]
    assert len(index_of(tmp_path / "check-0001")["files"]) == 2
    none = checker.check_equal()
    assert all(r.dump_paths == () for r in none.results)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["check-0001", "check-0002"]


def test_dump_needs_a_path():
    with pytest.raises(InputError, match="needs a dump_path"):
        TensorChecker(verbose=False).check_equal(dump_mode=DumpMode.ALL)


def test_missing_side_is_dumped_alone(tmp_path):
    checker = TensorChecker(verbose=False)
    checker.register_tensor("lonely/../x", torch.arange(3))
    r = checker.check_equal(dump_mode=DumpMode.NOT_EQUAL, dump_path=tmp_path).results[0]
    assert r.status == "missing_candidate"
    assert len(r.dump_paths) == 1
    name = Path(r.dump_paths[0]).name
    assert "/" not in name[:-4] and ".." not in name
    np.testing.assert_array_equal(np.load(tmp_path / r.dump_paths[0]), np.arange(3))


@pytest.mark.parametrize("dump_mode", [DumpMode.NOT_EQUAL, DumpMode.FIRST_NOT_EQUAL, DumpMode.ALL])
def test_eager_path_keeps_what_the_planned_dump_needs(tmp_path, dump_mode):
    deferred = TensorChecker(verbose=False)
    eager = TensorChecker(verbose=False, eager_mode="equal", dump_mode=dump_mode)
    for c in (deferred, eager):
        _two_failures(c)
    a = deferred.check_equal(dump_mode=dump_mode, dump_path=tmp_path / "d")
    b = eager.check_equal(dump_mode=dump_mode, dump_path=tmp_path / "e")
    assert [r.dump_paths for r in a.results] == [r.dump_paths for r in b.results]
    for path in (p for r in a.results for p in r.dump_paths):
        np.testing.assert_array_equal(
            np.load(tmp_path / "d" / path), np.load(tmp_path / "e" / path)
        )
    if dump_mode is not DumpMode.ALL:  # passing pairs were released
        ok = eager._groups[("ok", 0)]
        assert not any(isinstance(c.value, torch.Tensor) for c in ok.captures)


# ------------------------------------------------------------------------ names
def test_sanitize():
    assert sanitize("checker_conv_in") == "checker_conv_in"
    assert sanitize("checker_block@1_output_0.a") == "checker_block@1_output_0.a"
    bad = sanitize("../etc/passwd")
    assert "/" not in bad and ".." not in bad and not bad.startswith(".")
    assert bad.startswith("__") and len(bad.rsplit("-", 1)[1]) == 8
    assert sanitize("a/b") != sanitize("a_b")  # changed names get a hash suffix
    long = sanitize("x" * 500)
    assert len(long) == 120 and long != sanitize("x" * 501)
    assert sanitize("") != ""


def test_case_insensitive_collisions_get_distinct_files(tmp_path):
    writer = DumpWriter(tmp_path)
    p1 = writer.write("Tag", torch.ones(1), side=0, role="reference")
    p2 = writer.write("tag", torch.ones(1), side=0, role="reference")
    writer.close()
    assert p1.lower() != p2.lower()


# ----------------------------------------------------------------------- lossless
def _roundtrip(tmp_path, tensor):
    writer = DumpWriter(tmp_path)
    writer.write("t", tensor, side=1, role="candidate")
    writer.close()
    [(entry, back)] = load_dump(writer.folder)
    return entry, back


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize(
    "dtype",
    [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float16, torch.complex32],
)
def test_low_precision_is_stored_losslessly(tmp_path, dtype):
    src = (
        (torch.randn(4, 3) * 3).to(dtype)
        if dtype != torch.complex32
        else torch.randn(4, 3, dtype=torch.complex64).to(dtype)
    )
    entry, back = _roundtrip(tmp_path, src)
    assert entry["dtype"] == str(dtype).removeprefix("torch.")
    expected_store = {torch.float16: "float16", torch.complex32: "complex64"}.get(dtype, "float32")
    assert entry["stored_dtype"] == expected_store
    assert back.dtype == dtype
    assert torch.equal(back.view(torch.uint8), src.view(torch.uint8))  # bit-exact
    raw = np.load(tmp_path / "check-0001" / entry["file"], allow_pickle=False)
    assert raw.shape == (4, 3)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_quantized_per_tensor_and_per_channel(tmp_path):
    x = torch.randn(3, 4)
    q = torch.quantize_per_tensor(x, scale=0.05, zero_point=3, dtype=torch.qint8)
    entry, back = _roundtrip(tmp_path / "a", q)
    assert entry["dtype"] == "qint8" and entry["stored_dtype"] == "int8"
    assert entry["scale"] == 0.05 and entry["zero_point"] == 3
    assert torch.equal(back.int_repr(), q.int_repr()) and back.q_scale() == q.q_scale()
    scales = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    zps = torch.tensor([0, 1, 2])
    qc = torch.quantize_per_channel(x, scales, zps, axis=0, dtype=torch.quint8)
    entry, back = _roundtrip(tmp_path / "b", qc)
    assert entry["axis"] == 0 and entry["stored_dtype"] == "uint8"
    assert torch.equal(back.int_repr(), qc.int_repr())
    assert torch.equal(back.q_per_channel_scales(), qc.q_per_channel_scales())
    assert torch.equal(back.dequantize(), qc.dequantize())


def test_sparse_bool_int_and_meta(tmp_path):
    dense = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    array, _, _ = to_numpy(dense.to_sparse())
    np.testing.assert_array_equal(array, dense.numpy())
    array, _, _ = to_numpy(torch.tensor([True, False]))
    assert array.dtype == np.bool_
    array, _, _ = to_numpy(torch.tensor([-(2**40)], dtype=torch.int64))
    assert array[0] == -(2**40)
    writer = DumpWriter(tmp_path)
    assert writer.write("m", torch.empty(2, device="meta"), side=0, role="reference") is None
    writer.close()
    [entry] = index_of(writer.folder)["files"]
    assert "meta tensor" in entry["skipped"] and "file" not in entry
    assert load_dump(writer.folder) == []


def test_load_dump_rejects_other_folders(tmp_path):
    with pytest.raises(InputError, match=r"no index\.json"):
        load_dump(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        DumpWriter(tmp_path / "f")


def test_unplanned_dump_on_the_eager_path_warns(tmp_path):
    checker = TensorChecker(verbose=False, eager_mode="equal")  # dump_mode NOT planned
    _two_failures(checker)
    with pytest.warns(UserWarning, match=r"released the tensors of 2 tag\(s\)"):
        result = checker.check_equal(dump_mode=DumpMode.NOT_EQUAL, dump_path=tmp_path)
    assert all(r.dump_paths == () for r in result.results)
