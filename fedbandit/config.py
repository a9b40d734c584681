"""Experiments as data: ``experiments/NAME.toml`` files, validated, with clear errors.

Every key is checked: an unknown key, a wrong type or an out-of-range value stops the run with a
message naming the file, the key, the value and what was expected.
"""

from __future__ import annotations

import copy
import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from fedbandit.errors import ConfigError, describe_validation
from fedbandit.registry import algorithms, instance_kinds

#: Folders of the user's own experiments, separated by ``os.pathsep``; searched before the
#: experiments shipped with fedbandit (``fedbandit --experiments DIR`` prepends to it).
EXPERIMENTS_VARIABLE = "FEDBANDIT_EXPERIMENTS"


def shipped_folder(name: str) -> Path:
    """A folder of data fedbandit ships (``experiments`` or ``datasets``): the data package
    ``fedbandit.catalogue.NAME`` (declared in ``pyproject.toml``), read through
    ``importlib.resources``. An editable install finds the repository's top-level folder, the one
    source; an installed wheel its copy inside the package."""
    folder = resources.files(f"fedbandit.catalogue.{name}")
    if not isinstance(folder, Path):  # a package imported from a zip file, say
        raise ConfigError(f"fedbandit's {name} are not a folder on disk ({folder})")
    return folder


def folders_from_variable(variable: str, what: str, expected: str) -> list[Path]:
    """The folders the environment variable ``variable`` lists (separated by ``os.pathsep``),
    in order; a listed folder that does not exist is a ``ConfigError`` naming it as a ``what``
    folder (``expected``: what it should hold)."""
    folders = []
    for entry in os.environ.get(variable, "").split(os.pathsep):
        if not entry.strip():
            continue
        folder = Path(entry).expanduser()
        if not folder.is_dir():
            raise ConfigError(
                f"{variable}: {what} folder {folder} does not exist (expected a folder of "
                f"{expected})"
            )
        folders.append(folder)
    return folders


def experiment_folders() -> list[Path]:
    """Where experiment names are looked up, first match wins: the folders of
    ``$FEDBANDIT_EXPERIMENTS`` in order, then the experiments shipped with fedbandit. A listed
    folder that does not exist is an error naming it."""
    listed = folders_from_variable(EXPERIMENTS_VARIABLE, "experiment", "NAME.toml files")
    return [*listed, shipped_folder("experiments")]


__all__ = [
    "ConfigError",
    "ExperimentConfig",
    "PlotConfig",
    "SweepConfig",
    "available_experiments",
    "describe_validation",
    "experiment_folders",
    "load_experiment",
    "shipped_folder",
]


class SweepConfig(BaseModel):
    """An experiment's ``[sweep]`` table: ``grid`` (cartesian product) and ``zip`` (varied
    together) map dotted config keys to lists of values."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    grid: dict[str, list[Any]] = Field(default_factory=dict)
    together: dict[str, list[Any]] = Field(default_factory=dict, alias="zip")

    @model_validator(mode="after")
    def _check(self) -> SweepConfig:
        for table, values in (("grid", self.grid), ("zip", self.together)):
            for key, listed in values.items():
                if not listed:
                    raise ValueError(f"sweep.{table}.{key!r} lists no values")
                if key in ("name", "seeds", "sweep") or key.startswith("sweep."):
                    raise ValueError(f"sweep.{table}.{key!r}: this key cannot be varied")
        lengths = {len(v) for v in self.together.values()}
        if len(lengths) > 1:
            shown = ", ".join(f"{k} ({len(v)})" for k, v in self.together.items())
            raise ValueError(f"sweep.zip lists must have one length, got {shown}")
        if overlap := set(self.grid) & set(self.together):
            raise ValueError(f"keys in both sweep.grid and sweep.zip: {sorted(overlap)}")
        return self

    @property
    def keys(self) -> list[str]:
        return [*self.grid, *self.together]


class PlotConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    log_x: bool = Field(False, description="logarithmic time axis in the regret plot")
    regret_over_log_t: bool = Field(False, description="also plot R(T) / log T against T")


class ExperimentConfig(BaseModel):
    """One named experiment: an instance, a horizon, algorithms and seeds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    horizon: int = Field(ge=1, description="T, pulls per client")
    seeds: int = Field(5, ge=1, description="number of independent reward seeds")
    base_seed: int = Field(0, ge=0)
    algorithms: list[str] = Field(min_length=1)
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    group_size: int | None = Field(None, ge=1, description="clients per client group")
    #: The parameter model of a registered instance kind (built in or a plugin's), chosen by
    #: the table's ``kind`` key.
    instance: SerializeAsAny[BaseModel]
    plot: PlotConfig = Field(default_factory=PlotConfig)
    #: A parameter study (``fedbandit sweep``): config keys varied over a grid or together.
    sweep: SweepConfig | None = None

    @field_validator("instance", mode="before")
    @classmethod
    def _instance_kind(cls, value: Any) -> BaseModel:
        if isinstance(value, BaseModel):
            value = value.model_dump()
        if not isinstance(value, dict):
            raise ValueError(f"instance must be a table with a 'kind' key, got {value!r}")
        kind = value.get("kind")
        if kind is None:
            known = ", ".join(instance_kinds())
            raise ValueError(f"instance needs a 'kind' key; known kinds: {known}")
        try:
            spec = instance_kinds().get(str(kind))
        except ConfigError as err:
            raise ValueError(str(err)) from None
        try:
            return spec.params.model_validate(value)
        except ValidationError as err:
            raise ValueError(describe_validation(err, prefix=f"instance.{kind}.")) from None

    @model_validator(mode="after")
    def _check_algorithms(self) -> ExperimentConfig:
        if len(set(self.algorithms)) != len(self.algorithms):
            raise ValueError(f"algorithms are listed twice: {self.algorithms}")
        registry = algorithms()
        for name in self.algorithms:
            try:
                registry.get(name)
            except ConfigError as err:
                raise ValueError(str(err)) from None
        for name, values in self.params.items():
            if name not in self.algorithms:
                raise ValueError(f"params given for {name!r}, which is not in algorithms")
            try:
                registry.get(name).params(**values)
            except ValidationError as err:
                raise ValueError(f"params.{name}: {describe_validation(err)}") from None
        return self

    def hyperparameters(self, algorithm: str) -> dict[str, Any]:
        return dict(self.params.get(algorithm, {}))


def available_experiments() -> dict[str, Path]:
    """Every experiment name and its file, sorted by name; a name in an earlier folder of
    ``experiment_folders()`` shadows the same name in a later one."""
    found: dict[str, Path] = {}
    for folder in experiment_folders():
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def find_experiment(name_or_path: str) -> Path:
    """The file of an experiment given by path (anything ending in ``.toml`` or that exists) or
    by name (looked up in ``experiment_folders()``)."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(f"experiment file {path} does not exist")
        return path
    known = available_experiments()
    if name_or_path not in known:
        searched = ", ".join(str(folder) for folder in experiment_folders())
        raise ConfigError(
            f"no experiment named {name_or_path!r} in {searched}; "
            f"known: {', '.join(known) or 'none'} (a folder of your own: --experiments DIR "
            f"or {EXPERIMENTS_VARIABLE})"
        )
    return known[name_or_path]


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value``: the value is read as a TOML value, or kept as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return [part.strip() for part in key.split(".")], value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` style ``key=value`` strings to ``data`` in place."""
    return set_values(data, [parse_override(text) for text in overrides])


def set_values(data: dict[str, Any], pairs: list[tuple[list[str], Any]]) -> dict[str, Any]:
    """Set each dotted key path of ``pairs`` in ``data`` (creating tables), in place."""
    for keys, value in pairs:
        node = data
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {'.'.join(keys)}: {key!r} is not a table")
            node = child
        node[keys[-1]] = value
    return data


def load_experiment(name_or_path: str, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read, override and validate an experiment; errors name the file and the key."""
    path = find_experiment(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    data.setdefault("name", path.stem)
    if not overrides:
        return validate_experiment(data, source=str(path))
    validate_experiment(copy.deepcopy(data), source=str(path))  # the file's own mistakes first
    apply_overrides(data, overrides)
    shown = " ".join(f"--set {text}" for text in overrides)
    return validate_experiment(data, source=f"{shown} (over {path})")


def validate_experiment(data: dict[str, Any], source: str = "<config>") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: {describe_validation(err)}") from None
