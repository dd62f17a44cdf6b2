"""``parity-tracker repro``: fetch a run's kept material, write the reproducer, maybe upload it."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity_tracker.errors import InputError
from parity_tracker.repro.writer import write_reproducer

#: The run artifact folder holding the kept material (``run.keep`` writes ``repro/`` into the
#: dump folder, which ``log_run`` uploads as ``tensors/``).
MATERIAL_ARTIFACT = "tensors/repro"
#: Where ``--upload`` and the nightly log a reproducer folder: ``repro/<op-NN|module>``.
UPLOAD_ARTIFACT = "repro"
#: The flags that make a run keep what a reproducer needs.
KEEP_HINT = (
    "re-run it with `parity-tracker run TARGET --ops` (op-level reproducers need --ops; "
    "--keep-repro MIB, default 64, must not be 0, nor --dump-mode NOT)"
)


@dataclass
class Reproducer:
    """A written reproducer: its folder, the kept item, the artifact path when uploaded."""

    path: Path
    item: dict[str, Any]
    artifact: str | None = None


def _choose(kept: dict[str, Any], tag: str | None, run_id: str) -> dict[str, Any]:
    items = kept.get("items", [])
    if tag is None:
        ops = [i for i in items if i["kind"] == "op"]
        if ops or items:
            return (ops or items)[0]
        why = "; ".join(f"{n['tag']}: {n['reason']}" for n in kept.get("not_kept", []))
        raise InputError(f"run {run_id} kept no reproducer ({why or 'no divergence'})")
    for i in items:
        if tag in (i["tag"], i.get("module")):
            return i
    for n in kept.get("not_kept", []):
        if n["tag"] == tag:
            raise InputError(f"run {run_id} did not keep {tag!r}: {n['reason']}")
    have = ", ".join(i["tag"] for i in items) or "none"
    raise InputError(
        f"run {run_id} kept no reproducer for tag {tag!r} (kept: {have}); a run keeps its first "
        f"divergence and first root causes only: {KEEP_HINT}"
    )


def reproducer_from_material(material: Path, tag: str | None, out: Path, run_id: str) -> Reproducer:
    """Write the reproducer of ``tag`` (default: the first kept root cause, else the module).

    ``run_id`` is the MLflow run id the material belongs to (named in errors and the README).
    """
    index = material / "kept.json"
    if not index.is_file():
        raise InputError(f"run {run_id} kept no reproducer material: {KEEP_HINT}")
    item = _choose(json.loads(index.read_text()), tag, run_id)
    from parity_tracker.files.safe_paths import resolve_inside

    return Reproducer(write_reproducer(resolve_inside(material, item["dir"]), out, run_id), item)


def reproduce_run(
    run_id: str,
    *,
    tag: str | None = None,
    out: str | Path | None = None,
    upload: bool = False,
    tracking_uri: str | None = None,
) -> Reproducer:
    """Write the reproducer of a stored run's first divergence (or ``tag``) into ``out``.

    Args:
        run_id: the MLflow run id, or any unique prefix of it.
        tag: an op tag (``module@call::op#k``), a module output tag or a module name; None:
            the first kept root-cause op, else the first divergent module.
        out: the folder (default ``./.parity/repro/<run_id>/<op-NN|module>``).
        upload: also log the folder under the run's ``repro/<op-NN|module>`` artifacts.
        tracking_uri: the store.

    Raises:
        InputError: no such run (or an ambiguous prefix), no material kept (names the flags
            that keep it), unknown tag.
        InfrastructureError: the store could not be reached.
    """
    from parity_tracker.track.artifacts import download_folder, log_folder
    from parity_tracker.track.query import RunStore
    from parity_tracker.track.store import parity_home

    run_id = RunStore(tracking_uri).resolve_run_id(run_id)  # any unique prefix
    with tempfile.TemporaryDirectory(prefix="parity-repro-") as tmp:
        material = download_folder(run_id, MATERIAL_ARTIFACT, tmp, tracking_uri=tracking_uri)
        if material is None:
            raise InputError(f"run {run_id} kept no reproducer material: {KEEP_HINT}")
        probe = (
            _choose(json.loads((material / "kept.json").read_text()), tag, run_id)
            if (material / "kept.json").is_file()
            else {"dir": "x"}
        )
        dest = Path(out) if out else parity_home() / "repro" / run_id / probe["dir"]
        rep = reproducer_from_material(material, tag, dest, run_id)
    if upload:
        rep.artifact = log_folder(
            run_id, rep.path, f"{UPLOAD_ARTIFACT}/{rep.item['dir']}", tracking_uri=tracking_uri
        )
    return rep


def upload_first_reproducer(result: Any, run_id: str, *, tracking_uri: str | None) -> str | None:
    """The nightly's hook: log the first root cause's reproducer of a failing, logged run.

    Returns the artifact path, or None when the run kept no material (a passing run, or
    ``keep_repro=0``).
    """
    dump = getattr(result, "dump_dir", None)
    material = Path(dump) / "repro" if dump else None
    if material is None or not (material / "kept.json").is_file():
        return None
    from parity_tracker.track.artifacts import log_folder

    with tempfile.TemporaryDirectory(prefix="parity-repro-") as tmp:
        try:
            rep = reproducer_from_material(material, None, Path(tmp) / "r", run_id)
        except InputError:
            return None
        return log_folder(
            run_id, rep.path, f"{UPLOAD_ARTIFACT}/{rep.item['dir']}", tracking_uri=tracking_uri
        )
