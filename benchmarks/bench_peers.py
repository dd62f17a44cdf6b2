"""Measurement 3: our runs ÷ the peers', on the same transformer pair, in the same loop.

Peers: torch's Numeric Suite (``torch.ao.ns._numeric_suite.compare_model_outputs``, which logs
the outputs of quantizable modules — here Linear and LayerNorm — by reference and compares
nothing; a second contender adds one ``torch.equal`` per logged pair) and torchlens
(``torchlens.trace`` of each model with every layer's output saved; no comparison). Our
module-level run covers strictly more (every module's params, buffers, inputs, outputs, each
compared and hashed), our op-level run the same ops torchlens traces plus the comparison, so
"ours ÷ theirs" below 1 means cheaper at greater-or-equal coverage.
"""

from __future__ import annotations

from benchmarks import cases
from benchmarks._common import Row, failed
from benchmarks.overhead import ratio_row, session

NAME = "3 peers"


def run(quick: bool) -> list[Row]:
    """Rows of measurement 3: ours ÷ theirs, and each peer ÷ plain for scale."""
    try:
        pair = cases.transformer(quick)
        s = session(pair, peers=True, fast_path=True, repeats=cases.REPEATS[quick], quick=quick)
    except Exception as exc:
        return [failed(NAME, "transformer", exc)]
    return [
        ratio_row(s, f"{NAME}: module-level ÷ Numeric Suite", "module", "numeric_suite", None),
        ratio_row(s, f"{NAME}: module-level ÷ NS+equal", "module", "numeric_suite+equal", None),
        ratio_row(s, f"{NAME}: op-level ÷ torchlens", "ops", "torchlens", None),
        ratio_row(s, f"{NAME}: Numeric Suite ÷ plain", "numeric_suite", "plain", None),
        ratio_row(s, f"{NAME}: torchlens ÷ plain", "torchlens", "plain", None),
    ]
