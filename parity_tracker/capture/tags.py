"""The tag grammar (design.md, "Public names"): the one place that formats and parses tags.

Module-level tags (prefix ``checker_``; the root module named by :func:`root_name`):

- output, a single tensor: ``checker_{module}``; structured outputs (tuple, list, dict,
  dataclass, Hugging Face ``ModelOutput``): ``checker_{module}_output_{path}`` with the
  flattened key path joined by ``.``;
- positional input ``i``: ``checker_{module}_input_{i}``; keyword input
  ``checker_{module}_input_{name}`` (a structured input adds ``.{path}``);
- a parameter or buffer: ``checker_{qualified name}``;
- the k-th call (k >= 1) of a module called more than once in one forward (one step):
  ``{module}@{k}`` in place of ``{module}`` (:func:`call_base`).

Op tags (the op recorder, no prefix): ``{module}@{call}::{op}#{k}``, output ``i >= 1`` of a
multi-output op appending ``:{i}`` (:func:`op_tag`); ops run outside any module call belong to
:data:`TOP_MODULE` (``_top_``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the grammar is read without torch (stored runs)
    import torch

TAG_PREFIX = "checker_"
#: The root module's name in tags.
ROOT_NAME = "model"
#: The root's name when a child is named ``model`` (Hugging Face ``*ForCausalLM``).
ROOT_FALLBACK = "root"
#: The module that ops run outside any module call are attributed to.
TOP_MODULE = "_top_"


def root_name(model: torch.nn.Module) -> str:
    """The root's display name: ``"model"``, or ``"root"`` when a child is named ``model``.

    Hugging Face ``*ForCausalLM`` classes hold their backbone in a child called ``model``; with
    the root also called ``model`` both would register ``checker_model_input_input_ids`` in one
    forward. Children keep their ``named_modules()`` names (the contract), so the root yields.
    """
    clash = any(name == ROOT_NAME for name, _ in model.named_children())
    return ROOT_FALLBACK if clash else ROOT_NAME


def module_display_name(name: str, root: str = ROOT_NAME) -> str:
    """The module name used in tags: ``named_modules()``'s name, ``root`` for the root."""
    return name if name else root


module_name = module_display_name


def named_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """``{display name: module}`` over ``model.named_modules()``, the root as :func:`root_name`.

    A child named ``model`` therefore never overwrites the root.
    """
    root = root_name(model)
    return {module_display_name(name, root): mod for name, mod in model.named_modules()}


def call_base(module: str, call_index: int) -> str:
    """``module`` for the first call of a step, ``module@k`` for the k-th repeated call."""
    return module if call_index == 0 else f"{module}@{call_index}"


def module_tag(base: str) -> str:
    """The tag of a module's single-tensor output: ``checker_{base}``."""
    return f"{TAG_PREFIX}{base}"


def output_tag(base: str, path: str | None = None) -> str:
    """``checker_{base}`` for a single output, ``checker_{base}_output_{path}`` for a leaf."""
    return module_tag(base) if path is None else f"{TAG_PREFIX}{base}_output_{path}"


def input_tag(base: str, name: str) -> str:
    """``checker_{base}_input_{name}``; ``name`` is the position or keyword plus ``.{path}``."""
    return f"{TAG_PREFIX}{base}_input_{name}"


def param_tag(qualified_name: str) -> str:
    """The tag of a parameter or buffer: ``checker_{qualified name}``."""
    return f"{TAG_PREFIX}{qualified_name}"


def op_call_base(module: str, call: int, op: str, k: int) -> str:
    """``{module}@{call}::{op}#{k}`` (the call index always written, 0 included)."""
    return f"{module}@{call}::{op}#{k}"


def op_output_tag(base: str, output: int) -> str:
    """Output ``output`` of the op at ``base`` (:func:`op_call_base`); ``:{i}`` for ``i >= 1``."""
    return base if output == 0 else f"{base}:{output}"


def op_tag(module: str, call: int, op: str, k: int, output: int = 0) -> str:
    """An op output's tag: :func:`op_call_base`, with ``:{output}`` for outputs ``>= 1``."""
    return op_output_tag(op_call_base(module, call, op, k), output)


@dataclass(frozen=True)
class ParsedTag:
    """The parts of a tag (:func:`parse_tag`).

    Attributes:
        kind: ``"op"`` or ``"checker"`` (any ``checker_`` tag), else ``"other"``.
        module: the module's display name when the tag says it (op tags, and ``checker_``
            tags whose base carries ``@k``, ``_output_`` or ``_input_``), else None. A plain
            ``checker_{x}`` cannot tell a module output from a parameter: ``module`` is None
            and ``name`` is ``x``.
        call: the call index (op tags; ``@k`` of a checker tag, else 0).
        slot: ``"output"``, ``"output.{path}"``, ``"input.{name}"`` or None when unknown.
        op: the op name (op tags).
        k: the op's occurrence in its module call (op tags).
        output: the op output index (op tags).
        name: what follows ``checker_`` (checker tags) or the whole tag.
    """

    kind: str
    module: str | None
    call: int
    slot: str | None
    op: str | None = None
    k: int | None = None
    output: int | None = None
    name: str = ""


_OP = re.compile(r"^(?P<module>.*)@(?P<call>\d+)::(?P<op>.+?)#(?P<k>\d+)(?::(?P<out>\d+))?$")
_CHECKER = re.compile(r"^(?P<base>.*?)_(?P<what>output|input)_(?P<rest>.+)$")
_CALL = re.compile(r"^(?P<module>.*)@(?P<call>\d+)$")


def _split_call(base: str) -> tuple[str, int, bool]:
    m = _CALL.match(base)
    return (m["module"], int(m["call"]), True) if m else (base, 0, False)


def parse_tag(tag: str) -> ParsedTag:
    """Split a tag into its parts (the inverse of the formatters above, where unambiguous).

    A module name may itself contain ``_output_``/``_input_``; the first occurrence is taken as
    the separator, so such names parse with a shorter module. Never raises.
    """
    m = _OP.match(tag)
    if m:
        return ParsedTag(
            kind="op",
            module=m["module"],
            call=int(m["call"]),
            slot="output" if m["out"] is None else f"output_{m['out']}",
            op=m["op"],
            k=int(m["k"]),
            output=int(m["out"] or 0),
            name=tag,
        )
    if not tag.startswith(TAG_PREFIX):
        return ParsedTag(kind="other", module=None, call=0, slot=None, name=tag)
    name = tag[len(TAG_PREFIX) :]
    m = _CHECKER.match(name)
    if m:
        module, call, _ = _split_call(m["base"])
        slot = "output." + m["rest"] if m["what"] == "output" else "input." + m["rest"]
        return ParsedTag(kind="checker", module=module, call=call, slot=slot, name=name)
    module, call, explicit = _split_call(name)
    if explicit:
        return ParsedTag(kind="checker", module=module, call=call, slot="output", name=name)
    return ParsedTag(kind="checker", module=None, call=0, slot=None, name=name)
