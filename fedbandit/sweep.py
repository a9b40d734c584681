"""Parameter studies: the points of an experiment's ``[sweep]`` table, and sweep folders read back.

A sweep varies config keys (dotted, as for ``--set``): ``grid`` takes the cartesian product of its
lists, ``zip`` varies its lists together (all of one length); the points are the product of the
grid and the zipped tuples. Each point is an ordinary experiment run in ``OUT/points/pNNN/`` (the
harness's files, manifest, resume), and every (point, algorithm, seed) is one task of a single
pool of long-lived worker processes (or of a Ray cluster): ``fedbandit.runs.sweeps.run_sweep``.
``OUT/sweep.json`` lists the points and says whether the sweep is complete; ``sweep.csv`` has one
row per (point, algorithm, seed) and ``sweep_summary.csv`` one per (point, algorithm).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from fedbandit.analysis import interval_or_none
from fedbandit.config import (
    ExperimentConfig,
    SweepConfig,
    parse_override,
    set_values,
    validate_experiment,
)
from fedbandit.errors import ConfigError
from fedbandit.plotting import plot_sweep_parameter, plot_sweep_tradeoff, save_figure
from fedbandit.results.files import atomic_write_csv, completed_seeds, read_json, seed_stem

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: Columns of sweep.csv after the point's varied keys.
ROW_COLUMNS = [
    "algorithm",
    "seed",
    "final_regret",
    "rounds",
    "statistics_rounds",
    "uplink_scalars",
    "downlink_scalars",
    "uplink_bytes",
    "downlink_bytes",
    "seconds",
]


@dataclass(frozen=True)
class SweepPoint:
    """One point: its id (``p000``...), the values of the varied keys, the experiment there."""

    id: str
    values: dict[str, Any]
    config: ExperimentConfig


def parse_grid_option(text: str) -> tuple[str, list[Any]]:
    """``--grid KEY=V1,V2,...``: values read as TOML values (numbers, booleans, strings)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip() or not raw.strip():
        raise ConfigError(f"--grid expects KEY=V1,V2,..., got {text!r}")
    return key.strip(), [parse_override(f"v={part.strip()}")[1] for part in raw.split(",")]


def expand(
    config: ExperimentConfig, extra_grid: Sequence[tuple[str, list[Any]]] = ()
) -> list[SweepPoint]:
    """The points of the experiment's sweep (plus ``--grid`` keys), each a validated experiment;
    a key or value the experiment does not take is a ConfigError naming the point's key=value."""
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


def config_keys(points: Sequence[SweepPoint]) -> list[str]:
    return list(points[0].values) if points else []


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
    those that differ between the folders), final regret, rounds (and of them the statistics
    rounds: ``CommunicationLedger.totals``), communication, seconds."""
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
                        # None in seeds recorded before the bookkeeping flags were told apart
                        "statistics_rounds": totals.get("statistics_rounds"),
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

    def plot_parameter(self, key: str, ax: Axes | None = None) -> Axes:
        others = [k for k in varying_keys(self.summary, self.keys) if k != key]
        return plot_sweep_parameter(self.summary, key, ax=ax, others=others)

    def plot_tradeoff(self, ax: Axes | None = None, bytes_axis: bool = False) -> Axes:
        return plot_sweep_tradeoff(self.summary, ax=ax, bytes_axis=bytes_axis)


def load_sweep(sweep_dir: str | Path) -> SweepResults:
    """Read a sweep folder made by ``fedbandit sweep`` (the tables are rebuilt from the point
    folders, so an interrupted sweep shows what finished)."""
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


def varying_keys(summary: pd.DataFrame, keys: Sequence[str]) -> list[str]:
    """The ``keys`` whose values differ between the rows of a sweep's summary."""
    return [
        key for key in keys if key in summary and summary[key].astype(str).nunique(dropna=False) > 1
    ]


def plot_sweep(sweep_dir: Path) -> list[Path]:
    """plots/regret_vs_KEY.png for every key whose finished points hold two or more values (a key
    listed with one value would average every other key into one column of points) and
    plots/regret_vs_communication.png, from the sweep folder's files alone."""
    from matplotlib.figure import Figure  # matplotlib loads in a fifth of a second: when drawing

    results = load_sweep(sweep_dir)
    if results.table.empty:
        raise ConfigError(f"{sweep_dir}: no run of the sweep has finished yet: nothing to plot")
    out = Path(sweep_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    varied = varying_keys(results.summary, results.keys)
    for key in varied:
        figure = Figure(figsize=(7.5, 4.5))
        others = [k for k in varied if k != key]
        plot_sweep_parameter(results.summary, key, figure.gca(), others=others)
        name = key.replace("/", "_")
        paths.append(save_figure(figure, out / f"regret_vs_{name}.png"))
    figure = Figure(figsize=(7.5, 4.5))
    plot_sweep_tradeoff(results.summary, figure.gca())
    paths.append(save_figure(figure, out / "regret_vs_communication.png"))
    return paths
