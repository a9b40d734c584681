"""What is registered: algorithms and instance kinds, built in and from plugins.

Plugins are installed Python packages that declare entry points (``pyproject.toml``)::

    [project.entry-points."fedbandit.algorithms"]
    fed_ucb = "my_package:FED_UCB"          # an AlgorithmSpec

    [project.entry-points."fedbandit.instances"]
    two_groups = "my_package:TWO_GROUPS"    # an InstanceKindSpec

Every process that looks a name up (``fedbandit run``, its worker processes, Flower's simulation
workers, the ClientApp on a SuperNode and the ServerApp on a SuperLink) reads the entry points of
its own Python environment, so a plugin runs wherever it is installed; nothing else is configured.
A plugin that fails to load does not break the others: the error is kept and shown when its name
is asked for and by ``fedbandit list --algorithms``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from fedbandit.errors import ConfigError

if TYPE_CHECKING:
    from fedbandit.algorithms.base import AlgorithmSpec
    from fedbandit.instances import Instance

ALGORITHM_GROUP = "fedbandit.algorithms"
INSTANCE_GROUP = "fedbandit.instances"


@dataclass(frozen=True)
class InstanceKindSpec:
    """A registry entry for an instance kind: its name (the ``kind`` key of an experiment's
    ``[instance]`` table), the parameter model (a pydantic model with ``kind: Literal[name]`` and
    ``extra="forbid"``) and the builder from validated parameters to an ``Instance``."""

    kind: str
    params: type[BaseModel]
    build: Callable[[Any], Instance]
    description: str = ""

    def __post_init__(self) -> None:
        declared = self.params.model_fields.get("kind")
        if declared is None or declared.default != self.kind:
            raise TypeError(
                f"instance kind {self.kind!r}: its parameter model {self.params.__name__} must "
                f'declare kind: Literal["{self.kind}"] = "{self.kind}"'
            )


Entry = TypeVar("Entry")


@dataclass(frozen=True)
class Registry(Generic[Entry]):
    """Built-in entries plus the plugins of one entry-point group, by name."""

    what: str
    entries: dict[str, Entry]
    #: Where each entry comes from: "fedbandit" or the plugin's distribution and entry point.
    origins: dict[str, str]
    #: Plugins that failed to load: entry-point name -> "distribution: error".
    broken: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> Entry:
        try:
            return self.entries[name]
        except KeyError:
            pass
        if name in self.broken:
            raise ConfigError(
                f"the plugin providing {self.what} {name!r} failed to load: {self.broken[name]}"
            )
        known = ", ".join(sorted(self.entries))
        raise ConfigError(f"unknown {self.what} {name!r}; known {self.what}s: {known}")

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self):
        return iter(sorted(self.entries))


def _plugins(group: str, expected: type, name_of: Callable[[Any], str]):
    """(entry point name, distribution, loaded object or error text) for each plugin."""
    for point in metadata.entry_points(group=group):
        dist = point.dist.name if point.dist is not None else "unknown distribution"
        where = f"{dist} ({point.name} = {point.value})"
        try:
            obj = point.load()
        except Exception as err:  # a broken plugin must not stop the others
            yield point.name, where, f"{type(err).__name__}: {err}"
            continue
        if not isinstance(obj, expected):
            yield point.name, where, f"resolves to {type(obj).__name__}, not {expected.__name__}"
        elif name_of(obj) != point.name:
            yield point.name, where, f"entry point named {point.name!r} holds {name_of(obj)!r}"
        else:
            yield point.name, where, obj


def _build(what: str, builtin: dict[str, Any], group: str, expected: type, name_of) -> Registry:
    entries, origins, broken = dict(builtin), dict.fromkeys(builtin, "fedbandit"), {}
    for name, where, loaded in _plugins(group, expected, name_of):
        if name in entries:
            broken[name] = f"{where}: the name is taken by {origins[name]}"
        elif isinstance(loaded, str):
            broken[name] = f"{where}: {loaded}"
        else:
            entries[name], origins[name] = loaded, where
    return Registry(what, entries, origins, broken)


@cache
def algorithms() -> Registry[AlgorithmSpec]:
    """Every algorithm: fedbandit's own and the ``fedbandit.algorithms`` entry points."""
    from fedbandit.algorithms import BUILTIN_ALGORITHMS
    from fedbandit.algorithms.base import AlgorithmSpec

    return _build("algorithm", BUILTIN_ALGORITHMS, ALGORITHM_GROUP, AlgorithmSpec, lambda s: s.name)


@cache
def instance_kinds() -> Registry[InstanceKindSpec]:
    """Every instance kind: fedbandit's own and the ``fedbandit.instances`` entry points."""
    from fedbandit.instances import BUILTIN_INSTANCE_KINDS

    return _build(
        "instance kind", BUILTIN_INSTANCE_KINDS, INSTANCE_GROUP, InstanceKindSpec, lambda s: s.kind
    )


def refresh() -> None:
    """Read the entry points again (after installing a plugin in a running interpreter)."""
    algorithms.cache_clear()
    instance_kinds.cache_clear()
