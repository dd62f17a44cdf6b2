"""The silero-vad target's code (imports torch at import time).

Its metadata (``NAME``, ``DESCRIPTION``, ``SETTINGS``) and the module docstring are in
``parity_tracker.builtin_targets.silero_vad``, the entry point, which reads without torch and loads
this module on first use of ``build`` or any other name.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from parity_tracker.builtin_targets import _common
from parity_tracker.builtin_targets.silero_vad import DESCRIPTION as DESCRIPTION
from parity_tracker.builtin_targets.silero_vad import NAME as NAME
from parity_tracker.builtin_targets.silero_vad import SETTINGS as SETTINGS
from parity_tracker.errors import InfrastructureError
from parity_tracker.pipeline.case import ParityCase

ONNX_FILES = {
    "onnx": "silero_vad.onnx",
    "onnx-op15": "silero_vad_16k_op15.onnx",
    "onnx-op18-ifless": "silero_vad_op18_ifless.onnx",
}
SAMPLE_RATE = 16_000
CHUNK = 512
CONTEXT = 64
CHUNKS = 32
SEED = 0


def data_dir() -> Path:
    """The ``silero_vad/data`` folder of the installed wheel, found without importing it.

    (Importing ``silero_vad`` would run ``torch.set_num_threads(1)`` for the whole process.)

    Raises:
        InfrastructureError: the ``silero-vad`` package is not installed.
    """
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise InfrastructureError(
            "target 'silero-vad' needs the silero-vad package: "
            "pip install 'parity-tracker[targets]'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def synth_speech(chunks: int = CHUNKS, seed: int = SEED) -> torch.Tensor:
    """A deterministic speech-like signal ``(1, chunks * 512)`` float32 at 16 kHz, in [-1, 1].

    Two voiced bursts (0.10-0.40 s and 0.65-0.95 s): a fundamental gliding 110→170 Hz and
    170→120 Hz with 12 harmonics weighted by three formant peaks (700, 1200, 2600 Hz, Gaussian
    bandwidth 150 Hz), under a raised-cosine attack/decay envelope (30 ms) and a 4 Hz syllable
    modulation; plus white noise at amplitude 0.003 from ``numpy.random.default_rng(seed)``.
    """
    n = chunks * CHUNK
    t = np.arange(n) / SAMPLE_RATE
    rng = np.random.default_rng(seed)
    signal = 0.003 * rng.standard_normal(n)
    for start, stop, f_from, f_to in ((0.10, 0.40, 110.0, 170.0), (0.65, 0.95, 170.0, 120.0)):
        inside = (t >= start) & (t < stop)
        tt = t[inside] - start
        dur = stop - start
        f0 = f_from + (f_to - f_from) * tt / dur
        phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
        voiced = np.zeros_like(tt)
        for h in range(1, 13):
            freq = h * f0
            weight = sum(np.exp(-(((freq - f) / 150.0) ** 2)) for f in (700.0, 1200.0, 2600.0))
            voiced += (0.2 + weight) / h * np.sin(h * phase)
        ramp = np.clip(np.minimum(tt, dur - tt) / 0.03, 0.0, 1.0)
        envelope = 0.5 - 0.5 * np.cos(np.pi * ramp)
        syllables = 0.6 + 0.4 * np.sin(2 * np.pi * 4.0 * tt) ** 2
        signal[inside] += 0.25 * envelope * syllables * voiced / np.abs(voiced).max()
    return torch.from_numpy(np.clip(signal, -1.0, 1.0).astype(np.float32))[None]


class TorchScriptVAD(torch.nn.Module):
    """The TorchScript model's 16 kHz network as a module: ``(window, state) -> (prob, state)``.

    The scripted model is stored outside the module tree (``named_modules()`` yields only this
    wrapper): TorchScript modules take no Python hooks, and its weights are not comparable
    with the ONNX initializers tag by tag anyway.
    """

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", DeprecationWarning
            )  # torch.jit.load: the wheel's format
            engine = torch.jit.load(str(path), map_location="cpu").eval()
        object.__setattr__(self, "engine", engine)

    def forward(self, window: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        prob, new_state = self.engine._model(window, state)
        return prob, new_state


class OnnxRuntimeVAD:
    """An ONNX Silero VAD in an onnxruntime CPU session as ``(window, state) -> (prob, state)``.

    One intra-op and one inter-op thread (as silero-vad's own ``OnnxWrapper``).
    """

    def __init__(self, path: Path) -> None:
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3  # the shipped files trigger unused-initializer warnings
        self.path = path
        self.session = onnxruntime.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self._takes_sr = any(i.name == "sr" for i in self.session.get_inputs())

    def __call__(self, window: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feeds = {"input": window.numpy(), "state": state.numpy()}
        if self._takes_sr:
            feeds["sr"] = np.array(SAMPLE_RATE, dtype=np.int64)
        prob, new_state = self.session.run(["output", "stateN"], feeds)
        return torch.from_numpy(prob), torch.from_numpy(new_state)


def chunk_windows(audio: torch.Tensor) -> list[torch.Tensor]:
    """``audio`` ``(1, N)`` as 576-sample windows: each 512-sample chunk after 64 of context."""
    padded = torch.cat([torch.zeros(1, CONTEXT), audio], dim=1)
    return [
        padded[:, k * CHUNK : k * CHUNK + CONTEXT + CHUNK].clone()
        for k in range(audio.shape[1] // CHUNK)
    ]


def make_drive(audio: torch.Tensor, register: bool) -> Callable[..., None]:
    """Stream ``audio`` ``(1, N)`` chunk by chunk (step ``k`` = chunk ``k``), state fed back.

    Args:
        audio: the signal, 16 kHz float32.
        register: register the call's inputs and outputs by hand under the tags the root
            hooks of a module would produce (for a candidate that is not an ``nn.Module``).
    """
    from parity_tracker.capture import ROOT_NAME, input_leaves, output_leaves

    windows = chunk_windows(audio)

    def drive(model: Callable[..., tuple[torch.Tensor, ...]], rec: Any) -> None:
        state = torch.zeros(2, 1, 128)
        for k, window in enumerate(windows):
            rec(k)
            if register:
                for tag, _, leaf in input_leaves(ROOT_NAME, (window, state), None):
                    rec.register(tag, leaf)
            out = model(window, state)
            if register:
                for tag, _, leaf in output_leaves(ROOT_NAME, out):
                    rec.register(tag, leaf)
            state = out[1]

    return drive


def build(settings: dict[str, Any] | None = None) -> ParityCase:
    """Build the silero-vad case.

    Args:
        settings: ``candidate`` (onnx | onnx-op15 | onnx-op18-ifless | torchscript); missing
            keys take the first value.

    Returns:
        A multi-step :class:`ParityCase` (one step per 512-sample chunk, 32 steps): the
        reference (and the ``torchscript`` candidate) hooked as modules, an onnxruntime
        candidate registering its tensors through ``candidate_drive``.

    Raises:
        InputError: an unknown setting or value.
        InfrastructureError: the silero-vad package (or onnxruntime) is missing.
    """
    chosen = _common.resolve_settings(NAME, SETTINGS, settings)
    folder = data_dir()
    reference = TorchScriptVAD(folder / "silero_vad.jit")
    name = chosen["candidate"]
    if name == "torchscript":
        candidate: Any = TorchScriptVAD(folder / "silero_vad.jit")
    else:
        try:
            candidate = OnnxRuntimeVAD(folder / ONNX_FILES[name])
        except ImportError as exc:
            raise InfrastructureError(
                "target 'silero-vad' needs onnxruntime: pip install 'parity-tracker[targets]'"
            ) from exc
    audio = synth_speech()
    recorded = _common.recorded_settings(
        NAME,
        chosen,
        dtype="float32",
        implementation="same" if name == "torchscript" else "onnxruntime",
    )
    return ParityCase(
        reference=reference,
        candidate=candidate,
        drive=make_drive(audio, register=False),
        candidate_drive=make_drive(audio, register=not isinstance(candidate, torch.nn.Module)),
        settings=recorded,
        notes=(
            f"reference silero_vad.jit (TorchScript) vs {candidate.path.name} "
            f"({'TorchScript' if name == 'torchscript' else 'onnxruntime CPU, 1 thread'}); "
            f"{CHUNKS} chunks of 512 samples of synthetic speech at 16 kHz"
        ),
    )
