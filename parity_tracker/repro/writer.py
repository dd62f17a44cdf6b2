"""Write a standalone reproducer folder from a run's kept material (never imports mlflow).

The folder holds ``repro.json``, the tensors (``.npy``; a module's ``state_dict.safetensors``),
``_parity_repro.py`` (a copy of :mod:`parity_tracker.files.repro_lib`), ``test_repro.py`` and
``README.md``. Every path named by ``repro.json`` must resolve inside the material folder and
is copied under the same name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from parity_tracker.errors import InputError
from parity_tracker.files import repro_lib
from parity_tracker.files.safe_paths import resolve_inside
from parity_tracker.localize.root_cause import case_prefix

LIB_NAME = "_parity_repro.py"

TEST = '''"""Reproducer of {what} from {run}.

It fails while the candidate's recorded output differs from PyTorch's and passes once the
candidate is fixed (re-run the parity run and write a new reproducer). Run it with
``pytest -q`` in this folder; it needs only torch, numpy and ``parity_tracker.testing``.
"""

from pathlib import Path

import _parity_repro


def test_repro():
    _parity_repro.check(Path(__file__).parent)
'''


def _files(meta: Any) -> list[str]:
    """Every file name the index refers to (``file``, ``*_file``, ``state_dict`` values)."""
    if isinstance(meta, dict):
        own = [
            v
            for k, v in meta.items()
            if isinstance(v, str) and (k == "file" or k.endswith("_file") or k == "state_dict")
        ]
        return own + [f for v in meta.values() for f in _files(v)]
    if isinstance(meta, list):
        return [f for v in meta for f in _files(v)]
    return []


def _what(meta: dict[str, Any]) -> str:
    if meta["kind"] == "op":
        return f"{meta['namespace']}::{meta['name']}.{meta['overload']} at {meta['tag']}"
    return f"module {meta['module']} ({meta['module_class']['qualname']})"


def _run_name(meta: dict[str, Any], run_id: str | None) -> str:
    """The run the reproducer comes from, named once: the MLflow run id when known.

    ``meta["run_id"]`` is the parity run id (the tables' ``run_id`` column, written while the
    run was not yet logged); a reproducer made from a stored run names the MLflow run id the
    user gave (``parity-tracker repro RUN_ID``) instead.
    """
    return f"MLflow run `{run_id}`" if run_id else f"parity run `{meta['run_id']}`"


def _root_cause_line(meta: dict[str, Any]) -> str:
    """``Root cause (case X): <why>``, the message's own ``root cause (case X):`` prefix cut."""
    cause = meta.get("cause")
    why = str(meta.get("message") or "").removeprefix(case_prefix(cause)) or "no message recorded"
    return f"Root cause (case {cause}): {why}" if cause else f"Root cause not proven: {why}"


def _readme(meta: dict[str, Any], run_id: str | None = None) -> str:
    lines = [
        f"# Reproducer: {_what(meta)}",
        "",
        f"From {_run_name(meta, run_id)}, tag `{meta['tag']}`: {meta.get('status')}, "
        f"max |Δ| {meta.get('max_abs_diff')}, mode {meta.get('mode')}.",
        "",
        "Run: `pytest -q` in this folder (needs torch, numpy and `parity_tracker.testing` "
        "only; `REPRO_DEVICE` picks the device, default `cpu`).",
        "",
    ]
    if meta["kind"] == "op":
        lines += [
            _root_cause_line(meta), "",
            "`test_repro.py` calls the op with PyTorch on the reference's inputs and compares "
            "with the candidate's recorded output; it also runs the op on the candidate's own "
            "inputs, so an input difference (dtype, stride, contiguity, or values that are not "
            "bitwise equal: case B) is told apart from a kernel difference (case A: "
            "bitwise-equal inputs).", "",
        ]  # fmt: skip
    elif meta.get("rebuild"):
        lines += [f"The reference module is rebuilt from `{meta['module_class']['module']}."
                  f"{meta['module_class']['qualname']}` with its saved constructor arguments and "
                  "`state_dict.safetensors` (needs that package installed).", ""]  # fmt: skip
    else:
        lines += [
            f"The reference module cannot be rebuilt: {meta.get('rebuild_reason')}. The test "
            "compares the recorded reference output with the recorded candidate output only.",
            *("", "Module repr:", "", "```", meta.get("repr", ""), "```", ""),
        ]
    if meta.get("slice"):
        s = meta["slice"]
        lines += [
            f"Cut to fit the size limit: elements {s['start']}:{s['stop']} of {s['of']} along "
            f"dim {s['dim']} (the slice holding the worst element"
            + (f" of the flattened output of shape {s['shape']})." if "shape" in s else ")."),
            "",
        ]
    return "\n".join(lines)


def write_reproducer(material: str | Path, out: str | Path, run_id: str | None = None) -> Path:
    """Write the reproducer folder ``out`` from one kept material folder.

    Args:
        material: a ``repro/op-NN`` or ``repro/module`` folder the run kept.
        out: the folder to write (created; existing files of the same names are replaced).
        run_id: the MLflow run id of the stored run (named by ``README.md`` and
            ``test_repro.py``, and kept as ``tracking_run_id`` in ``repro.json``); None names
            the parity run id the material records.

    Returns:
        ``out``.

    Raises:
        InputError: ``material`` has no valid ``repro.json`` or names a path outside itself.
    """
    material, out = Path(material), Path(out)
    try:
        meta = repro_lib.read_index(material)
    except (OSError, ValueError) as exc:
        raise InputError(f"{material} is not reproducer material: {exc}") from exc
    names = _files(meta)
    sources = [resolve_inside(material, n) for n in names]
    out.mkdir(parents=True, exist_ok=True)
    for name, src in zip(names, sources, strict=True):
        shutil.copyfile(src, resolve_inside(out, name))
    if run_id:
        meta = {**meta, "tracking_run_id": run_id}
    (out / repro_lib.INDEX).write_text(json.dumps(meta, indent=1, allow_nan=False))
    shutil.copyfile(repro_lib.__file__, out / LIB_NAME)
    run = _run_name(meta, run_id).replace("`", "")
    (out / "test_repro.py").write_text(TEST.format(what=_what(meta), run=run))
    (out / "README.md").write_text(_readme(meta, run_id))
    return out
