"""The pairs measurements 1-3 run on, at ``--quick`` and ``--full`` sizes."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.models import Pair, transformer_pair, vae_tiny_pair

#: (layers, d_model, seq, batch): the issue's realistic shape, and a small one for --quick.
TRANSFORMER = {False: (8, 512, 256, 2), True: (2, 128, 64, 2)}
#: vae-tiny (resolution, batch): the issue's 256×256 on one of the target's photographs (--full
#: only; a --quick size is kept for running it by hand: ``cases.vae_tiny(True)``).
VAE_SIZE = {False: (256, 1), True: (32, 1)}
#: repeats of the alternating loop (after one warm-up round).
REPEATS = {False: 5, True: 3}

_PAIRS: dict[tuple[str, bool], Pair] = {}


def _cached(name: str, quick: bool, build: Callable[[], Pair]) -> Pair:
    if (name, quick) not in _PAIRS:
        _PAIRS[(name, quick)] = build()
    return _PAIRS[(name, quick)]


def transformer(quick: bool) -> Pair:
    """The ``nn.TransformerEncoder`` pair at the mode's size (built once per process)."""
    return _cached("transformer", quick, lambda: transformer_pair(*TRANSFORMER[quick]))


def vae_tiny(quick: bool) -> Pair:
    """The vae-tiny pair at the mode's resolution (built once per process)."""
    return _cached("vae-tiny", quick, lambda: vae_tiny_pair(*VAE_SIZE[quick]))
