"""Parameter studies: an experiment's ``[sweep]`` table, run as one set of tasks.

A sweep varies config keys (dotted, as for ``--set``): ``grid`` takes the cartesian product of its
lists, ``zip`` varies its lists together (all of one length); the points are the product of the
grid and the zipped tuples. Each point is an ordinary experiment run in ``OUT/points/pNNN/`` (the
harness's files, manifest, resume), and every (point, algorithm, seed) is one task of a single
pool of long-lived worker processes (or of a Ray cluster). ``OUT/sweep.json`` lists the points and
says whether the sweep is complete; ``sweep.csv`` has one row per (point, algorithm, seed) and
``sweep_summary.csv`` one per (point, algorithm).
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedbandit.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from fedbandit.config import ExperimentConfig
    from fedbandit.runspec import RunSpec

#: Columns of sweep.csv after the point's varied keys.
ROW_COLUMNS = [
    "algorithm",
    "seed",
    "final_regret",
    "rounds",
    "uplink_scalars",
    "downlink_scalars",
    "uplink_bytes",
    "downlink_bytes",
    "seconds",
]
EXECUTORS = ("local", "ray")


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


@dataclass(frozen=True)
class SweepPoint:
    """One point: its id (``p000``...), the values of the varied keys, the experiment there."""

    id: str
    values: dict[str, Any]
    config: ExperimentConfig


def parse_grid_option(text: str) -> tuple[str, list[Any]]:
    """``--grid KEY=V1,V2,...``: values read as TOML values (numbers, booleans, strings)."""
    from fedbandit.config import parse_override

    key, sep, raw = text.partition("=")
    if not sep or not key.strip() or not raw.strip():
        raise ConfigError(f"--grid expects KEY=V1,V2,..., got {text!r}")
    return key.strip(), [parse_override(f"v={part.strip()}")[1] for part in raw.split(",")]


def expand(
    config: ExperimentConfig, extra_grid: Sequence[tuple[str, list[Any]]] = ()
) -> list[SweepPoint]:
    """The points of the experiment's sweep (plus ``--grid`` keys), each a validated experiment;
    a key or value the experiment does not take is a ConfigError naming the point's key=value."""
    from fedbandit.config import set_values, validate_experiment

    sweep = config.sweep or SweepConfig()
    grid = dict(sweep.grid)
    for key, listed in extra_grid:
        if key in sweep.together:
            raise ConfigError(f"--grid {key}: the experiment varies it in sweep.zip already")
        grid[key] = listed
    if not grid and not sweep.together:
        raise ConfigError(
            f"experiment {config.name!r} has no [sweep] table; add one or give --grid KEY=V1,V2"
        )
    base = config.model_dump(mode="json", exclude_none=True, by_alias=True)
    base.pop("sweep", None)
    zipped = list(zip(*sweep.together.values(), strict=True)) if sweep.together else [()]
    points: list[SweepPoint] = []
    for index, (grid_values, zip_values) in enumerate(
        itertools.product(itertools.product(*grid.values()), zipped)
    ):
        values = {**dict(zip(grid, grid_values, strict=True))}
        values.update(dict(zip(sweep.together, zip_values, strict=True)))
        data = copy.deepcopy(base)
        set_values(data, [(key.split("."), value) for key, value in values.items()])
        shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
        point_config = validate_experiment(data, source=f"sweep point {shown}")
        for earlier in points:
            if earlier.config == point_config:
                raise ConfigError(
                    f"sweep points {earlier.id} and p{index:03d} ({shown}) are the same "
                    "experiment: a value is listed twice or equals another point's"
                )
        points.append(SweepPoint(f"p{index:03d}", values, point_config))
    return points


def seeds_of(config: ExperimentConfig, seeds: int | None, seed_range: str | None) -> list[int]:
    """The seed indices to run: ``--seed-range A:B`` (A..B-1), ``--seeds N`` or the file's."""
    if seeds is not None and seed_range is not None:
        raise ConfigError("give --seeds N or --seed-range A:B, not both")
    if seed_range is not None:
        first, sep, last = seed_range.partition(":")
        try:
            a, b = int(first), int(last)
        except ValueError:
            raise ConfigError(f"--seed-range expects A:B (integers), got {seed_range!r}") from None
        if not sep or not 0 <= a < b:
            raise ConfigError(f"--seed-range A:B needs 0 <= A < B, got {seed_range!r}")
        return list(range(a, b))
    count = seeds if seeds is not None else config.seeds
    if count < 1:
        raise ConfigError(f"--seeds must be >= 1, got {count}")
    return list(range(count))


def run_sweep(
    config: ExperimentConfig,
    out_dir: Path,
    *,
    extra_grid: Sequence[tuple[str, list[Any]]] = (),
    seeds: list[int] | None = None,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    progress: bool = True,
    force: bool = False,
) -> Path:
    """Run every (point, algorithm, seed) of the sweep not yet done in ``out_dir``; write each
    point's summary and the sweep's tables (``force``: run even above the memory estimate).
    Returns ``out_dir``."""
    from tqdm import tqdm

    from fedbandit.instances import build_instance
    from fedbandit.results import atomic_write_json, read_json
    from fedbandit.runner import (
        check_memory,
        check_out_dir,
        preflight,
        prepare_run_folder,
        run_tasks,
    )
    from fedbandit.runspec import RunSpec, RuntimeOptions

    if executor not in EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if address is not None and executor != "ray":
        raise ConfigError("--address applies to --executor ray")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    points = expand(config, extra_grid)
    seed_list = seeds if seeds is not None else list(range(config.seeds))
    top = max(seed_list) + 1
    every = sum(len(p.config.algorithms) for p in points) * len(seed_list)
    workers = workers or min(os.cpu_count() or 1, every)
    options = RuntimeOptions()
    prepared = []
    for point in points:
        point_config = point.config.model_copy(update={"seeds": top})
        instance = build_instance(point_config.instance)
        preflight(point_config, instance, point_config.algorithms)
        if executor == "local":
            check_memory(point_config, instance, point_config.algorithms, workers, force)
        prepared.append((point, point_config, instance))
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    sweep_path = out_dir / "sweep.json"
    sweep_manifest = _sweep_manifest(config, points, sweep_path)
    atomic_write_json(sweep_path, sweep_manifest)
    tasks: list[tuple[RunSpec, Path]] = []
    for point, point_config, instance in prepared:
        run_dir = out_dir / "points" / point.id
        earlier = run_dir / "manifest.json"
        previous = read_json(earlier).get("seeds", []) if earlier.is_file() else []
        recorded = sorted(set(previous) | set(seed_list))
        manifest = prepare_run_folder(
            point_config, run_dir, workers, options, instance, other_seeds=True, seeds=recorded
        )
        manifest["sweep_point"] = {"id": point.id, "values": point.values}
        atomic_write_json(run_dir / "manifest.json", manifest)
        tasks += [
            (RunSpec(experiment=point_config, algorithm=a, seed=s, options=options), run_dir)
            for a in point_config.algorithms
            for s in seed_list
            if not _done(run_dir, a, s)
        ]
    # Longest first (clients x horizon), so that no worker idles at the end on a big task.
    tasks.sort(key=lambda task: -task[0].experiment.horizon * _clients(task[0].experiment))
    total = every
    if progress:
        state = (
            f"resuming: {total - len(tasks)} of {total} runs already done"
            if (total - len(tasks))
            else f"{total} runs"
        )
        print(f"fedbandit: sweep {out_dir}: {len(points)} points, {state}", file=sys.stderr)
    bar = tqdm(total=len(tasks), desc=config.name, unit="run", disable=not progress)
    started = time.perf_counter()
    try:
        if executor == "ray":
            _run_on_ray(tasks, address, workers, bar)
        else:
            run_tasks(tasks, workers, bar)
    except BaseException:
        from fedbandit.runner import remove_stale_temporaries

        remove_stale_temporaries(out_dir)  # workers have stopped: nothing is being written
        raise
    finally:
        bar.close()
    for point, point_config, _ in prepared:
        _finish_point(out_dir / "points" / point.id, point_config)
    table = collect_table([out_dir / "points" / p.id for p in points], keys=config_keys(points))
    write_tables(table, out_dir)
    sweep_manifest = read_json(sweep_path)
    complete = all(
        read_json(out_dir / "points" / p.id / "manifest.json")["status"] == "complete"
        for p in points
    )
    sweep_manifest.update(
        {
            "status": "complete" if complete else "incomplete",
            "seeds": sorted(set(sweep_manifest.get("seeds", [])) | set(seed_list)),
            "updated": dt.datetime.now().isoformat(timespec="seconds"),
            "wall_seconds_last_run": time.perf_counter() - started,
            "executor": executor,
            "workers": workers,
        }
    )
    atomic_write_json(sweep_path, sweep_manifest)
    return out_dir


def _clients(config: ExperimentConfig) -> int:
    return int(getattr(config.instance, "num_clients", 1) or 1)


def config_keys(points: Sequence[SweepPoint]) -> list[str]:
    return list(points[0].values) if points else []


def _done(run_dir: Path, algorithm: str, seed: int) -> bool:
    from fedbandit.results import seed_done

    return seed_done(run_dir, algorithm, seed)


def _sweep_manifest(
    config: ExperimentConfig, points: list[SweepPoint], path: Path
) -> dict[str, Any]:
    """sweep.json: the experiment, its points; refuses a folder holding another sweep."""
    from fedbandit.results import read_json

    listed = [{"id": p.id, "values": p.values} for p in points]
    data = config.model_dump(mode="json", exclude_none=True, by_alias=True)
    data.pop("seeds", None)
    if path.is_file():
        stored = read_json(path)
        if stored.get("points") != listed or stored.get("config") != data:
            raise ConfigError(
                f"{path.parent} holds another sweep (its points or configuration differ); "
                "choose another --out"
            )
        stored["status"] = "incomplete"
        return dict(stored)
    return {
        "experiment": config.name,
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "status": "incomplete",
        "points": listed,
        "keys": config_keys(points),
        "config": data,
    }


def _run_on_ray(
    tasks: list[tuple[RunSpec, Path]], address: str | None, workers: int, bar: Any
) -> None:
    """Every task on a Ray cluster; each returns its files' texts and the driver writes them."""
    from fedbandit.executors.ray_executor import run_on_ray
    from fedbandit.runner import write_files

    folders = {spec.model_dump_json(): run_dir for spec, run_dir in tasks}

    def on_done(spec: RunSpec, files: dict[str, str]) -> None:
        write_files(folders[spec.model_dump_json()], files)
        bar.update()

    # A local Ray instance (no address) gets --workers CPUs; a cluster uses what it has.
    cpus = workers if address is None else None
    run_on_ray([spec for spec, _ in tasks], on_done, address=address, num_cpus=cpus)


def _finish_point(run_dir: Path, config: ExperimentConfig) -> None:
    """A point's failures, summary and status, as ``fedbandit run`` leaves them."""
    from fedbandit.results import atomic_write_json, read_json, summarize
    from fedbandit.runner import record_failures

    manifest = read_json(run_dir / "manifest.json")
    record_failures(run_dir, config, manifest)
    manifest["updated"] = dt.datetime.now().isoformat(timespec="seconds")
    atomic_write_json(run_dir / "summary.json", summarize(run_dir, manifest))
    atomic_write_json(run_dir / "manifest.json", manifest)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys (lists kept as values)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def varied_keys(configs: Iterable[dict[str, Any]]) -> list[str]:
    """Dotted config keys whose values differ between run folders (name and seeds aside)."""
    flats = [flatten(c) for c in configs]
    keys = sorted({k for f in flats for k in f})
    skip = {"name", "description", "seeds"}
    return [k for k in keys if k not in skip and len({repr(f.get(k)) for f in flats}) > 1]


def collect_table(run_dirs: Sequence[Path], keys: list[str] | None = None) -> pd.DataFrame:
    """One row per (run folder, algorithm, finished seed): the varied config keys (given, or
    those that differ between the folders), final regret, rounds, communication, seconds."""
    import pandas as pd

    from fedbandit.results import completed_seeds, read_json, seed_stem

    manifests = []
    for run_dir in run_dirs:
        path = Path(run_dir) / "manifest.json"
        if not path.is_file():
            raise ConfigError(f"{run_dir} is not a results folder (no manifest.json)")
        manifests.append(read_json(path))
    if keys is None:
        keys = varied_keys(m["config"] for m in manifests)
    rows = []
    for run_dir, manifest in zip(run_dirs, manifests, strict=True):
        flat = flatten(manifest["config"])
        point = manifest.get("sweep_point", {}).get("id", str(run_dir))
        for algorithm in manifest["algorithms"]:
            for seed in completed_seeds(Path(run_dir), algorithm, manifest["seeds"]):
                info = read_json(seed_stem(Path(run_dir), algorithm, seed).with_suffix(".json"))
                totals = info["totals"]
                rows.append(
                    {
                        "point": point,
                        **{key: flat.get(key) for key in keys},
                        "algorithm": algorithm,
                        "seed": seed,
                        "final_regret": info["final_regret"],
                        "rounds": totals["rounds"],
                        "uplink_scalars": totals["uplink_scalars"],
                        "downlink_scalars": totals["downlink_scalars"],
                        "uplink_bytes": totals["uplink_bytes"],
                        "downlink_bytes": totals["downlink_bytes"],
                        "seconds": info["seconds"],
                    }
                )
    return pd.DataFrame(rows, columns=["point", *keys, *ROW_COLUMNS])


def summarize_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per (point, algorithm): mean final regret, its 95% Student-t interval (clipped at 0; none
    for one seed), the number of seeds, and the mean communication."""
    import pandas as pd

    from fedbandit.analysis import interval_or_none

    keys = [c for c in table.columns if c not in ("point", *ROW_COLUMNS)]
    rows = []
    for (point, algorithm), group in table.groupby(["point", "algorithm"], sort=False):
        interval = interval_or_none(group["final_regret"].to_numpy())
        first = group.iloc[0]
        rows.append(
            {
                "point": point,
                **{key: first[key] for key in keys},
                "algorithm": algorithm,
                "final_regret_mean": float(group["final_regret"].mean()),
                "final_regret_ci95_low": None if interval is None else interval[0],
                "final_regret_ci95_high": None if interval is None else interval[1],
                "seeds": len(group),
                "uplink_scalars_mean": float(group["uplink_scalars"].mean()),
                "downlink_scalars_mean": float(group["downlink_scalars"].mean()),
                "uplink_bytes_mean": float(group["uplink_bytes"].mean()),
                "seconds_mean": float(group["seconds"].mean()),
            }
        )
    return pd.DataFrame(rows)


def write_tables(table: pd.DataFrame, out: Path) -> tuple[Path, Path]:
    """sweep.csv and sweep_summary.csv into folder ``out`` (atomically)."""
    from fedbandit.results import atomic_write_csv

    out = Path(out)
    atomic_write_csv(out / "sweep.csv", table)
    atomic_write_csv(out / "sweep_summary.csv", summarize_table(table))
    return out / "sweep.csv", out / "sweep_summary.csv"


@dataclass(frozen=True)
class SweepResults:
    """A sweep folder read back: ``table`` (sweep.csv), ``summary`` (sweep_summary.csv), the
    varied ``keys`` and ``sweep.json``."""

    table: pd.DataFrame
    summary: pd.DataFrame
    keys: list[str]
    manifest: dict[str, Any]
    sweep_dir: Path

    def plot_parameter(self, key: str, ax: Any = None) -> Any:
        from fedbandit.plotting import plot_sweep_parameter

        return plot_sweep_parameter(self.summary, key, ax=ax)

    def plot_tradeoff(self, ax: Any = None, bytes_axis: bool = False) -> Any:
        from fedbandit.plotting import plot_sweep_tradeoff

        return plot_sweep_tradeoff(self.summary, ax=ax, bytes_axis=bytes_axis)


def load_sweep(sweep_dir: str | Path) -> SweepResults:
    """Read a sweep folder made by ``fedbandit sweep`` (the tables are rebuilt from the point
    folders, so an interrupted sweep shows what finished)."""
    from fedbandit.results import read_json

    sweep_dir = Path(sweep_dir)
    path = sweep_dir / "sweep.json"
    if not path.is_file():
        raise ConfigError(f"{sweep_dir} is not a sweep folder (no sweep.json)")
    manifest = read_json(path)
    keys = list(manifest.get("keys", []))
    folders = [sweep_dir / "points" / p["id"] for p in manifest["points"]]
    table = collect_table([f for f in folders if (f / "manifest.json").is_file()], keys=keys)
    return SweepResults(table, summarize_table(table), keys, manifest, sweep_dir)


def is_sweep(folder: Path) -> bool:
    return (Path(folder) / "sweep.json").is_file()
