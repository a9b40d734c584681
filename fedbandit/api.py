"""The Python API: run experiments, read results, look up what is registered.

``fedbandit run`` on the command line and ``fedbandit.run`` here are the same function over the
same harness (``fedbandit.runner.run_experiment``); ``Results`` (``fedbandit.results``) reads a
results folder into pandas frames.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from fedbandit.algorithms.base import AlgorithmSpec, Hyperparameters
from fedbandit.config import (
    ExperimentConfig,
    load_experiment,
    parse_override,
    set_values,
    validate_experiment,
)
from fedbandit.errors import ConfigError, describe_validation
from fedbandit.instances import Instance, InstanceKindSpec
from fedbandit.registry import algorithms, build_instance, instance_kinds
from fedbandit.results import Results, load_results
from fedbandit.rng import run_entropy
from fedbandit.runner import run_experiment
from fedbandit.runs.sweeps import run_sweep as run_points
from fedbandit.runspec import RuntimeOptions
from fedbandit.simulation import SeedResult
from fedbandit.simulation import simulate as simulate_seed
from fedbandit.sweep import SweepResults, load_sweep, seeds_of

__all__ = [
    "Results",
    "get_algorithm",
    "get_instance_kind",
    "list_algorithms",
    "list_instance_kinds",
    "load_results",
    "run",
    "run_sweep",
    "simulate",
]


def _experiment(
    experiment: str | Path | ExperimentConfig | Mapping[str, Any],
    overrides: Sequence[str] | Mapping[str, Any] | None,
) -> ExperimentConfig:
    """An experiment from a name, a TOML path, a config or a dict, with ``overrides`` applied
    (``key=value`` strings as for ``--set``, or a dict of dotted keys to values)."""
    texts: list[str] = []
    pairs: list[tuple[list[str], Any]] = []
    if isinstance(overrides, Mapping):
        pairs = [(str(key).split("."), value) for key, value in overrides.items()]
    elif overrides is not None:
        if isinstance(overrides, str):
            raise ConfigError(f"overrides must be a list of key=value strings, got {overrides!r}")
        texts = list(overrides)
        pairs = [parse_override(text) for text in texts]
    if isinstance(experiment, (str, Path)):
        config = load_experiment(str(experiment), texts)
        if not isinstance(overrides, Mapping):
            return config
        data = config.model_dump(mode="json", exclude_none=True)
        source = str(experiment)
    elif isinstance(experiment, ExperimentConfig):
        data, source = experiment.model_dump(mode="json", exclude_none=True), "<config>"
    elif isinstance(experiment, Mapping):
        data, source = dict(experiment), "<config>"
    else:
        raise ConfigError(
            "experiment must be a name, a TOML path, an ExperimentConfig or a dict, "
            f"got {type(experiment).__name__}"
        )
    set_values(data, pairs)
    return validate_experiment(data, source=source)


def run(
    experiment: str | Path | ExperimentConfig | Mapping[str, Any],
    *,
    seeds: int | None = None,
    algorithms: Sequence[str] | None = None,
    runtime: str | RuntimeOptions = "local",
    out: str | Path | None = None,
    workers: int | None = None,
    overrides: Sequence[str] | Mapping[str, Any] | None = None,
    progress: bool = True,
    force: bool = False,
) -> Results:
    """Run an experiment and return its results.

    ``experiment`` is a name (``fedbandit list``), a TOML path, an ``ExperimentConfig`` or a
    dict. ``seeds`` overrides the number of seeds, ``algorithms`` runs a subset of the
    experiment's algorithms. ``runtime`` is a runtime name (``local``, ``flower-sim``) or
    ``RuntimeOptions`` (for ``flower``: the SuperLink and TLS options). With ``out`` the results
    folder is written (and an existing one resumed) with plots, as by ``fedbandit run``; with
    ``out=None`` the run is made in a temporary folder that is read into memory and deleted
    (also on a deployment: its results come back through the Flower run's log).
    A run whose memory estimate exceeds the available memory is refused unless ``force``.
    """
    config = _experiment(experiment, overrides)
    if config.sweep is not None:
        raise ConfigError(
            f"experiment {config.name!r} is a study (it has a [sweep] table): run it with "
            "fedbandit.run_sweep"
        )
    if seeds is not None:
        config = _experiment(config, {"seeds": seeds})
    options = runtime if isinstance(runtime, RuntimeOptions) else RuntimeOptions.of(runtime=runtime)
    selected = list(algorithms) if algorithms is not None else None
    if out is not None:
        run_dir = run_experiment(
            config, Path(out), workers, progress, options, selected, force=force
        )
        return load_results(run_dir)
    with tempfile.TemporaryDirectory(prefix="fedbandit-") as folder:
        run_dir = run_experiment(
            config, Path(folder), workers, progress, options, selected, plots=False, force=force
        )
        results = load_results(run_dir)
    return Results(
        results.config,
        results.manifest,
        results.curves,
        results.communication,
        results.summary,
        run_dir=None,
    )


def simulate(
    instance: Instance | BaseModel | Mapping[str, Any],
    algorithm: str,
    horizon: int,
    seed: int = 0,
    params: Hyperparameters | Mapping[str, Any] | None = None,
    *,
    base_seed: int = 0,
    group_size: int | None = None,
) -> SeedResult:
    """One seed of one algorithm, in memory.

    ``instance`` is a built instance, or the parameters of an instance kind (a dict with a
    ``kind`` key, as in an experiment's ``[instance]`` table, or its parameter model).
    ``params`` are the algorithm's hyperparameters (its model, or a dict). The reward streams are
    those of seed index ``seed`` of an experiment whose ``base_seed`` is ``base_seed``: entropy
    ``[base_seed, seed]`` (``fedbandit.rng.run_entropy``), so ``simulate(..., seed=k)`` gives
    exactly the ``runs/ALGO/seed_k`` files of ``fedbandit run`` on the same instance and horizon.
    """
    if isinstance(instance, Mapping):
        instance = _instance_params(dict(instance))
    if isinstance(instance, BaseModel):
        instance = build_instance(instance)
    if not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ConfigError(f"horizon must be a positive integer, got {horizon!r}")
    entropy = run_entropy(base_seed, seed)
    return simulate_seed(instance, algorithm, int(horizon), entropy, params, group_size)


def _instance_params(data: dict[str, Any]) -> BaseModel:
    spec = instance_kinds().get(str(data.get("kind")))
    try:
        return spec.params.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"instance: {describe_validation(err, prefix='instance.')}") from None


def get_algorithm(name: str) -> AlgorithmSpec:
    """The registered algorithm ``name`` (built in or a plugin's); ``ConfigError`` if unknown."""
    return algorithms().get(name)


def get_instance_kind(kind: str) -> InstanceKindSpec:
    """The registered instance kind ``kind``; ``ConfigError`` if unknown."""
    return instance_kinds().get(kind)


def list_algorithms() -> list[AlgorithmSpec]:
    """Every registered algorithm, by name: ``.description`` and ``.params`` (the pydantic
    hyperparameter model; ``.params.model_json_schema()`` is its schema)."""
    registry = algorithms()
    return [registry.entries[name] for name in registry]


def list_instance_kinds() -> list[InstanceKindSpec]:
    """Every registered instance kind, by kind: ``.description`` and ``.params``."""
    registry = instance_kinds()
    return [registry.entries[kind] for kind in registry]


def run_sweep(
    experiment: str | Path | ExperimentConfig | Mapping[str, Any],
    *,
    grid: Mapping[str, Sequence[Any]] | None = None,
    seeds: int | None = None,
    seed_range: tuple[int, int] | None = None,
    out: str | Path,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    overrides: Sequence[str] | Mapping[str, Any] | None = None,
    progress: bool = True,
    force: bool = False,
    algorithms: Sequence[str] | None = None,
) -> SweepResults:
    """Run a parameter study (``fedbandit sweep``): the experiment's ``[sweep]`` table plus
    ``grid`` (dotted key -> values), seeds 0..``seeds``-1 or ``seed_range`` (A, B), on ``executor``
    ``local`` (long-lived worker processes) or ``ray`` (``address``: ``auto``, ``HOST:PORT`` or
    None to start a local Ray); ``algorithms`` runs only those of the experiment's algorithms
    (as in ``run``). The folder ``out`` is written and resumed like a run folder."""
    config = _experiment(experiment, overrides)
    shard = f"{seed_range[0]}:{seed_range[1]}" if seed_range is not None else None
    run_points(
        config,
        Path(out),
        extra_grid=[(key, list(values)) for key, values in (grid or {}).items()],
        seeds=seeds_of(config, seeds, shard),
        workers=workers,
        executor=executor,
        address=address,
        progress=progress,
        force=force,
        algorithms=algorithms,
    )
    return load_sweep(out)
