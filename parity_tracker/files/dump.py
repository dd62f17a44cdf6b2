"""Dump captured tensors as ``.npy`` files with an index (seed document, section 3.3).

Layout of one check's dump::

    {dump_path}/check-0001/index.json
    {dump_path}/check-0001/checker_conv_in__ref.npy
    {dump_path}/check-0001/checker_conv_in__cand.npy

- Every check writes into a new ``check-NNNN`` folder, created atomically, so a second check
  into the same ``dump_path`` never overwrites an earlier one's files.
- One file per tensor and side, written by ``numpy.save(..., allow_pickle=False)``.
- File names come from the tag, sanitized: only ``[A-Za-z0-9._@-]``, no leading dot, no
  ``..``, at most 120 characters; a name that had to be changed or shortened gets an 8-hex-digit
  xxhash suffix of the original tag so two tags never share a file.
- Tensors numpy cannot hold are stored losslessly: bfloat16 and float8 as float32 (every value
  is exactly representable), complex32 as complex64, quantized tensors as their integer
  representation plus scale and zero point (per-channel scales and zero points as their own
  ``.npy`` files). ``index.json`` maps each file to its tag, step, side, role, original dtype,
  stored dtype, shape and device; :func:`load_dump` restores the original tensors.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash

from parity_tracker.compare.convert import dense_cpu, quant_info
from parity_tracker.compare.hashing import numpy_in_place
from parity_tracker.errors import InputError
from parity_tracker.files.atomic import atomic_write_json
from parity_tracker.files.safe_paths import resolve_inside

INDEX_NAME = "index.json"
FORMAT = "parity_tracker.dump"
FORMAT_VERSION = 1
MAX_NAME = 120
_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]")
_WIDEN = {torch.bfloat16: torch.float32, torch.complex32: torch.complex64}
_ROLE_SUFFIX = {"reference": "ref", "candidate": "cand"}


def _float8_dtypes() -> set[torch.dtype]:
    names = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    return {getattr(torch, n) for n in names if hasattr(torch, n)}


_FLOAT8 = _float8_dtypes()


def sanitize(name: str, max_len: int = MAX_NAME) -> str:
    """A safe file-name stem for ``name``.

    Keeps ``[A-Za-z0-9._@-]``, maps everything else (path separators included) to ``_``,
    breaks up ``..`` and a leading dot. When that changed the name or it is longer than
    ``max_len``, the result ends with ``-`` and the first 8 hex digits of ``xxh64(name)``, and is
    at most ``max_len`` characters.

    Args:
        name: any string (a tag).
        max_len: the longest result, at least 16.

    Returns:
        The stem (no extension).
    """
    safe = _UNSAFE.sub("_", name)
    safe = re.sub(r"\.{2,}", lambda m: "_" * len(m.group()), safe)
    if safe.startswith("."):
        safe = "_" + safe[1:]
    if safe == name and len(safe) <= max_len and safe:
        return safe
    digest = xxhash.xxh64(name.encode("utf-8")).hexdigest()[:8]
    return f"{safe[: max_len - 9]}-{digest}"


def to_numpy(tensor: torch.Tensor) -> tuple[np.ndarray, dict[str, Any], dict[str, np.ndarray]]:
    """A numpy array holding ``tensor`` losslessly, plus what is needed to restore it.

    Args:
        tensor: any dense, sparse, quantized, conjugated or DTensor tensor on any device.

    Returns:
        ``(array, info, extra)``: ``info`` has ``dtype`` (original), ``stored_dtype``,
        ``shape`` and ``device`` (and ``scale`` / ``zero_point`` / ``qscheme`` / ``axis`` for
        quantized tensors); ``extra`` maps a suffix to arrays stored beside the main file
        (per-channel ``scales`` and ``zero_points``).

    Raises:
        InputError: a meta tensor (it has no data) or a dtype with no lossless numpy form.
    """
    info: dict[str, Any] = {
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "device": str(tensor.device),
    }
    t = dense_cpu(tensor)  # the one normaliser: detached, gathered, dense, CPU
    extra: dict[str, np.ndarray] = {}
    if t.is_quantized:
        t, extra = _quantized(t, info)
    if t.dtype in _FLOAT8:
        t = t.to(torch.float32)
    elif t.dtype in _WIDEN:
        t = t.to(_WIDEN[t.dtype])
    try:  # read in place: .numpy() would mark a caller's tensor not resizable (w9trust)
        array = numpy_in_place(t.contiguous())
    except (TypeError, RuntimeError, ValueError) as exc:
        raise InputError(f"dtype {info['dtype']} has no lossless numpy form: {exc}") from exc
    info["stored_dtype"] = str(array.dtype)
    return array, info, extra


def _quantized(t: torch.Tensor, info: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """The integer representation, its parameters put in ``info`` / ``extra`` (``quant_info``)."""
    q = quant_info(t)
    info["qscheme"] = q.qscheme
    extra: dict[str, np.ndarray] = {}
    if q.axis is None:
        info["scale"], info["zero_point"] = q.scale, q.zero_point
    else:
        info["axis"] = q.axis
        extra["scales"] = q.scale.numpy()
        extra["zero_points"] = q.zero_point.numpy()
    return q.int_repr, extra


def new_check_dir(dump_path: str | os.PathLike[str]) -> Path:
    """Create and return the next free ``check-NNNN`` folder under ``dump_path``.

    ``mkdir`` without ``exist_ok`` is atomic, so two checks (even two processes) never get the
    same folder.

    Raises:
        InputError: ``dump_path`` exists and is not a folder.
    """
    root = Path(dump_path)
    if root.exists() and not root.is_dir():
        raise InputError(f"dump_path {root} exists and is not a folder; pass a folder path")
    root.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[6:]) for p in root.glob("check-*") if p.name[6:].isdigit()]
    n = max(taken, default=0) + 1
    while True:
        folder = root / f"check-{n:04d}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            n += 1


class DumpWriter:
    """Writes one check's tensors into a fresh ``check-NNNN`` folder under ``dump_path``.

    Args:
        dump_path: the dump root folder (created if missing).

    Attributes:
        folder: the check's folder.
        subdir: its name relative to ``dump_path`` (e.g. ``check-0001``).
    """

    def __init__(self, dump_path: str | os.PathLike[str]) -> None:
        self.root = Path(dump_path)
        self.folder = new_check_dir(self.root)
        self.subdir = self.folder.name
        self.entries: list[dict[str, Any]] = []
        self._names: set[str] = set()

    def _stem(self, tag: str, step: int, side: int, role: str) -> str:
        label = _ROLE_SUFFIX.get(role, role) if side in (0, 1) else f"side{side}"
        base = sanitize(tag if step == 0 else f"{tag}__step{step}")
        stem = f"{base}__{label}"
        k = 1
        while stem.lower() in self._names:  # case-insensitive file systems
            k += 1
            stem = f"{base}__{label}{k}"
        self._names.add(stem.lower())
        return stem

    def write(
        self, tag: str, tensor: torch.Tensor, *, side: int, role: str, step: int = 0
    ) -> str | None:
        """Write one tensor; returns its path relative to ``dump_path`` (``None`` if skipped).

        A tensor that cannot be dumped (a meta tensor) gets an index entry with ``skipped`` and
        the reason instead of a file.
        """
        stem = self._stem(tag, step, side, role)
        entry: dict[str, Any] = {"tag": tag, "step": step, "side": side, "role": role}
        try:
            array, info, extra = to_numpy(tensor)
        except InputError as exc:
            entry.update(skipped=str(exc), dtype=str(tensor.dtype).removeprefix("torch."))
            self.entries.append(entry)
            return None
        entry.update(info)
        entry["file"] = f"{stem}.npy"
        np.save(self.folder / entry["file"], array, allow_pickle=False)
        for suffix, arr in extra.items():
            entry[f"{suffix}_file"] = f"{stem}.{suffix}.npy"
            np.save(self.folder / entry[f"{suffix}_file"], arr, allow_pickle=False)
        self.entries.append(entry)
        return f"{self.subdir}/{entry['file']}"

    def close(self) -> Path:
        """Write ``index.json`` (atomically) and return its path."""
        path = self.folder / INDEX_NAME
        payload = {"format": FORMAT, "version": FORMAT_VERSION, "files": self.entries}
        atomic_write_json(path, payload, indent=1)
        return path


def load_dump(folder: str | os.PathLike[str]) -> list[tuple[dict[str, Any], torch.Tensor]]:
    """Read a ``check-NNNN`` folder back: ``(index entry, tensor in its original dtype)``.

    Entries that were skipped (no file) are left out. The folder may come from someone else
    (a downloaded artifact, a shared disk), so everything in it is checked before use: every
    file the index names must lie inside the folder, symlinks resolved
    (``files.safe_paths.resolve_inside``); each ``.npy`` header must declare exactly the bytes
    the file holds and the shape the index declares (no allocation from a header alone); the
    dtype must be a torch dtype name.

    Raises:
        InputError: the folder has no ``index.json`` of this format, the index is not strict
            JSON or has a wrong type, a path leaves the folder, or a file does not match its
            entry (names the folder, the entry and the problem).
    """
    folder = Path(folder)
    index = folder / INDEX_NAME
    if not index.is_file():
        raise InputError(f"{folder} has no {INDEX_NAME}; pass a check-NNNN dump folder")
    resolve_inside(folder, INDEX_NAME, what="index", root_name="dump folder")
    try:
        payload = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{index}: unreadable dump index ({type(exc).__name__}: {exc})") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise InputError(f"{index} is not a parity_tracker dump index")
    entries = payload.get("files")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InputError(f"{index}: 'files' must be a list of objects")
    out = []
    for i, entry in enumerate(entries, start=1):
        if "file" not in entry:
            continue
        try:
            array = _load_npy(folder, entry, "file")
            out.append((entry, _restore(folder, entry, torch.from_numpy(array))))
        except InputError as exc:
            raise InputError(f"{index} entry #{i}: {exc}") from None
        except (TypeError, ValueError, KeyError, OSError, RuntimeError, MemoryError) as exc:
            raise InputError(
                f"{index} entry #{i}: malformed ({type(exc).__name__}: {str(exc)[:200]})"
            ) from None
    return out


def _load_npy(folder: Path, entry: dict[str, Any], key: str) -> np.ndarray:
    """The array of ``entry[key]``, checked against its own header and the entry's shape."""
    path = resolve_inside(folder, entry.get(key), what=key, root_name="dump folder")
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version not in _HEADER_READERS:
            raise InputError(f"{path.name}: .npy format {version} is not read")
        shape, _, dtype = _HEADER_READERS[version](f)
        offset = f.tell()
        size = os.fstat(f.fileno()).st_size
    if dtype.hasobject:
        raise InputError(f"{path.name}: object arrays are never loaded")
    need = math.prod(shape) * dtype.itemsize
    if need != size - offset:
        raise InputError(
            f"{path.name}: header declares shape {shape} of {dtype} ({need:,} bytes) but the "
            f"file holds {size - offset:,}"
        )
    declared = entry.get("shape")
    if key == "file" and declared is not None and list(declared) != list(shape):
        raise InputError(f"{path.name}: index shape {declared} != file shape {list(shape)}")
    return np.load(path, allow_pickle=False)


_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"dtype {name!r} is not a torch dtype name (e.g. 'float32')")
    return dtype


def _restore(folder: Path, entry: dict[str, Any], t: torch.Tensor) -> torch.Tensor:
    dtype = _dtype(entry.get("dtype"))
    if "qscheme" not in entry:
        return t.to(dtype)
    if "scale" in entry:
        scale, zero_point = entry["scale"], entry["zero_point"]
        if not isinstance(scale, (int, float)) or not isinstance(zero_point, int):
            raise InputError(f"scale {scale!r} / zero_point {zero_point!r} are not numbers")
        return torch._make_per_tensor_quantized_tensor(t, scale, zero_point)
    scales = torch.from_numpy(_load_npy(folder, entry, "scales_file"))
    zps = torch.from_numpy(_load_npy(folder, entry, "zero_points_file"))
    if not isinstance(entry.get("axis"), int):
        raise InputError(f"axis {entry.get('axis')!r} is not an integer")
    return torch._make_per_channel_quantized_tensor(t, scales, zps, entry["axis"])
