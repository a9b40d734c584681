"""Experiments as data: ``experiments/NAME.toml`` files, validated, with clear errors.

Every key is checked: an unknown key, a wrong type or an out-of-range value stops the run with a
message naming the file, the key, the value and what was expected.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedbandit.algorithms import get_algorithm
from fedbandit.instances import INSTANCE_KINDS

EXPERIMENTS_DIR = Path(
    os.environ.get("FEDBANDIT_EXPERIMENTS", Path(__file__).resolve().parents[1] / "experiments")
)


class ConfigError(ValueError):
    """A configuration problem, with a message meant for the user."""


#: Every registered instance kind, discriminated by its ``kind`` key.
InstanceConfig = Annotated[
    Union[tuple(model for model, _ in INSTANCE_KINDS.values())],  # noqa: UP007
    Field(discriminator="kind"),
]


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
    instance: InstanceConfig
    plot: PlotConfig = Field(default_factory=PlotConfig)

    @model_validator(mode="after")
    def _check_algorithms(self) -> ExperimentConfig:
        if len(set(self.algorithms)) != len(self.algorithms):
            raise ValueError(f"algorithms are listed twice: {self.algorithms}")
        for name in self.algorithms:
            get_algorithm(name)
        for name, values in self.params.items():
            if name not in self.algorithms:
                raise ValueError(f"params given for {name!r}, which is not in algorithms")
            try:
                get_algorithm(name).params(**values)
            except ValidationError as err:
                raise ValueError(f"params.{name}: {_describe(err)}") from None
        return self

    def hyperparameters(self, algorithm: str) -> dict[str, Any]:
        return dict(self.params.get(algorithm, {}))


def _describe(err: ValidationError) -> str:
    parts = []
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"])
        if not item["loc"]:
            parts.append(str(item["msg"]).removeprefix("Value error, "))
        elif item["type"] == "extra_forbidden":
            parts.append(f"unknown key {key!r}")
        else:
            parts.append(f"{key}: {item['msg']} (got {item.get('input')!r})")
    return "; ".join(parts)


def available_experiments() -> dict[str, Path]:
    if not EXPERIMENTS_DIR.is_dir():
        return {}
    return {p.stem: p for p in sorted(EXPERIMENTS_DIR.glob("*.toml"))}


def find_experiment(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(f"experiment file {path} does not exist")
        return path
    known = available_experiments()
    if name_or_path not in known:
        raise ConfigError(
            f"no experiment named {name_or_path!r} in {EXPERIMENTS_DIR}; "
            f"known: {', '.join(known) or 'none'}"
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
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {text!r}: {key!r} is not a table")
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
    apply_overrides(data, overrides or [])
    return validate_experiment(data, source=str(path))


def validate_experiment(data: dict[str, Any], source: str = "<config>") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: {_describe(err)}") from None
