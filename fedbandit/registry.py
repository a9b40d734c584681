"""What is registered: algorithms and instance kinds, built in and from plugins, all found the
same way: as entry points. fedbandit declares its own in its ``pyproject.toml``; a plugin is an
installed Python package that declares entry points (``pyproject.toml``)::

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

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from fedbandit.algorithms.base import AlgorithmSpec
from fedbandit.errors import ConfigError
from fedbandit.instances import Instance, InstanceKindSpec

ALGORITHM_GROUP = "fedbandit.algorithms"
INSTANCE_GROUP = "fedbandit.instances"
#: The distribution whose entry points are the built-in algorithms and instance kinds.
BUILTIN_DISTRIBUTION = "fedbandit"

__all__ = [
    "ALGORITHM_GROUP",
    "INSTANCE_GROUP",
    "InstanceKindSpec",
    "Registry",
    "algorithms",
    "build_instance",
    "instance_kinds",
    "refresh",
]


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

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.entries))


def _distribution(point: metadata.EntryPoint) -> str:
    return point.dist.name if point.dist is not None else "unknown distribution"


def _load(point: metadata.EntryPoint, expected: type, name_of: Callable[[Any], str]) -> Any:
    """The entry point's object, or the text of why it cannot be used."""
    try:
        obj = point.load()
    except Exception as err:  # a broken plugin must not stop the others
        return f"{type(err).__name__}: {err}"
    if not isinstance(obj, expected):
        return f"resolves to {type(obj).__name__}, not {expected.__name__}"
    if name_of(obj) != point.name:
        return f"entry point named {point.name!r} holds {name_of(obj)!r}"
    return obj


def _build(what: str, group: str, expected: type, name_of: Callable[[Any], str]) -> Registry:
    """The registry of one entry-point group: fedbandit's own entry points first, so that a
    plugin can never take a built-in's name, then every other distribution's."""
    points = list(metadata.entry_points(group=group))
    points.sort(key=lambda point: _distribution(point) != BUILTIN_DISTRIBUTION)
    if not points or _distribution(points[0]) != BUILTIN_DISTRIBUTION:
        raise ConfigError(
            f"no built-in {what}s: fedbandit declares them as {group!r} entry points of its "
            "installed distribution; install it (pip install -e . in the source tree) instead of "
            "putting the source folder on sys.path"
        )
    entries: dict[str, Any] = {}
    origins: dict[str, str] = {}
    broken: dict[str, str] = {}
    for point in points:
        dist = _distribution(point)
        builtin = dist == BUILTIN_DISTRIBUTION
        where = "fedbandit" if builtin else f"{dist} ({point.name} = {point.value})"
        if point.name in entries:
            broken[point.name] = f"{where}: the name is taken by {origins[point.name]}"
            continue
        loaded = _load(point, expected, name_of)
        if isinstance(loaded, str):
            broken[point.name] = f"{where}: {loaded}"
        else:
            entries[point.name], origins[point.name] = loaded, where
    return Registry(what, entries, origins, broken)


@cache
def algorithms() -> Registry[AlgorithmSpec]:
    """Every algorithm: the ``fedbandit.algorithms`` entry points, fedbandit's own first."""
    return _build("algorithm", ALGORITHM_GROUP, AlgorithmSpec, lambda s: s.name)


@cache
def instance_kinds() -> Registry[InstanceKindSpec]:
    """Every instance kind: the ``fedbandit.instances`` entry points, fedbandit's own first."""
    return _build("instance kind", INSTANCE_GROUP, InstanceKindSpec, lambda s: s.kind)


def refresh() -> None:
    """Read the entry points again (after installing a plugin in a running interpreter)."""
    algorithms.cache_clear()
    instance_kinds.cache_clear()


def build_instance(params: BaseModel) -> Instance:
    """Build the instance a validated parameter model (with its ``kind``) describes."""
    kind = getattr(params, "kind", None)
    if not isinstance(kind, str):
        raise ConfigError(f"{type(params).__name__} has no 'kind': not an instance description")
    spec = instance_kinds().get(kind)
    if not isinstance(params, spec.params):
        params = spec.params.model_validate(params.model_dump())
    return spec.build(params)
