"""Adversarial tests of the wave-8 re-capture aliases (``HeldPairs.dedupe``, issue 19).

A tensor captured again under another tag (a module's output that is the next module's input,
a parent's input that is its first child's input, a module returning its input) shares one
reference snapshot; the candidate pair is then held as an alias of the earlier pair when its
bytes equal that pair's, and reuses its record. These tests try to make it lie.

Truth is independent of the code under test: every module of the models below records, with
its own code, a clone of its input at its forward's entry and of its output at its exit (the
moments the checker's hooks capture them), and the expected status, mismatch count and
tolerances are computed from those clones with numpy (float64/complex128). Each run is also
compared field for field with the same run with ``HeldPairs.dedupe = False`` (every pair
compared on its own, the path before the aliases).
"""

from __future__ import annotations

import ctypes
import fnmatch
import math
import random

import numpy as np
import pytest
import torch
from numpy_expected import TORCH_TESTING_TOL, wide
from torch import nn

from parity_tracker.capture.tags import input_tag, module_tag
from parity_tracker.compare.batch import HeldPairs
from parity_tracker.statuses import PASSING
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.complex64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
]


# ----------------------------------------------------------------------------- the models
def _one(x: torch.Tensor) -> torch.Tensor:
    return torch.ones((), dtype=x.dtype)


def _xor_byte(t: torch.Tensor, elem: int, mask: int) -> None:
    """XOR the most significant byte of element ``elem`` (C order of the storage) with ``mask``.

    Through a raw pointer: no version bump, no torch call (bool: the byte becomes 0/1 flipped).
    """
    n = t.numel()
    if n == 0:
        return
    size = t.element_size()
    addr = t.data_ptr() + (elem % n) * size + size - 1  # little endian: the top byte
    b = ctypes.c_uint8.from_address(addr)
    b.value = (b.value ^ 1) if t.dtype == torch.bool else (b.value ^ mask)


def _op(x: torch.Tensor, kind: str, p: int) -> torch.Tensor:
    """One step of a leaf module (dtype-generic); ``p`` parametrizes it (side-specific)."""
    if kind == "ident":
        return x
    if kind == "clone":
        return x.clone()
    if kind == "add":
        if x.dtype == torch.bool:
            return x ^ bool(p % 2)
        return x + _one(x) * (p % 3)
    if kind == "inplace":  # a version bump on the very object
        if x.dtype == torch.bool:
            return x.logical_not_() if p % 2 else x
        return x.add_(_one(x) * (p % 3))
    if kind == "view":  # a new object over the same storage, same values
        return x.view(x.shape)
    if kind == "t":  # a new view object, other values in C order
        return x.t()
    if kind == "t_":  # the same object turned into another view
        return x.t_()
    if kind == "raw":  # a raw write: no version bump
        _xor_byte(x, p, (0x80, 0x40, 0x01)[p % 3])
        return x
    if kind == "contig_t":  # a non-contiguous result of equal C-order values (p even)
        return x.t().contiguous().t() if p % 2 == 0 else x.t().contiguous()
    raise AssertionError(kind)


_KINDS = ["ident", "clone", "add", "inplace", "view", "t", "t_", "raw", "contig_t"]


class Leaf(nn.Module):
    def __init__(self, kind: str, p: int, log: dict) -> None:
        super().__init__()
        self.kind, self.p, self.log = kind, p, log
        self.name = ""

    def forward(self, x):
        self.log[input_tag(self.name, "0")] = x.clone()
        y = _op(x, self.kind, self.p)
        self.log[module_tag(self.name)] = y.clone()
        return y


class Node(nn.Module):
    """Children in sequence; ``between[i]`` (kind, p) runs on the value after child ``i``."""

    def __init__(self, kids: list[nn.Module], between: list, log: dict) -> None:
        super().__init__()
        self.kids = nn.ModuleList(kids)
        self.between, self.log = between, log
        self.name = ""

    def forward(self, x):
        self.log[input_tag(self.name, "0")] = x.clone()
        for kid, step in zip(self.kids, self.between, strict=True):
            x = kid(x)
            if callable(step):  # a write of a targeted test: returns the value to go on with
                x = step(x)
            elif step is not None:
                x = _op(x, *step)
        self.log[module_tag(self.name)] = x.clone()
        return x


def _spec(rng: random.Random, depth: int = 0):
    """A random tree: ("leaf", kind, p) or ("node", [children], [between])."""
    if depth >= 2 or rng.random() < 0.45:
        return ("leaf", rng.choice(_KINDS), rng.randrange(100))
    kids = [_spec(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    between = [
        (rng.choice(["raw", "inplace", "t_", "ident"]), rng.randrange(100))
        if rng.random() < 0.3
        else None
        for _ in kids
    ]
    return ("node", kids, between)


def _perturb(rng: random.Random, spec, rate: float):
    """The candidate's spec: each parameter (and some kinds) changed with probability ``rate``."""
    if spec[0] == "leaf":
        _, kind, p = spec
        if rng.random() < rate:
            p = rng.randrange(100)
        if rng.random() < rate / 2:
            kind = rng.choice(_KINDS)
        return ("leaf", kind, p)
    _, kids, between = spec
    kids = [_perturb(rng, k, rate) for k in kids]
    between = [
        b if rng.random() >= rate else _write(rng)  # a write on the candidate side only
        for b in between
    ]
    return ("node", kids, between)


def _write(rng: random.Random):
    """A write between two captures of one tensor, or none."""
    return rng.choice([None, ("raw", rng.randrange(100)), ("inplace", 1), ("t_", 0)])


def _build(spec, log: dict) -> nn.Module:
    if spec[0] == "leaf":
        return Leaf(spec[1], spec[2], log)
    return Node([_build(k, log) for k in spec[1]], list(spec[2]), log)


def _model(spec, log: dict) -> nn.Module:
    root = _build(spec, log)
    if isinstance(root, Leaf):  # the root is always a Node (a parent re-capture)
        root = Node([root], [None], log)
    for name, m in root.named_modules():
        if isinstance(m, (Leaf, Node)):
            m.name = name or "model"
    return root


def _input(rng: random.Random, dtype: torch.dtype, n: int, specials: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    if dtype == torch.bool:
        return torch.rand(n, n, generator=g) < 0.5
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.randint(-50 if dtype != torch.uint8 else 0, 50, (n, n), generator=g).to(dtype)
    x = torch.randn(n, n, generator=g, dtype=torch.float64).to(dtype)
    if specials and n:
        flat = x.view(-1)
        for v in (float("nan"), float("inf"), -float("inf"), -0.0, 0.0):
            flat[rng.randrange(flat.numel())] = v
    return x


# ----------------------------------------------------------------------------- the oracle
def _tol(tag: str, dtype: torch.dtype, overrides: dict, mode: str, default=None):
    if mode == "equal":
        return (None, None)
    if not (dtype.is_floating_point or dtype.is_complex):
        return (0.0, 0.0)
    for pattern, pair in overrides.items():
        if fnmatch.fnmatchcase(tag, pattern):
            return pair
    return default or TORCH_TESTING_TOL[dtype]


def _expected(ref, cand, tag: str, mode: str, overrides: dict, default=None):
    """(status, mismatch_count, rtol, atol) from numpy on the values at capture time."""
    r, c = wide(ref), wide(cand)
    both_nan = np.isnan(r) & np.isnan(c) if r.dtype.kind in "fc" else np.zeros(r.shape, bool)
    same = (r == c) | both_nan
    rtol, atol = _tol(tag, ref.dtype, overrides, mode, default)
    if same.all():
        return ("equal", 0, rtol, atol)
    if mode == "equal":
        return ("mismatch", int((~same).sum()), rtol, atol)
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(r) & np.isfinite(c)  # an inf or NaN is close only to itself
        close = same | (finite & (np.abs(c - r) <= atol + rtol * np.abs(r)))
    status = "close" if close.all() else "mismatch"
    return (status, int((~close).sum()), rtol, atol)


# ----------------------------------------------------------------------------- the runs
def _checker_rows(ref_m, cand_m, x, mode, dedupe, grad_mode, cand_first=False, **kw):
    """Rows by tag of an eager checker run, and the number of pairs held as aliases."""
    count = [0]
    real = HeldPairs.alias if hasattr(HeldPairs, "alias") else None

    def alias(self, key, tag, i):
        count[0] += 1
        return real(self, key, tag, i)

    old = HeldPairs.__dict__.get("dedupe", None)
    HeldPairs.dedupe = dedupe
    if real is not None:
        HeldPairs.alias = alias
    try:
        deferred = kw.pop("deferred", False)  # eager_mode None: compared at the check
        checker = TensorChecker(verbose=False, eager_mode=None if deferred else mode, **kw)
        with (
            module_register_tensor_checker(ref_m, checker),
            module_register_tensor_checker(cand_m, checker),
            grad_mode(),
        ):
            for m in (cand_m, ref_m) if cand_first else (ref_m, cand_m):
                m(x.clone())
        result = checker.check(mode)
    finally:
        if old is None:
            del HeldPairs.dedupe
        else:
            HeldPairs.dedupe = old
        if real is not None:
            HeldPairs.alias = real
    _LAST[:] = [checker]
    return {r["tag"]: r for r in result.to_rows()}, count[0]


_LAST: list = []  # the checker of the last _checker_rows


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b


def _same_rows(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for tag in a:
        diff = {k: (a[tag][k], b[tag].get(k)) for k in a[tag] if not _same(a[tag][k], b[tag][k])}
        assert not diff, (tag, diff)


def _case(seed: int):
    rng = random.Random(seed)
    spec = _spec(rng)
    cand_spec = _perturb(rng, spec, rng.choice([0.0, 0.2, 0.5]))
    dtype = rng.choice(_DTYPES)
    n = rng.choice([0, 1, 2, 8, 8, 8, 40])  # 40: larger than a held pair (4 KiB) in most dtypes
    x = _input(rng, dtype, n, specials=rng.random() < 0.5)
    mode = rng.choice(["equal", "allclose"])
    overrides = {}
    if rng.random() < 0.5:  # per-tag globs: the two tags of one re-capture may differ
        for _ in range(rng.randint(1, 3)):
            glob = rng.choice(["checker_*input_0", "checker_kids.0*", "*kids.1", "checker_model"])
            overrides[glob] = rng.choice([(0.0, 0.0), (1.0, 1.0), (1e-3, 1e-3), (0.5, 1e9)])
    kw = {"tolerances": overrides} if overrides else {}
    resident = rng.choice([None, None, 140_000, 20_000])
    if resident is not None:
        kw["max_resident_bytes"] = resident
    grad = rng.choice([torch.no_grad, torch.inference_mode])
    return spec, cand_spec, x, mode, overrides, kw, grad


def _check_case(seed: int, tmp_path, cand_first: bool = False, deferred: bool = False) -> int:
    spec, cand_spec, x, mode, overrides, kw, grad = _case(seed)
    kw["cand_first"] = cand_first
    if deferred:
        kw["deferred"] = True
    if kw.get("max_resident_bytes"):
        kw["spill_dir"] = tmp_path
    logs = {}
    out = {}
    for dedupe in (True, False):
        lr, lc = {}, {}
        ref_m, cand_m = _model(spec, lr), _model(cand_spec, lc)
        out[dedupe] = _checker_rows(ref_m, cand_m, x, mode, dedupe, grad, **kw)
        logs[dedupe] = (lr, lc)
    rows, aliases = out[True]
    lr, lc = logs[True]
    assert set(lr) == set(lc)
    assert {t for t in rows if rows[t]["kind"] != "param"} == set(lr)
    for tag, row in rows.items():
        ref, cand = lr[tag], lc[tag]
        if ref.shape != cand.shape:
            assert row["status"] == "shape_mismatch", tag
            continue
        status, count, rtol, atol = _expected(ref, cand, tag, mode, overrides)
        got = (row["status"], row["mismatch_count"] or 0, row["rtol"], row["atol"])
        assert got == (status, count, rtol, atol), (tag, got, (status, count, rtol, atol))
    _same_rows(rows, out[False][0])
    return aliases


_SEEDS = list(range(300))


@pytest.mark.parametrize("seed", _SEEDS)
def test_random_trees_match_numpy_and_the_per_pair_path(seed, tmp_path):
    """Random module trees, dtypes, sizes, writes, tolerances: every row against numpy."""
    _check_case(seed, tmp_path)


def test_random_trees_exercise_the_aliases(tmp_path):
    """The seeds above do reach the alias path (else they would prove nothing about it)."""
    total = sum(_check_case(seed, tmp_path) for seed in _SEEDS[:30])
    assert total >= 10


# ----------------------------------------------------------------------------- run_parity
_VOLATILE = {"run_id", "start_time_ms", "durations_s", "environment", "config_fingerprint"}


def _run_parity(spec, cand_spec, x, mode, overrides, dedupe, **kw):
    """(rows by tag, summary, logs) of a run_parity run; ``dedupe`` set for its duration."""
    from parity_tracker.run.run import run_parity

    lr, lc = {}, {}
    old = HeldPairs.__dict__.get("dedupe", None)
    HeldPairs.dedupe = dedupe
    try:
        res = run_parity(
            _model(spec, lr), _model(cand_spec, lc), (x,), mode=mode, tolerances=overrides,
            environment={}, **kw,
        )  # fmt: skip
    finally:
        if old is None:
            del HeldPairs.dedupe
        else:
            HeldPairs.dedupe = old
    rows = {(r["tag"], r["step"]): r for r in res.modules.to_pylist()}
    summary = {k: v for k, v in res.summary.items() if k not in _VOLATILE}
    return rows, summary, (lr, lc), res


def _assert_numpy_rows(rows, logs, mode, overrides) -> None:
    lr, lc = logs
    assert {t for (t, _), r in rows.items() if r["kind"] != "param"} == set(lr) == set(lc)
    for (tag, _), row in rows.items():
        status, count, rtol, atol = _expected(lr[tag], lc[tag], tag, mode, overrides)
        got = (row["status"], row["mismatch_count"] or 0, row["rtol"], row["atol"])
        assert got == (status, count, rtol, atol), (tag, got, (status, count, rtol, atol))


@pytest.mark.parametrize("seed", range(0, 300, 5))
def test_run_parity_without_dumps_matches_numpy_and_the_per_pair_path(seed):
    """run_parity (dump_mode "not": the alias path on): rows vs numpy, summary vs no aliases."""
    spec, cand_spec, x, mode, overrides, _, _ = _case(seed)
    on = _run_parity(spec, cand_spec, x, mode, overrides, True, dump_mode="not")
    off = _run_parity(spec, cand_spec, x, mode, overrides, False, dump_mode="not")
    _assert_numpy_rows(on[0], on[2], mode, overrides)
    strip = lambda rows: {k: {c: v for c, v in r.items() if c != "run_id"} for k, r in rows.items()}  # noqa: E731
    _same_rows(strip(on[0]), strip(off[0]))
    assert on[1] == off[1]
    failing = any(r["status"] not in PASSING for r in on[0].values())
    assert on[1]["passed"] is (not failing)


# ----------------------------------------------------------------------------- targeted writes
def _other(x: torch.Tensor, same: bool) -> torch.Tensor:
    """A new tensor of ``x``'s shape and dtype: ``x``'s values (``same``) or others."""
    return x.clone() if same else x.clone() * 3 + 1


def _set_data(x: torch.Tensor, same: bool) -> torch.Tensor:
    x.data = _other(x, same)  # the same object, another storage, no version bump
    return x


def _set_conj(x: torch.Tensor) -> torch.Tensor:
    torch._C._set_conj(x, not x.is_conj())  # same object and bytes, other values
    return x


def _data_conj(x: torch.Tensor) -> torch.Tensor:
    x.data = x.conj()  # public API: the same object becomes a conjugate view, no version bump
    return x


def _int_view_add(x: torch.Tensor) -> torch.Tensor:
    x.view(torch.int32).add_(1)  # another object over the same bytes: x's version bumps
    return x


def _storage_fill(x: torch.Tensor) -> torch.Tensor:
    x.untyped_storage().fill_(0)  # through the storage object
    return x


def _shrink_write_grow(x: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    x.resize_(3).fill_(7)  # the storage kept: the first 3 values written
    return x.resize_(shape)


def _resize_back(x: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    x.resize_(1)
    return x.resize_(shape)  # the same storage, the same values


# each: (value after the write -> value passed on), applied to a's output before b's input
_TARGETED = {
    "resize_ larger": lambda x: x.resize_(x.shape[0] + 1, x.shape[1]),
    "resize_ flat": lambda x: x.resize_(x.numel()),
    "resize_ and back": _resize_back,
    "resize_ down, write, back": lambda x: _shrink_write_grow(x),
    "set_ other values": lambda x: x.set_(_other(x, False)),
    "set_ same values": lambda x: x.set_(_other(x, True)),
    "set_ onto a transposed view": lambda x: x.set_(
        x.untyped_storage(), x.storage_offset(), x.shape, tuple(reversed(x.stride()))
    ),
    ".data = other values": lambda x: _set_data(x, False),
    ".data = same values": lambda x: _set_data(x, True),
    "out= into itself": lambda x: torch.mul(x, 2, out=x),
    "copy_ of others": lambda x: x.copy_(_other(x, False)),
    "as_strided_ transpose": lambda x: x.as_strided_(x.shape, tuple(reversed(x.stride()))),
    "narrow view (same storage)": lambda x: x[1:],
    "view as int32 and back": lambda x: _int_view_add(x),
    "neg_": lambda x: x.neg_(),
    "conj bit set in place": _set_conj,
    ".data = conj view": lambda x: _data_conj(x),
    "storage write (no bump)": lambda x: _storage_fill(x),
}
_ONLY_COMPLEX = {"conj bit set in place", ".data = conj view"}


def _targeted_models(write, side: str, log_r: dict, log_c: dict):
    """model(kids a, b) per side; ``write`` between a and b on ``side`` (ref, cand, both)."""

    def make(log, w):
        spec = ("node", [("leaf", "clone", 0), ("leaf", "ident", 0)], [None, None])
        m = _model(spec, log)
        m.between = [w, None]
        return m

    wr = write if side in ("ref", "both") else None
    wc = write if side in ("cand", "both") else None
    return make(log_r, wr), make(log_c, wc)


# Findings of these cases, all fixed in wave 8 (each case below guards its fix):
# - older bug (main too): a candidate tensor of 4-64 KiB compared at once is read through .numpy()
#   (compare_tensors), which marks its storage not resizable: the model's own y.resize_(larger)
#   then raises 'Trying to resize storage that is not resizable' (fixed:
#   compare.hashing.numpy_in_place)
# - TRUST, older bug (main too): a reference tensor >= 64 KiB captured copy-on-write, then turned
#   into a conjugate (or negative) view in place (y.data = y.conj(), or
#   torch._C._set_conj/_set_neg: same object, storage, version, shape, strides) and captured
#   again: Snapshotter._reusable hands out the first copy (_layout has no is_conj/is_neg, and the
#   copy-on-write check only compares buffers), so the second row is 'equal' for values that
#   differ (or 'mismatch' for equal ones) (fixed: Snapshotter._layout has the conj/neg bits)
# - older bug (main too; torch's): resize_ of a tensor whose >= 64 KiB capture was taken copy-on-
#   write (torch._lazy_clone), then a second capture of it: Snapshotter.take's _lazy_clone raises
#   'INTERNAL ASSERT FAILED ... Cannot set materializer: a materializer is already active on this
#   storage' and the model's run aborts (torch alone reproduces it: c = torch._lazy_clone(y);
#   y.resize_(201, 200); torch._lazy_clone(y)) (fixed: snapshot._lazy_clone falls back to clone())


def _targeted_params():
    for write in _TARGETED:
        for mode in ("equal", "allclose"):
            for side in ("ref", "cand", "both"):
                for n in (8, 40, 200):
                    size = {8: "small", 40: "large", 200: "cow"}[n]
                    yield pytest.param(write, mode, side, n,
                                       id=f"{write}-{mode}-{side}-{size}")  # fmt: skip


@pytest.mark.parametrize(("write", "mode", "side", "n"), list(_targeted_params()))
def test_targeted_writes_between_two_captures(write, mode, side, n):
    """A write of every kind between a tensor's two captures: each row as numpy says."""
    dtype = torch.complex64 if write in _ONLY_COMPLEX else torch.float32
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(n), dtype=dtype)
    lr, lc = {}, {}
    ref_m, cand_m = _targeted_models(_TARGETED[write], side, lr, lc)
    rows, _ = _checker_rows(ref_m, cand_m, x, mode, True, torch.no_grad)
    lr2, lc2 = {}, {}
    ref_m, cand_m = _targeted_models(_TARGETED[write], side, lr2, lc2)
    off, _ = _checker_rows(ref_m, cand_m, x, mode, False, torch.no_grad)
    assert set(rows) == set(lr) == set(lc)
    for tag, row in rows.items():
        ref, cand = lr[tag], lc[tag]
        if ref.shape != cand.shape:
            assert row["status"] == "shape_mismatch", tag
            continue
        if ref.is_conj() or cand.is_conj():
            ref, cand = ref.resolve_conj(), cand.resolve_conj()
        status, count, rtol, atol = _expected(ref, cand, tag, mode, {})
        got = (row["status"], row["mismatch_count"] or 0, row["rtol"], row["atol"])
        assert got == (status, count, rtol, atol), (tag, got, (status, count, rtol, atol))
    if write not in ("resize_ larger",):  # uninitialized memory: each run its own values
        _same_rows(rows, off)


def test_candidate_output_stays_resizable_after_its_comparison():
    """A model that grows its own output with resize_ runs under the checker as without it."""

    class Grow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = Leaf("clone", 0, {})
            self.a.name = "a"

        def forward(self, x):
            return self.a(x).resize_(x.shape[0] + 1, x.shape[1])

    x = torch.randn(40, 40)  # 6400 bytes: compared at once (not held), not copy-on-write
    Grow()(x.clone())  # plain torch: fine
    checker = TensorChecker(verbose=False, eager_mode="equal")
    ref, cand = Grow(), Grow()
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(x.clone())
        cand(x.clone())  # raises: Trying to resize storage that is not resizable
    rows = {r["tag"]: r for r in checker.check("equal").to_rows()}
    assert rows["checker_a"]["status"] == "equal"
    assert rows["checker_model"]["ref_shape"] == rows["checker_model"]["cand_shape"] == (41, 40)


@pytest.mark.parametrize("eager", [None, "equal"])
def test_resize_after_copy_on_write_capture_does_not_abort_the_run(eager):
    """``y = a(x); y.resize_(...)``, ``y`` captured again as the root's output (200x200 f32)."""

    class Grow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = Leaf("clone", 0, {})
            self.a.name = "a"

        def forward(self, x):
            return self.a(x).resize_(x.shape[0] + 1, x.shape[1])

    x = torch.randn(200, 200)
    checker = TensorChecker(verbose=False, eager_mode=eager)
    ref = Grow()
    with module_register_tensor_checker(ref, checker), torch.no_grad():
        y = ref(x.clone())  # raises in Snapshotter.take
    assert y.shape == (201, 200)


class _Const(nn.Module):
    """Returns a new tensor of ``values`` (its input ignored); records it like ``Leaf``."""

    def __init__(self, values, dtype, log: dict, name: str) -> None:
        super().__init__()
        self.values, self.dtype, self.log, self.name = values, dtype, log, name

    def forward(self, x):
        self.log[input_tag(self.name, "0")] = x.clone()
        y = torch.tensor(self.values, dtype=self.dtype)
        self.log[module_tag(self.name)] = y.clone()
        return y


class _Consts(nn.Module):
    def __init__(self, table, dtype, log: dict) -> None:
        super().__init__()
        self.kids = nn.ModuleList([_Const(v, dtype, log, f"kids.{i}") for i, v in enumerate(table)])
        self.log = log

    def forward(self, x):
        self.log["checker_model_input_0"] = x.clone()
        for kid in self.kids:
            x = kid(x)
        self.log["checker_model"] = x.clone()
        return x


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.bool, torch.float32])
@pytest.mark.parametrize("shape", ["scalar", "one", "empty"])
def test_distinct_tiny_tensors_of_equal_bytes(dtype, shape):
    """1-byte and empty tensors: CPython shares one ``bytes`` object per such value.

    Distinct tensors of equal bytes then have one ``id(held.data)``; an alias must still be of
    equal values on both sides (the candidate's bytes, dtype and shape checked).
    """
    rng = random.Random(7)
    k = 24
    ref_vals = [rng.randrange(2) for _ in range(k)]
    cand_vals = [v if rng.random() < 0.6 else 1 - v for v in ref_vals]

    def value(v):
        if shape == "empty":
            return []
        return v if shape == "scalar" else [v]

    lr, lc = {}, {}
    ref = _Consts([value(v) for v in ref_vals], dtype, lr)
    cand = _Consts([value(v) for v in cand_vals], dtype, lc)
    x = torch.zeros((), dtype=dtype) if shape == "scalar" else torch.zeros(1, dtype=dtype)
    rows, aliases = _checker_rows(ref, cand, x, "equal", True, torch.no_grad)
    for tag, row in rows.items():
        status, count, _, _ = _expected(lr[tag], lc[tag], tag, "equal", {})
        assert (row["status"], row["mismatch_count"] or 0) == (status, count), tag
    lr2, lc2 = {}, {}
    off, _ = _checker_rows(
        _Consts([value(v) for v in ref_vals], dtype, lr2),
        _Consts([value(v) for v in cand_vals], dtype, lc2),
        x, "equal", False, torch.no_grad,
    )  # fmt: skip
    _same_rows(rows, off)
    if dtype != torch.float32 and shape != "empty" and hasattr(HeldPairs, "alias"):
        assert aliases > 0  # the inputs: each kid's input is the previous kid's output


class _ConjChain(nn.Module):
    """``b(a(x))``; with ``flip``, ``y.data = y.conj()`` between a's output and b's input."""

    def __init__(self, flip: bool) -> None:
        super().__init__()
        self.a, self.b, self.flip = Leaf("ident", 0, {}), Leaf("ident", 0, {}), flip
        self.a.name, self.b.name = "a", "b"

    def forward(self, x):
        y = self.a(x)
        if self.flip:
            y.data = y.conj()  # the same object, a conjugate view now; no version bump
        return self.b(y)


@pytest.mark.parametrize("eager", [None, "equal", "allclose"])
def test_reference_turned_conjugate_after_copy_on_write_capture_is_not_equal(eager):
    """Minimal reproducer: 200x200 complex64 (320 KB); only the reference conjugates."""
    x = torch.randn(200, 200, dtype=torch.complex64, generator=torch.Generator().manual_seed(1))
    mode = eager or "equal"
    checker = TensorChecker(verbose=False, eager_mode=eager)
    ref, cand = _ConjChain(True), _ConjChain(False)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        r = ref(x.clone())
        c = cand(x.clone())
    rows = {t["tag"]: t for t in checker.check(mode).to_rows()}
    assert rows["checker_a"]["status"] == "equal"
    assert int((r.resolve_conj() != c).sum()) == 200 * 200  # every imaginary part nonzero
    status, count, _, _ = _expected(r.resolve_conj(), c, "checker_b_input_0", mode, {})
    assert status == "mismatch" and count > 200 * 199
    row = rows["checker_b_input_0"]
    assert (row["status"], row["mismatch_count"]) == (status, count)


@pytest.mark.parametrize("dump", ["not_equal", "all"])
@pytest.mark.parametrize("seed", range(1, 300, 10))
def test_run_parity_dumps_hold_each_rows_capture_time_values(seed, dump, tmp_path):
    """With dumps on: every failing row (``all``: every row) has both sides dumped, each the
    values its side had at that capture (the modules' own clones), rows as numpy says."""
    from parity_tracker.files.dump import load_dump

    spec, cand_spec, x, mode, overrides, _, _ = _case(seed)
    rows, _, logs, res = _run_parity(
        spec, cand_spec, x, mode, overrides, True, dump_mode=dump, dump_path=tmp_path
    )
    _assert_numpy_rows(rows, logs, mode, overrides)
    want = {t for (t, _), r in rows.items() if dump == "all" or r["status"] not in PASSING}
    dumped: dict[tuple[str, int], torch.Tensor] = {}
    if want:
        for entry, t in load_dump(res.dump_dir):
            dumped[(entry["tag"], entry["side"])] = t
    assert {t for t, _ in dumped} == want
    for (tag, side), t in dumped.items():
        truth = logs[side][tag]
        assert t.dtype == truth.dtype and t.shape == truth.shape, tag
        assert (
            t.view(-1).view(torch.uint8).numpy().tobytes()
            == truth.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        ), (tag, side)


# ----------------------------------------------------------------------------- decode (llama-tiny)
def _cache_tensors(cache) -> list[torch.Tensor]:
    """The key and value tensors of a transformers DynamicCache (old and new layouts)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [t for layer in layers for t in (layer.keys, layer.values) if t is not None]
    return list(cache.key_cache) + list(cache.value_cache)


def _llama_drive(ids, prompt_len: int, steps: int, poke):
    """llama-tiny's kv decode drive; ``poke(cache_tensors)`` after every step (None: none)."""
    from transformers import DynamicCache

    def drive(model, rec):
        cache = DynamicCache(config=model.config)
        rec(0)
        model(input_ids=ids[:, :prompt_len], cache=cache, use_cache=True)
        for k in range(1, steps):
            if poke is not None:
                poke(_cache_tensors(cache))
            rec(k)
            pos = prompt_len + k - 1
            model(input_ids=ids[:, pos : pos + 1], cache=cache, use_cache=True)

    return drive


def _poke_numpy(tensors):
    tensors[0].numpy()[..., -1, 0] += 1.0  # no version bump


def _poke_inplace(tensors):
    tensors[-1][..., -1, :].mul_(1.5)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["equal", "allclose"])
@pytest.mark.parametrize("variant", ["weight", "cache numpy", "cache in place"])
def test_llama_tiny_decode_diverging_candidate_rows_as_per_pair_path(variant, mode):
    """A diverging candidate in a 3-step KV decode: rows with aliases == rows without."""
    from parity_tracker.builtin_targets import _common, llama_tiny
    from parity_tracker.run.run import run_parity

    steps = 3
    ids = llama_tiny.token_ids(length=llama_tiny.PROMPT_LEN + steps - 1)
    reference = llama_tiny.make_model()
    candidate = _common.frozen_copy(reference)
    poke = None
    if variant == "weight":
        with torch.no_grad():
            w = dict(candidate.named_parameters())["model.layers.1.mlp.down_proj.weight"]
            w.data = w.data.clone()
            w.data[0, 0] += 0.5
    else:
        poke = _poke_numpy if variant == "cache numpy" else _poke_inplace
    drive = _llama_drive(ids, llama_tiny.PROMPT_LEN, steps, None)
    cdrive = _llama_drive(ids, llama_tiny.PROMPT_LEN, steps, poke)
    out = {}
    for dedupe in (True, False):
        old = HeldPairs.__dict__.get("dedupe", None)
        HeldPairs.dedupe = dedupe
        try:
            res = run_parity(
                reference, candidate, drive=drive, candidate_drive=cdrive, mode=mode,
                dump_mode="not", environment={},
            )  # fmt: skip
        finally:
            if old is None:
                del HeldPairs.dedupe
            else:
                HeldPairs.dedupe = old
        rows = {(r["tag"], r["step"]): r for r in res.modules.to_pylist()}
        summary = {k: v for k, v in res.summary.items() if k not in _VOLATILE}
        out[dedupe] = (rows, summary)
    strip = lambda rows: {k: {c: v for c, v in r.items() if c != "run_id"} for k, r in rows.items()}  # noqa: E731
    _same_rows(strip(out[True][0]), strip(out[False][0]))
    assert out[True][1] == out[False][1]
    assert out[True][1]["passed"] is False
    failing = {k for k, r in out[True][0].items() if r["status"] == "mismatch"}
    assert failing  # the divergence is seen
    if variant == "weight":  # layer 1's output diverges at every step, layer 0's never
        assert all(("checker_model.layers.1", s) in failing for s in range(steps))
        assert not any(t.startswith("checker_model.layers.0.") for t, _ in failing)


# ----------------------------------------------------------------------------- manual registration
_MANUAL_WRITES = {
    "none": lambda t: t,
    "numpy (no bump)": lambda t: t.numpy().__setitem__((1, 1), -7.0) or t,
    "raw byte": lambda t: _xor_byte(t, 5, 0x40) or t,
    "in place": lambda t: t.add_(1.0),
    ".data = other": lambda t: _set_data(t, False),
    "t_": lambda t: t.t_(),
    "set_ same values": lambda t: t.set_(_other(t, True)),
}


@pytest.mark.parametrize("facade", ["eager equal", "eager allclose", "deferred"])
@pytest.mark.parametrize("n", [4, 40])
@pytest.mark.parametrize("side", [0, 1])
@pytest.mark.parametrize("write", list(_MANUAL_WRITES), ids=list(_MANUAL_WRITES))
def test_manual_register_same_tensor_under_two_tags(write, side, n, facade):
    """``register_tensor`` of one tensor under tags x then y on each side; ``write`` on
    ``side``'s tensor between its two registrations; each row as numpy says."""
    mode = "allclose" if "allclose" in facade else "equal"
    checker = TensorChecker(verbose=False, eager_mode=None if facade == "deferred" else mode)
    base = torch.randn(n, n, generator=torch.Generator().manual_seed(5))
    truth = {}
    for s in (0, 1):
        t = base.clone()
        checker.register_tensor("x", t, side=s)
        truth[("x", s)] = t.clone()
        if s == side:
            t = _MANUAL_WRITES[write](t)
        checker.register_tensor("y", t, side=s)
        truth[("y", s)] = t.clone()
    rows = {r["tag"]: r for r in checker.check(mode).to_rows()}
    assert set(rows) == {"x", "y"}
    for tag, row in rows.items():
        status, count, rtol, atol = _expected(truth[(tag, 0)], truth[(tag, 1)], tag, mode, {})
        got = (row["status"], row["mismatch_count"] or 0, row["rtol"], row["atol"])
        assert got == (status, count, rtol, atol), (tag, got)


# ----------------------------------------------------------------------------- HeldPairs alone
def _settle(held: HeldPairs, mode: str, tol) -> list:
    """Every held pair's record as ``Holder.flush`` gives it (bulk, then alone or alias)."""
    from parity_tracker.compare.core import compare_tensors

    comps = held.compare(mode, tol)
    alone: dict = {}
    out = []
    for i, comp in enumerate(comps):
        if comp is None and hasattr(held, "alias_record"):
            comp = held.alias_record(i, alone, mode, tol)
        if comp is None:
            r, c = held.tensors(i)
            comp = alone[i] = compare_tensors(r, c, mode=mode, tag=held.keys[i][1], tolerances=tol)
        out.append(comp)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_held_pairs_sharing_reference_snapshots_match_compare_tensors(seed):
    """Pairs sharing one reference ``HeldBytes`` in random orders (an alias of an alias, the
    last pair of a reference changing, tags of other tolerances): every record as
    ``compare_tensors`` gives it on the pair's own values, field for field."""
    from parity_tracker.compare.batch import HeldBytes
    from parity_tracker.compare.core import compare_tensors
    from parity_tracker.compare.tolerances import Tolerances

    rng = random.Random(seed)
    dtype = rng.choice([torch.float32, torch.float16, torch.int8, torch.bool, torch.complex64])
    n = rng.choice([1, 3, 8])
    mode = rng.choice(["equal", "allclose"])
    tol = Tolerances({"t1*": (0.5, 0.5), "t2*": (0.0, 0.0)}) if rng.random() < 0.6 else None
    refs = [HeldBytes.of(_input(rng, dtype, n, specials=True)) for _ in range(3)]
    cands = [_input(rng, dtype, n, specials=True) for _ in range(3)] + [r.load() for r in refs]
    held, truth = HeldPairs(), []
    for i in range(rng.randint(5, 30)):
        ref = rng.choice(refs)
        cand = rng.choice(cands).clone()
        if rng.random() < 0.2:  # a candidate equal in values, other bytes (-0.0, NaN payload)
            cand = cand + 0 if dtype.is_floating_point or dtype.is_complex else cand  # -0.0 -> 0.0
        tag = rng.choice(["t1", "t10", "t2", "t3"])
        assert held.add((i, tag), tag, ref, cand)
        truth.append(compare_tensors(ref.load(), cand, mode=mode, tag=tag, tolerances=tol))
    got = _settle(held, mode, tol)
    for i, (g, t) in enumerate(zip(got, truth, strict=True)):
        diff = {k: (a, b) for k, a in g.to_dict().items() if not _same(a, b := t.to_dict()[k])}
        assert not diff, (i, held.keys[i], diff)


class _MixedConsts(nn.Module):
    """Kids returning new 1-byte tensors of other dtypes and shapes, all of one byte value."""

    def __init__(self, kinds, log: dict) -> None:
        super().__init__()
        self.kids = nn.ModuleList(
            [_Const(v, dt, log, f"kids.{i}") for i, (v, dt) in enumerate(kinds)]
        )
        self.log = log

    def forward(self, x):
        self.log["checker_model_input_0"] = x.clone()
        for kid in self.kids:
            x = kid(x)
        self.log["checker_model"] = x.clone()
        return x


@pytest.mark.parametrize("seed", range(12))
def test_one_byte_tensors_of_other_dtypes_and_shapes_keep_their_own_records(seed):
    """One ``bytes`` object (CPython's 1-byte singleton) for uint8 [1], int8 [[1]], bool True...:
    each row names its own dtype and shape, and its status is numpy's."""
    rng = random.Random(seed)
    forms = [1, [1], [[1]]]
    dtypes = [torch.uint8, torch.int8, torch.bool]
    kinds = [(rng.choice(forms), rng.choice(dtypes)) for _ in range(16)]
    cand_kinds = [
        (v, dt) if rng.random() < 0.7 else (rng.choice(forms), rng.choice(dtypes))
        for v, dt in kinds
    ]
    lr, lc = {}, {}
    x = torch.ones(1, dtype=torch.uint8)
    rows, _ = _checker_rows(
        _MixedConsts(kinds, lr), _MixedConsts(cand_kinds, lc), x, "equal", True, torch.no_grad
    )
    names = {torch.uint8: "uint8", torch.int8: "int8", torch.bool: "bool"}
    for tag, row in rows.items():
        r, c = lr[tag], lc[tag]
        assert (row["ref_dtype"], row["cand_dtype"]) == (names[r.dtype], names[c.dtype]), tag
        assert (tuple(row["ref_shape"]), tuple(row["cand_shape"])) == (r.shape, c.shape), tag
        if r.dtype == c.dtype and r.shape == c.shape:
            assert row["status"] == _expected(r, c, tag, "equal", {})[0], tag
        else:
            assert row["status"] != "equal", tag


# ----------------------------------------------------------------------------- spills, steps
@pytest.mark.parametrize("seed", range(6))
def test_long_random_chains_spilling_held_bytes(seed, tmp_path):
    """600 leaves of 8x8 float32 (held as bytes) under a 140 KB bound: the reference's
    snapshots spill, the held pairs flush every second pair; rows as numpy says."""
    rng = random.Random(1000 + seed)
    k = 600
    spec = ("node", [("leaf", rng.choice(_KINDS), rng.randrange(100)) for _ in range(k)],
            [_write(rng) if rng.random() < 0.1 else None for _ in range(k)])  # fmt: skip
    cand_spec = _perturb(rng, spec, 0.05)
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(seed))
    mode = rng.choice(["equal", "allclose"])
    kw = {"max_resident_bytes": 140_000, "spill_dir": tmp_path}
    lr, lc = {}, {}
    rows, aliases = _checker_rows(
        _model(spec, lr), _model(cand_spec, lc), x, mode, True, torch.no_grad, **kw
    )
    assert _LAST[0]._store.spilled_count > 0
    for tag, row in rows.items():
        status, count, rtol, atol = _expected(lr[tag], lc[tag], tag, mode, {})
        got = (row["status"], row["mismatch_count"] or 0, row["rtol"], row["atol"])
        assert got == (status, count, rtol, atol), (tag, got)
    off, _ = _checker_rows(
        _model(spec, {}), _model(cand_spec, {}), x, mode, False, torch.no_grad, **kw
    )
    _same_rows(rows, off)
    if hasattr(HeldPairs, "alias"):
        assert aliases > 0


class _Stateful(nn.Module):
    """Keeps one state tensor across steps: returns it, takes it back as next step's input."""

    def __init__(self, poke, log: dict) -> None:
        super().__init__()
        self.a = Leaf("ident", 0, log)
        self.b = Leaf("inplace", 0, log)  # adds 0: a version bump, the same values
        self.a.name, self.b.name = "a", "b"
        self.poke, self.log = poke, log

    def forward(self, x):
        self.log["checker_model_input_0"] = x.clone()
        y = self.b(self.a(x))
        self.log["checker_model"] = y.clone()
        return y


@pytest.mark.parametrize("poke_step", [None, 1, 2])
@pytest.mark.parametrize("n", [4, 40])
def test_state_tensor_reused_across_steps_written_between_steps(poke_step, n):
    """One tensor object fed back at every step; the candidate writes it through numpy (no
    version bump) before step ``poke_step``: every (tag, step) row as numpy says."""
    checker = TensorChecker(verbose=False, eager_mode="equal")
    logs = {0: {}, 1: {}}
    models = {s: _Stateful(None, {}) for s in (0, 1)}
    truth: dict = {}
    with (
        module_register_tensor_checker(models[0], checker),
        module_register_tensor_checker(models[1], checker),
        torch.no_grad(),
    ):
        states = {s: torch.randn(n, n, generator=torch.Generator().manual_seed(2)) for s in (0, 1)}
        for step in range(4):
            checker.step = step
            for s in (0, 1):
                if s == 1 and step == poke_step:
                    states[s].numpy()[0, 0] = 123.0
                log = {}
                for m in (models[s], models[s].a, models[s].b):
                    m.log = log
                states[s] = models[s](states[s])
                logs[s] = log
                for tag, t in log.items():
                    truth[(tag, step, s)] = t
    rows = {(r["tag"], r["step"]): r for r in checker.check("equal").to_rows()}
    for (tag, step), row in rows.items():
        status, count, _, _ = _expected(
            truth[(tag, step, 0)], truth[(tag, step, 1)], tag, "equal", {}
        )
        assert (row["status"], row["mismatch_count"] or 0) == (status, count), (tag, step)
    if poke_step is not None:
        assert rows[("checker_model_input_0", poke_step)]["status"] == "mismatch"


@pytest.mark.parametrize("seed", range(3, 300, 25))
def test_run_parity_with_ops_rows_as_per_pair_path(seed):
    """capture_ops=True (the op recorder beside the module hooks): module and op rows, with
    aliases and without, field for field; module rows as numpy says."""
    spec, cand_spec, x, mode, overrides, _, _ = _case(seed)
    if x.dtype == torch.bool or not x.numel():
        x = torch.randn(8, 8, generator=torch.Generator().manual_seed(seed))
    runs = {
        d: _run_parity(spec, cand_spec, x, mode, overrides, d, dump_mode="not", capture_ops=True)
        for d in (True, False)
    }
    _assert_numpy_rows(runs[True][0], runs[True][2], mode, overrides)
    strip = lambda rows: {k: {c: v for c, v in r.items() if c != "run_id"} for k, r in rows.items()}  # noqa: E731
    _same_rows(strip(runs[True][0]), strip(runs[False][0]))
    ops = {d: [{**r, "run_id": None} for r in runs[d][3].ops.to_pylist()] for d in (True, False)}
    assert len(ops[True]) == len(ops[False])
    for a, b in zip(ops[True], ops[False], strict=True):
        assert all(_same(a[k], b[k]) for k in a), (a["tag"], a, b)
    assert runs[True][1] == runs[False][1]


class _RawViewChain(nn.Module):
    """``b(a(x))``; with ``write``, ``x[0, 0] = 5`` through a numpy view taken before a's call
    (it reaches a copy-on-write snapshot too: the documented case of ``Snapshotter.take``)."""

    def __init__(self, write: bool, log: dict) -> None:
        super().__init__()
        self.a, self.b, self.write, self.log = (
            Leaf("ident", 0, log),
            Leaf("ident", 0, log),
            write,
            log,
        )
        self.a.name, self.b.name = "a", "b"

    def forward(self, x):
        view = x.numpy()
        self.log["checker_model_input_0"] = x.clone()
        y = self.a(x)
        if self.write:
            view[0, 0] = 5.0
        out = self.b(y)
        self.log["checker_model"] = out.clone()
        return out


@pytest.mark.parametrize("eager", [None, "equal"])
@pytest.mark.parametrize("side", ["ref", "cand", "both"])
def test_raw_view_taken_before_copy_on_write_capture_never_passes_other_values(side, eager):
    """Never a pass for values that differ; an equal pair may be ``error`` (not verifiable)."""
    x = torch.randn(200, 200, generator=torch.Generator().manual_seed(4))  # 160 KB
    lr, lc = {}, {}
    ref, cand = _RawViewChain(side != "cand", lr), _RawViewChain(side != "ref", lc)
    checker = TensorChecker(verbose=False, eager_mode=eager)
    with (
        module_register_tensor_checker(ref, checker),
        module_register_tensor_checker(cand, checker),
        torch.no_grad(),
    ):
        ref(x.clone())
        cand(x.clone())
    rows = {r["tag"]: r for r in checker.check("equal").to_rows()}
    assert set(rows) == set(lr)
    for tag, row in rows.items():
        status, count, _, _ = _expected(lr[tag], lc[tag], tag, "equal", {})
        if status == "equal":
            assert row["status"] in ("equal", "error"), tag
        else:
            assert row["status"] in ("mismatch", "error"), tag
            if row["status"] == "mismatch":
                assert row["mismatch_count"] == count, tag


@pytest.mark.parametrize("seed", range(500, 530))
def test_global_tolerance_with_tag_overrides(seed, tmp_path):
    """TensorChecker(rtol=, atol=) beside per-tag globs (allclose): every row as numpy says,
    and as without aliases."""
    spec, cand_spec, x, _, overrides, kw, grad = _case(seed)
    rng = random.Random(seed)
    default = rng.choice([(0.0, 0.0), (1e-2, 1e-2), (2.0, 0.0), (0.0, 3.0)])
    kw = {**kw, "rtol": default[0], "atol": default[1]}
    if kw.get("max_resident_bytes"):
        kw["spill_dir"] = tmp_path
    out, logs = {}, {}
    for dedupe in (True, False):
        logs[dedupe] = lr, lc = {}, {}
        rows, _ = _checker_rows(
            _model(spec, lr), _model(cand_spec, lc), x, "allclose", dedupe, grad, **kw
        )
        out[dedupe] = rows
    lr, lc = logs[True]
    for tag, row in out[True].items():
        status, count, rtol, atol = _expected(lr[tag], lc[tag], tag, "allclose", overrides, default)
        got = (row["status"], row["mismatch_count"] or 0, row["rtol"], row["atol"])
        assert got == (status, count, rtol, atol), (tag, got)
    _same_rows(out[True], out[False])


def test_run_parity_fails_a_reference_turned_conjugate_after_its_capture():
    """The same reproducer through run_parity: it reports ``passed`` (every row equal)."""
    from parity_tracker.run.run import run_parity

    x = torch.randn(200, 200, dtype=torch.complex64, generator=torch.Generator().manual_seed(1))
    res = run_parity(
        _ConjChain(True), _ConjChain(False), (x,), mode="equal", dump_mode="not", environment={}
    )
    rows = {r["tag"]: r["status"] for r in res.modules.to_pylist()}
    assert rows["checker_a"] == "equal"
    assert rows["checker_b_input_0"] == "mismatch"
    assert res.summary["passed"] is False


@pytest.mark.parametrize("seed", range(0, 300, 4))
def test_random_trees_candidate_run_first(seed, tmp_path):
    """The candidate's forward before the reference's (the candidate's snapshots held as
    bytes, the reference compared live): every row as numpy says and as without aliases."""
    _check_case(seed, tmp_path, cand_first=True)


@pytest.mark.parametrize("seed", range(2, 300, 4))
def test_random_trees_deferred_checker(seed, tmp_path):
    """eager_mode=None (every pair compared at the check, shared snapshots): rows as numpy."""
    _check_case(seed, tmp_path, deferred=True)
