"""Read-only commands (``history``, ``diff``, ``report``, ``targets``) never import torch.

Each command runs in a fresh interpreter against a small embedded store built in ``tmp_path``;
at exit the interpreter reports which of torch / transformers / diffusers are in
``sys.modules`` (issue 18: every read-only command paid ~2 s importing torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("torch", "transformers", "diffusers")
#: The stored runs claim the built-in target digits-cnn with its default settings, so that
#: ``history digits-cnn`` over two configurations resolves the target (its metadata only).
SETTINGS = {"target": "digits-cnn", "quantization": "none", "memory_format": "contiguous",
            "candidate": "torch", "ort_optimization": "disable_all"}  # fmt: skip

_PROBE = textwrap.dedent(
    """
    import json, sys
    from parity_tracker.cli import main
    code = 0
    try:
        main(sys.argv[2:])
    except SystemExit as exc:
        code = exc.code
    heavy = [m for m in {heavy!r} if m in sys.modules]
    with open(sys.argv[1], "w") as f:
        json.dump({{"code": code, "heavy": heavy}}, f)
    """
).format(heavy=HEAVY)


@pytest.fixture(scope="module")
def stored(tmp_path_factory, tiny_pair_module):
    """``(tmp, uri, [run ids])``: 3 logged runs, 2 commits, 2 configurations (fp16 last)."""
    from parity_tracker.run import run_parity
    from parity_tracker.track import log_run

    tmp = tmp_path_factory.mktemp("readonly")
    uri = f"sqlite:///{tmp / 'store' / 'mlflow.db'}"
    reference, candidate, inputs = tiny_pair_module
    ids = []
    for i, (commit, quant) in enumerate([("c1" * 20, "none"), ("c2" * 20, "none"),
                                         ("c2" * 20, "fp16")]):  # fmt: skip
        result = run_parity(reference, candidate, inputs, settings={**SETTINGS,
                            "quantization": quant}, environment={"git_commit": commit})  # fmt: skip
        ids.append(log_run(result, tracking_uri=uri, spool_dir=tmp / "spool"))
        assert i == len(ids) - 1
    return tmp, uri, ids


@pytest.fixture(scope="module")
def tiny_pair_module():
    import torch
    from conftest import _tiny_classes

    tiny_net, tiny_scaled = _tiny_classes()
    torch.manual_seed(0)
    reference, candidate = tiny_net(), tiny_scaled()
    candidate.load_state_dict(reference.state_dict())
    return reference, candidate, (torch.randn(5, 4, generator=torch.Generator().manual_seed(1)),)


def _probe(tmp, uri, args):
    out = tmp / "probe.json"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PARITY_TRACKER_CACHE": str(tmp / "cache")}
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(out), *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.is_file(), proc.stderr[-3000:]
    return json.loads(out.read_text()), proc


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    ["history", "history-tag", "history-configs", "diff", "report", "targets"],
)
def test_read_only_commands_do_not_import_torch(stored, command):
    tmp, uri, (r1, r2, _r3) = stored
    args = {
        "history": ["history", "digits-cnn", "--set", "quantization=fp16", "--json"],
        "history-tag": [
            "history",
            "digits-cnn",
            "--set",
            "quantization=none",
            "--tag",
            "checker_fc1",
            "--json",
        ],
        "history-configs": ["history", "digits-cnn", "--json"],  # 2 fingerprints: resolves it
        "diff": ["diff", r1[:12], r2, "--json"],
        "report": ["report", r2[:12], "-o", str(tmp / "report.html"), "--json"],
        "targets": ["targets", "--json"],
    }[command]
    got, proc = _probe(tmp, uri, args)
    assert got["code"] in (0, None), proc.stderr[-3000:]
    assert got["heavy"] == [], f"{command} imported {got['heavy']}"
    if command == "history-tag":
        doc = json.loads(proc.stdout)
        assert [p["commit"] for p in doc["points"]] == ["c1" * 20, "c2" * 20]
        assert all(p["tag_status"] is not None for p in doc["points"])
    if command == "history-configs":  # the target's defaults: quantization=none
        assert json.loads(proc.stdout)["settings"]["quantization"] == "none"
    if command == "targets":
        names = {t["name"] for t in json.loads(proc.stdout)}
        assert {"digits-cnn", "llama-tiny", "vae-tiny", "flux-tiny", "silero-vad"} <= names
    if command == "report":
        assert "<html" in (tmp / "report.html").read_text().lower()
