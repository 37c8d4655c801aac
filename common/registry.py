"""Plug-ins found by name: engines, quantization methods, model families.

A plug-in is a module that defines ``PLUGIN``. A registry knows its built-in plug-ins as
{name: module path} (one line per plug-in) and also finds plug-ins that other distributions
declare under an entry-point group (``[project.entry-points."ingot.engines"]`` ``name =
"package.module"``), so a new engine can ship as a package of its own. Modules are imported
only when their plug-in is asked for: the runtime's registry never imports a build-side
module, and naming a plug-in costs no import.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from ingot.common.errors import IngotError

__all__ = ["Registry", "UnknownPlugin"]

T = TypeVar("T")


class UnknownPlugin(IngotError, KeyError):
    """No plug-in of that kind has that name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class Registry(Generic[T]):
    """{name: plug-in} of one kind, built-ins first, then the entry-point group's."""

    def __init__(self, kind: str, builtins: Mapping[str, str], group: str | None = None) -> None:
        self.kind = kind  # "engine", "quantization method", "model family": for messages
        self._modules = dict(builtins)
        self._group = group
        self._loaded: dict[str, T] = {}
        self._discovered = group is None

    def _discover(self) -> None:
        # Entry points are read once, on first use (reading them scans every installed
        # distribution's metadata).
        if self._discovered:
            return
        self._discovered = True
        for point in entry_points(group=self._group):
            self._modules.setdefault(point.name, point.value.partition(":")[0])

    def names(self) -> tuple[str, ...]:
        """Every registered name, built-ins in their declared order first."""
        self._discover()
        return tuple(self._modules)

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def get(self, name: str) -> T:
        """The plug-in called `name`; `UnknownPlugin` naming the known ones otherwise."""
        if name in self._loaded:
            return self._loaded[name]
        if name not in self.names():
            known = ", ".join(self.names())
            raise UnknownPlugin(f"unknown {self.kind} {name!r} (known: {known})")
        module = importlib.import_module(self._modules[name])
        plugin = getattr(module, "PLUGIN", None)
        if plugin is None:
            raise TypeError(f"{self._modules[name]}: a {self.kind} plug-in defines PLUGIN")
        self._loaded[name] = plugin
        return plugin

    def __iter__(self) -> Iterator[T]:
        """Every plug-in, imported, in `names()` order."""
        return (self.get(name) for name in self.names())
