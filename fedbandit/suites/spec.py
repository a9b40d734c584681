"""Suites as data: ``suites/NAME.toml`` files, validated, and resolved into runs.

A suite file names ``seeds``, optionally the ``algorithms`` compared (default: every built-in
algorithm), suite-wide ``[params.ALGO]`` tables, and ``[environments.NAME]`` tables. An
environment takes an experiment (``experiment = "fedpe_tiny"``: its instance, horizon, group size
and hyperparameters) and changes it (``horizon``, ``[environments.NAME.set]``: dotted keys as for
``--set``, ``[environments.NAME.params.ALGO]``), and names its two reference ends: ``alone`` (the
clients learning alone, no communication) and ``pooled`` (one learner that sees every client's
data), each an algorithm name or ``{algorithm = ..., params = {...}}``.

Which algorithm applies to which environment is the registry's own rule: an algorithm applies
when its server builds on the environment's instance (``simulation.build_server``: the spec's
``check_problem`` and its hyperparameters' validation); otherwise the refusal is the reason
recorded for the exclusion.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedbandit._version import __version__
from fedbandit.config import (
    ExperimentConfig,
    find_experiment,
    folders_from_variable,
    set_values,
    shipped_folder,
    validate_experiment,
)
from fedbandit.errors import ConfigError, describe_validation
from fedbandit.instances import Instance
from fedbandit.registry import algorithms as registered_algorithms
from fedbandit.registry import build_instance
from fedbandit.simulation import build_server

#: Folders of the user's own suites, separated by ``os.pathsep``; searched before the suites
#: shipped with fedbandit.
SUITES_VARIABLE = "FEDBANDIT_SUITES"

#: The two reference ends of every environment, in the order they are listed.
REFERENCE_ROLES = ("alone", "pooled")

#: Keys of an experiment file that a suite decides itself.
_SUITE_OWNED_KEYS = ("name", "description", "seeds", "algorithms", "sweep", "plot")


class ReferenceRun(BaseModel):
    """One reference end: an algorithm and the hyperparameters it runs with there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: str
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"algorithm": value} if isinstance(value, str) else value


class EnvironmentSpec(BaseModel):
    """One ``[environments.NAME]`` table."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    experiment: str = Field(description="the experiment (name or TOML path) it starts from")
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    horizon: int | None = Field(None, ge=1, description="T, pulls per client")
    overrides: dict[str, Any] = Field(default_factory=dict, alias="set")
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    alone: ReferenceRun
    pooled: ReferenceRun


class SuiteConfig(BaseModel):
    """A whole suite file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    seeds: int = Field(ge=2, description="seeds per (environment, algorithm); 2 or more")
    base_seed: int = Field(0, ge=0)
    algorithms: list[str] | None = Field(
        None, description="the algorithms compared; default: every built-in algorithm"
    )
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    environments: dict[str, EnvironmentSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_names(self) -> SuiteConfig:
        for name in self.environments:
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(
                    f"environments.{name}: a name of letters, digits, '_' and '-' was expected"
                )
        return self


@dataclass(frozen=True)
class PlannedRun:
    """One (environment, entry) of a suite: the experiment it runs (one algorithm), its role
    (``algorithm``, ``alone`` or ``pooled``) and whether the algorithm is built in."""

    environment: str
    label: str
    role: str
    config: ExperimentConfig
    builtin: bool

    @property
    def algorithm(self) -> str:
        return self.config.algorithms[0]

    def key(self) -> str:
        """The cache key: fedbandit's version and the resolved configuration (seeds aside, so
        that more seeds extend the same folder), as 20 hex digits of SHA-256."""
        data = self.config.model_dump(mode="json", exclude_none=True, by_alias=True)
        data.pop("seeds", None)
        text = json.dumps({"fedbandit": __version__, "config": data}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass
class Environment:
    """An environment resolved: its instance, the runs it holds and the algorithms that do not
    apply to it (name -> the registry's reason)."""

    name: str
    spec: EnvironmentSpec
    instance: Instance
    horizon: int
    num_clients: int
    runs: list[PlannedRun] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)

    def reference(self, role: str) -> PlannedRun:
        return next(run for run in self.runs if run.role == role)

    @property
    def compared(self) -> list[PlannedRun]:
        return [run for run in self.runs if run.role == "algorithm"]


def suite_folders() -> list[Path]:
    """Where suite names are looked up, first match wins: the folders of ``$FEDBANDIT_SUITES``
    in order, then the suites shipped with fedbandit (``suites/`` of its experiments)."""
    listed = folders_from_variable(SUITES_VARIABLE, "suite", "NAME.toml suite files")
    return [*listed, shipped_folder("experiments") / "suites"]


def available_suites() -> dict[str, Path]:
    """Every suite name and its file; an earlier folder shadows a later one."""
    found: dict[str, Path] = {}
    for folder in suite_folders():
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def find_suite(name_or_path: str) -> Path:
    """The file of a suite given by path (ending in ``.toml`` or existing) or by name."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(f"suite file {path} does not exist")
        return path
    known = available_suites()
    if name_or_path not in known:
        raise ConfigError(
            f"no suite named {name_or_path!r}; known: {', '.join(known) or 'none'} (a folder "
            f"of your own: ${SUITES_VARIABLE}, or give the suite file's path)"
        )
    return known[name_or_path]


def load_suite(name_or_path: str) -> SuiteConfig:
    """Read and validate a suite file; an error names the file and the key."""
    path = find_suite(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    data.setdefault("name", path.stem)
    try:
        return SuiteConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{path}: {describe_validation(err)}") from None


def _experiment_data(spec: EnvironmentSpec, where: str) -> dict[str, Any]:
    """The environment's experiment as a dict: the base file, minus what the suite decides,
    with the environment's horizon and ``set`` overrides applied."""
    path = find_experiment(spec.experiment)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{where}: experiment {path}: not valid TOML: {err}") from None
    for key in _SUITE_OWNED_KEYS:
        data.pop(key, None)
    if spec.horizon is not None:
        data["horizon"] = spec.horizon
    for key in spec.overrides:
        if key.split(".")[0] in (*_SUITE_OWNED_KEYS, "params"):
            raise ConfigError(
                f"{where}.set: key {key!r} is decided by the suite (use seeds, algorithms or "
                "[params] of the suite file)"
            )
    set_values(data, [(key.split("."), value) for key, value in spec.overrides.items()])
    return data


def _run_config(
    base: dict[str, Any],
    environment: str,
    algorithm: str,
    params: dict[str, Any],
    suite: SuiteConfig,
    where: str,
) -> ExperimentConfig:
    data = copy.deepcopy(base)
    data.update(
        {
            "name": environment,
            "seeds": suite.seeds,
            "base_seed": suite.base_seed,
            "algorithms": [algorithm],
            "params": {algorithm: params} if params else {},
        }
    )
    return validate_experiment(data, source=f"{where} ({algorithm})")


def _applies(instance: Instance, config: ExperimentConfig) -> str | None:
    """None when the run's algorithm builds on the instance, else the registry's reason."""
    algorithm = config.algorithms[0]
    try:
        build_server(instance, algorithm, config.horizon, config.hyperparameters(algorithm))
    except (ConfigError, ValueError) as err:
        return str(err)
    return None


def resolve(suite: SuiteConfig, extra_algorithms: list[str] | None = None) -> list[Environment]:
    """Every environment of the suite with its runs: the reference ends and each algorithm that
    applies (the suite's, or every built-in, plus ``extra_algorithms``). A reference end that
    does not apply, or an extra algorithm that applies nowhere, is a ConfigError."""
    registry = registered_algorithms()
    names = (
        list(suite.algorithms)
        if suite.algorithms is not None
        else [name for name in registry if registry.origins.get(name) == "fedbandit"]
    )
    for name in extra_algorithms or []:
        registry.get(name)  # unknown: the registry's message, with the known names
        if name not in names:
            names.append(name)
    for name in names:
        registry.get(name)
    environments = []
    for env_name, spec in suite.environments.items():
        where = f"suite {suite.name}, environments.{env_name}"
        base = _experiment_data(spec, where)
        base_params: dict[str, dict[str, Any]] = base.pop("params", {}) or {}
        validated = validate_experiment(
            {**copy.deepcopy(base), "name": env_name, "algorithms": [spec.alone.algorithm]},
            source=where,
        )
        instance = build_instance(validated.instance)
        check_horizon = getattr(instance, "check_horizon", None)
        if check_horizon is not None:
            check_horizon(validated.horizon)
        environment = Environment(env_name, spec, instance, validated.horizon, instance.num_clients)

        def params_of(algorithm: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
            return {
                **base_params.get(algorithm, {}),  # noqa: B023 (used inside the loop only)
                **suite.params.get(algorithm, {}),
                **spec.params.get(algorithm, {}),  # noqa: B023
                **(extra or {}),
            }

        for role in REFERENCE_ROLES:
            reference: ReferenceRun = getattr(spec, role)
            registry.get(reference.algorithm)
            params = params_of(reference.algorithm, reference.params)
            config = _run_config(base, env_name, reference.algorithm, params, suite, where)
            reason = _applies(instance, config)
            if reason is not None:
                raise ConfigError(f"{where}.{role}: {reference.algorithm} does not apply: {reason}")
            builtin = registry.origins.get(reference.algorithm) == "fedbandit"
            environment.runs.append(PlannedRun(env_name, role, role, config, builtin))
        for name in names:
            try:
                config = _run_config(base, env_name, name, params_of(name), suite, where)
            except ConfigError as err:
                environment.excluded[name] = str(err)
                continue
            reason = _applies(instance, config)
            if reason is not None:
                environment.excluded[name] = reason
                continue
            builtin = registry.origins.get(name) == "fedbandit"
            environment.runs.append(PlannedRun(env_name, name, "algorithm", config, builtin))
        environments.append(environment)
    for name in extra_algorithms or []:
        if all(name in env.excluded for env in environments):
            reasons = "; ".join(f"{env.name}: {env.excluded[name]}" for env in environments)
            raise ConfigError(
                f"--algorithms {name}: applies to no environment of the suite ({reasons})"
            )
    return environments
