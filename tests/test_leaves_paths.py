"""Tags and slots of structured inputs and outputs (issue 19, m10: the leaves' fast paths).

Every expected tag below is written by hand from the grammar of design.md ("Public names"):
``checker_{base}_input_{name}[.{path}]`` / ``checker_{base}_output_{path}``, tuples keyed by
index, mappings by ``str(key)``, dataclasses by field name (``None`` fields kept).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from parity_tracker.capture.leaves import (
    NonTensor,
    field_names,
    flatten,
    output_leaves,
    value_leaves,
)

A, B, C = torch.ones(2), torch.zeros(3), torch.full((1,), 7.0)


class Opaque:  # a cache-like object: neither tensor, number, container nor dataclass
    pass


@dataclasses.dataclass
class Out:  # a ModelOutput-like dataclass: a None field, a nested tuple, an opaque field
    logits: Any = None
    loss: Any = None
    cache: Any = None
    pair: Any = None
    extra: dataclasses.InitVar[int] = 0  # not a field: dataclasses.fields leaves it out

    def __post_init__(self, extra: int) -> None:
        pass


def _shown(leaves):
    """Each leaf as ``(tag, slot, what)``: the tensor object itself, None, or the NonTensor type."""
    return [
        (tag, slot, leaf.type_name if isinstance(leaf, NonTensor) else leaf)
        for tag, slot, leaf in leaves
    ]


def _same(got, expected):
    assert len(got) == len(expected)
    for (tag, slot, leaf), (etag, eslot, eleaf) in zip(got, expected, strict=True):
        assert (tag, slot) == (etag, eslot)
        assert leaf is eleaf if not isinstance(eleaf, str) else leaf == eleaf


def test_tuple_input_of_tensors_none_and_nested_values():
    out: list = []
    value = (A, None, [B, {"k": C}], Opaque())
    value_leaves("layer@1", "pe", "checker_layer@1_input_pe", "input.pe", value, out)
    _same(
        _shown(out),
        [
            ("checker_layer@1_input_pe.0", "input.pe.0", A),
            ("checker_layer@1_input_pe.1", "input.pe.1", None),
            ("checker_layer@1_input_pe.2.0", "input.pe.2.0", B),
            ("checker_layer@1_input_pe.2.1.k", "input.pe.2.1.k", C),
            ("checker_layer@1_input_pe.3", "input.pe.3", "Opaque"),
        ],
    )


def test_empty_tuple_input_has_no_leaf():
    out: list = []
    value_leaves("m", "0", "checker_m_input_0", "input.0", (), out)
    assert out == []


def test_tuple_output_of_tensors_none_and_nested_values():
    got = output_leaves("attn", [A, None, (B, Opaque())])
    _same(
        _shown(got),
        [
            ("checker_attn_output_0", "output.0", A),
            ("checker_attn_output_1", "output.1", None),
            ("checker_attn_output_2.0", "output.2.0", B),
            ("checker_attn_output_2.1", "output.2.1", "Opaque"),
        ],
    )


def test_dataclass_output_keeps_none_fields_and_nests():
    got = output_leaves("root", Out(logits=A, cache=Opaque(), pair=(B, {"": C})))
    _same(
        _shown(got),
        [
            ("checker_root_output_logits", "output.logits", A),
            ("checker_root_output_loss", "output.loss", None),
            ("checker_root_output_cache", "output.cache", "Opaque"),
            ("checker_root_output_pair.0", "output.pair.0", B),
            ("checker_root_output_pair.1.", "output.pair.1.", C),  # the key "" kept as is
        ],
    )


def test_dataclass_inside_a_mapping_with_an_empty_key():
    # path ("", ...) joins to ".x": the dataclass's children keep the empty key in their path
    got = [(p, leaf) for p, leaf in flatten({"": Out(logits=A)})]
    assert [p for p, _ in got] == [".logits", ".loss", ".cache", ".pair"]
    assert got[0][1] is A and all(leaf is None for _, leaf in got[1:])


def test_field_names_are_the_fields_of_each_class():
    @dataclasses.dataclass
    class Other:
        b: Any = None
        a: Any = None

    assert field_names(Out()) == ("logits", "loss", "cache", "pair")
    assert field_names(Other()) == ("b", "a")
    assert field_names(Out(logits=A)) == ("logits", "loss", "cache", "pair")
