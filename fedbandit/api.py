"""The Python API: run experiments, read results, look up what is registered.

``fedbandit run`` on the command line and ``fedbandit.run`` here are the same function over the
same harness (``runner.run_experiment``); ``Results`` reads a results folder into pandas frames.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel

from fedbandit.config import (
    ExperimentConfig,
    load_experiment,
    parse_override,
    set_values,
    validate_experiment,
)
from fedbandit.errors import ConfigError, DataError
from fedbandit.registry import InstanceKindSpec, algorithms, instance_kinds

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes

    from fedbandit.algorithms.base import AlgorithmSpec, Hyperparameters
    from fedbandit.instances import Instance
    from fedbandit.runspec import RuntimeOptions
    from fedbandit.simulation import SeedResult
    from fedbandit.sweep import SweepResults


@dataclass(frozen=True)
class Results:
    """The results of one experiment, in memory.

    - ``curves``: one row per (algorithm, seed, t): ``regret`` is the per-client cumulative
      regret R(t)/M, stored at the steps of ``fedbandit.analysis.curve_grid(T)`` (every 2^k,
      T/2, T, and about 1,500 steps spaced evenly on a log and on a linear scale).
    - ``communication``: one row per (algorithm, seed, round, direction): ``kind``, ``t``
      (pulls per client when the round happened), ``messages``, ``scalars``, ``bytes`` (whole
      run, all clients).
    - ``summary``: one row per algorithm, the columns of ``summary.json``.
    Only seeds that finished (status complete) are included; ``manifest["status"]`` says whether
    the run is complete.
    """

    config: ExperimentConfig
    manifest: dict[str, Any]
    curves: pd.DataFrame
    communication: pd.DataFrame
    summary: pd.DataFrame
    #: The results folder, or None for a run made in memory (``fedbandit.run(out=None)``).
    run_dir: Path | None = None

    @property
    def complete(self) -> bool:
        return self.manifest.get("status") == "complete"

    def final_regret(self) -> pd.DataFrame:
        """R(T)/M per (algorithm, seed)."""
        last = self.curves.sort_values("t").groupby(["algorithm", "seed"], sort=False).tail(1)
        return last[["algorithm", "seed", "regret"]].sort_values(["algorithm", "seed"])

    def plot_regret(self, ax: Axes | None = None, log_x: bool = False) -> Axes:
        """R(t)/M against t per algorithm: mean over seeds and a 95% Student-t band."""
        from fedbandit.plotting import plot_regret_curves

        return plot_regret_curves(self.curves, ax=ax, log_x=log_x, title=self._title())

    def plot_communication(self, ax: Axes | None = None) -> Axes:
        """Cumulative uplink (solid) and downlink (dashed) scalars per client against t."""
        from fedbandit.plotting import plot_communication_frame

        return plot_communication_frame(
            self.communication,
            int(self.manifest["instance"]["num_clients"]),
            ax=ax,
            algorithms=self.config.algorithms,
        )

    def _title(self) -> str:
        """Experiment, sizes, horizon, noise and seeds (and whether the run is incomplete)."""
        facts = self.manifest.get("instance", {})
        counts = self.curves.groupby("algorithm")["seed"].nunique()
        low, high = (int(counts.min()), int(counts.max())) if len(counts) else (0, 0)
        if high == 0:
            shown = "no finished seed"
        elif low != high:
            shown = f"{low}-{high} seeds"
        else:
            shown = f"{low} seed" if low == 1 else f"{low} seeds"
        sizes = ", ".join(
            f"{label}={facts[key]:g}"
            if isinstance(facts.get(key), float)
            else f"{label}={facts[key]}"
            for label, key in (("M", "num_clients"), ("K", "num_arms"), ("d", "dim"))
            if key in facts
        )
        sigma = facts.get("noise_sigma")
        noise = f", sigma={sigma:g}" if isinstance(sigma, (int, float)) else ""
        status = "" if self.complete else " [incomplete]"
        return f"{self.config.name}{status}\n{sizes}, T={self.config.horizon}{noise}, {shown}"


def load_results(run_dir: str | Path) -> Results:
    """Read a results folder (made by ``fedbandit run`` or ``fedbandit.run(out=...)``)."""
    import pandas as pd

    from fedbandit.results import completed_seeds, read_json, seed_stem

    run_dir = Path(run_dir)
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise ConfigError(f"{run_dir} is not a results folder (no manifest.json)")
    manifest = read_json(manifest_path)
    config = validate_experiment(manifest["config"], source=str(manifest_path))
    curves, communication = [], []
    for algorithm in manifest["algorithms"]:
        for seed in completed_seeds(run_dir, algorithm, manifest["seeds"]):
            stem = seed_stem(run_dir, algorithm, seed)
            curve = _read_table(stem.with_suffix(".regret.csv"), ["t", "regret"])
            curves.append(curve.assign(algorithm=algorithm, seed=seed))
            comm = _read_table(
                stem.with_suffix(".comm.csv"), ["round", "direction", "t", "scalars"]
            )
            communication.append(comm.assign(algorithm=algorithm, seed=seed))
    curve_columns = ["algorithm", "seed", "t", "regret"]
    comm_columns = ["algorithm", "seed", "round", "kind", "direction", "t", "messages"]
    comm_columns += ["scalars", "bytes"]
    summary_path = run_dir / "summary.json"
    summary_data = read_json(summary_path) if summary_path.is_file() else {}
    rows = [
        {"algorithm": name, **entry}
        for name, entry in summary_data.items()
        if isinstance(entry, dict) and "final_regret_mean" in entry
    ]
    return Results(
        config=config,
        manifest=manifest,
        curves=_frame(curves, curve_columns),
        communication=_frame(communication, comm_columns),
        summary=pd.DataFrame(rows),
        run_dir=run_dir,
    )


def _read_table(path: Path, columns: list[str]) -> pd.DataFrame:
    """A result CSV with ``columns`` of finite numbers (``direction`` aside); a DataError naming
    the file otherwise (a hand-edited or truncated file)."""
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as err:  # pandas' parser errors are ValueErrors
        raise DataError(f"{path}: not a readable result table ({err})") from None
    if missing := [c for c in columns if c not in frame.columns]:
        raise DataError(f"{path}: columns {missing} are missing (a hand-edited file?)")
    numeric = [c for c in columns if c != "direction"]
    values = frame[numeric].apply(pd.to_numeric, errors="coerce")
    if (values.isna() & frame[numeric].notna()).to_numpy().any():  # text where numbers belong
        raise DataError(f"{path}: non-numeric values in {numeric} (a hand-edited file?)")
    if "t" in frame and len(frame) and not frame["t"].is_monotonic_increasing:
        raise DataError(f"{path}: the t column is not increasing (a hand-edited file?)")
    return frame


def _frame(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    import pandas as pd

    if not parts:
        return pd.DataFrame(columns=columns)
    frame = pd.concat(parts, ignore_index=True)
    return frame[columns + [c for c in frame.columns if c not in columns]]


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
    ``out=None`` the run is made in a temporary folder that is read into memory and deleted.
    A run whose memory estimate exceeds the available memory is refused unless ``force``.
    """
    from fedbandit.runner import run_experiment
    from fedbandit.runspec import RuntimeOptions

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
    if options.runtime == "flower":
        raise ConfigError("runtime 'flower' writes its results on the SuperLink host: give out=")
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
    from fedbandit.instances import build_instance
    from fedbandit.rng import run_entropy
    from fedbandit.simulation import simulate as simulate_seed

    if isinstance(instance, Mapping):
        instance = _instance_params(dict(instance))
    if isinstance(instance, BaseModel):
        instance = build_instance(instance)
    if not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ConfigError(f"horizon must be a positive integer, got {horizon!r}")
    entropy = run_entropy(base_seed, seed)
    return simulate_seed(instance, algorithm, int(horizon), entropy, params, group_size)


def _instance_params(data: dict[str, Any]) -> BaseModel:
    from pydantic import ValidationError

    from fedbandit.config import describe_validation

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
) -> SweepResults:
    """Run a parameter study (``fedbandit sweep``): the experiment's ``[sweep]`` table plus
    ``grid`` (dotted key -> values), seeds 0..``seeds``-1 or ``seed_range`` (A, B), on ``executor``
    ``local`` (long-lived worker processes) or ``ray`` (``address``: ``auto``, ``HOST:PORT`` or
    None to start a local Ray). The folder ``out`` is written and resumed like a run folder."""
    from fedbandit.sweep import load_sweep, seeds_of
    from fedbandit.sweep import run_sweep as run_points

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
    )
    return load_sweep(out)
