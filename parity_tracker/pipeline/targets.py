"""The target registry: the ``parity_tracker.targets`` entry points, or ``module:function``.

A target is a callable ``build(settings: dict) -> ParityCase`` (design.md, "Targets") with an
optional settings schema ``{setting: [allowed values, default first]}``. Two sources:

1. the entry-point group ``parity_tracker.targets`` (``importlib.metadata``): the entry point's
   name is the target's name, its value a module with ``NAME``, ``DESCRIPTION``, ``SETTINGS``
   and ``build``, or a ``build`` function. The built-ins (``parity_tracker.builtin_targets``,
   the repository's ``pipelines/targets/`` folder) register there in this project's own
   pyproject.toml, exactly as another package would; they are labelled ``builtin``;
2. any importable ``module:function`` spec; the function (or its module) may carry ``SETTINGS``.

Importing a target module is cheap by contract (heavy libraries are imported inside ``build``),
and a target is imported only when it is resolved or listed.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from parity_tracker.errors import InputError

BUILTIN_PACKAGE = "parity_tracker.builtin_targets"
ENTRY_POINT_GROUP = "parity_tracker.targets"


@dataclass(frozen=True)
class Target:
    """One registered target.

    Attributes:
        name: the name used on the command line and recorded as the ``target`` setting.
        build: ``build(settings) -> ParityCase``.
        settings: the schema ``{setting: [allowed values]}``, the first value the default;
            empty means the target takes no validated settings (any ``--set`` is passed on).
        description: one line for ``parity-tracker targets``.
        source: ``builtin``, ``entry-point`` or ``spec``.
    """

    name: str
    build: Callable[[dict[str, str]], Any]
    settings: Mapping[str, list[str]] = field(default_factory=dict)
    description: str = ""
    source: str = "spec"

    def defaults(self) -> dict[str, str]:
        """The default settings: the first allowed value of each setting."""
        return {k: str(v[0]) for k, v in self.settings.items() if v}

    def validate(self, overrides: Mapping[str, Any] | None = None) -> dict[str, str]:
        """The full settings: defaults, then ``overrides`` checked against the schema.

        Raises:
            InputError: a setting the target does not have, or a value not allowed; the
                message names the target, the key and the allowed settings or values.
        """
        overrides = {str(k): str(v) for k, v in (overrides or {}).items()}
        if not self.settings:
            return overrides
        for key, value in overrides.items():
            if key not in self.settings:
                raise InputError(
                    f"unknown setting {key!r} for target {self.name!r}; "
                    f"allowed settings: {', '.join(self.settings) or '(none)'}"
                )
            allowed = [str(v) for v in self.settings[key]]
            if value not in allowed:
                raise InputError(
                    f"setting {key}={value!r} is not allowed for target {self.name!r}; "
                    f"allowed values of {key}: {', '.join(allowed)}"
                )
        return {**self.defaults(), **overrides}

    def build_case(self, settings: Mapping[str, str]) -> Any:
        """Build the ``ParityCase`` and record ``target`` plus ``settings`` in ``case.settings``.

        Values the builder put in ``case.settings`` (e.g. ``candidate``) win over ours.
        """
        case = self.build(dict(settings))
        case.settings = {"target": self.name, **settings, **(case.settings or {})}
        return case


def _from_module(module: types.ModuleType, source: str, name: str | None = None) -> Target:
    build = getattr(module, "build", None)
    if not callable(build):
        raise InputError(f"target module {module.__name__!r} has no build(settings) function")
    return Target(
        name=name or getattr(module, "NAME", module.__name__.rsplit(".", 1)[-1]),
        build=build,
        settings=dict(getattr(module, "SETTINGS", {}) or {}),
        description=str(getattr(module, "DESCRIPTION", "") or (module.__doc__ or "")).strip(),
        source=source,
    )


def _from_callable(fn: Any, source: str, name: str) -> Target:
    if isinstance(fn, types.ModuleType):
        return _from_module(fn, source, name)
    if not callable(fn):
        raise InputError(f"target {name!r} is not callable (got {type(fn).__name__})")
    module = importlib.import_module(fn.__module__) if hasattr(fn, "__module__") else None
    schema = getattr(fn, "SETTINGS", None)
    if schema is None and module is not None and getattr(fn, "__name__", "") == "build":
        schema = getattr(module, "SETTINGS", None)
    doc = getattr(fn, "DESCRIPTION", None) or (getattr(fn, "__doc__", None) or "")
    return Target(
        name=getattr(fn, "NAME", name),
        build=fn,
        settings=dict(schema or {}),
        description=str(doc).strip().split("\n", 1)[0],
        source=source,
    )


def _cwd_importable() -> None:
    """Let ``module:function`` specs name modules in the working directory, as ``python -m`` does.

    The console script's ``sys.path`` starts at its own bin folder, so without this a target in
    the user's checkout (``mypkg.pairs:build``) would need ``PYTHONPATH=.``.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _entry_points() -> Iterable[importlib.metadata.EntryPoint]:
    return importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)


def _source(ep: importlib.metadata.EntryPoint) -> str:
    """``builtin`` for this project's own targets, else ``entry-point``."""
    return "builtin" if ep.module.startswith(BUILTIN_PACKAGE + ".") else "entry-point"


def _from_entry_point(ep: importlib.metadata.EntryPoint) -> Target:
    try:
        loaded = ep.load()
    except ImportError as exc:
        raise InputError(
            f"target {ep.name!r}: cannot import {ep.value!r} ({exc}); the entry point is "
            f"registered in the {ENTRY_POINT_GROUP!r} group of an installed package"
        ) from exc
    return _from_callable(loaded, _source(ep), ep.name)


#: A target spec: a dotted module path, ``:``, and an identifier (``mypkg.pairs:build``).
SPEC_PATTERN = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:(?:[A-Za-z_]\w*)?$", re.ASCII)


def check_spec(spec: str) -> str:
    """``spec`` when it is ``module.path:function`` (``SPEC_PATTERN``); nothing is imported.

    Raises:
        InputError: anything else (a file path such as ``../x:y``, spaces, ``..``); names the
            spec and the allowed form.
    """
    if not isinstance(spec, str) or not SPEC_PATTERN.match(spec):
        raise InputError(
            f"target {spec!r} is not a registered name nor a module:function spec; a spec is a "
            "dotted module path, ':', and an identifier (e.g. mypkg.pairs:build), "
            "never a file path"
        )
    return spec


def _from_spec(spec: str) -> Target:
    module_name, _, attr = check_spec(spec).partition(":")
    _cwd_importable()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(
            f"target {spec!r}: cannot import module {module_name!r} ({exc}); "
            "a spec is module.path:function with the module importable"
        ) from exc
    if not attr:
        return _from_module(module, "spec", spec)
    fn = getattr(module, attr, None)
    if fn is None:
        raise InputError(f"target {spec!r}: module {module_name!r} has no attribute {attr!r}")
    return _from_callable(fn, "spec", spec)


def list_targets() -> list[Target]:
    """Every entry-point target, built-ins included (spec targets are not enumerable), by name.

    Raises:
        InputError: a target module fails to import (the message says which); heavy
            dependencies must be imported inside ``build``.
    """
    found: dict[str, Target] = {}
    for ep in _entry_points():
        found.setdefault(ep.name, _from_entry_point(ep))
    return [found[k] for k in sorted(found)]


def target_names() -> list[str]:
    """The names of the registered targets, sorted (imports no target module)."""
    return sorted({ep.name for ep in _entry_points()})


def resolve_target(spec: str) -> Target:
    """The target named ``spec``: a registered name, or ``module:function``.

    Raises:
        InputError: no such target; the message lists the registered names and the spec form
            (and, when nothing is registered, that the package's metadata is missing: reinstall
            with ``pip install -e .``).
    """
    if ":" in spec:
        return _from_spec(spec)
    for ep in _entry_points():
        if ep.name == spec:
            return _from_entry_point(ep)
    names = target_names()
    hint = (
        ""
        if names
        else (
            f" (no {ENTRY_POINT_GROUP!r} entry points are installed: reinstall the package, "
            "e.g. `pip install -e .`, to register the built-ins)"
        )
    )
    raise InputError(
        f"unknown target {spec!r}; registered targets: {', '.join(names) or '(none)'} "
        f"(or give any importable module.path:function){hint}"
    )


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """``["quantization=int8", "cache=kv"]`` → ``{"quantization": "int8", "cache": "kv"}``.

    Raises:
        InputError: an item without ``=`` or with an empty key.
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out
