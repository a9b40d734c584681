"""The files of a results folder: every file written to a temporary name and renamed (whole or
absent), one seed's files (the ``.json`` last: it marks the seed done), and where a seed's files
are and whether it finished."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedbandit.analysis import curve_grid
from fedbandit.config import ExperimentConfig, validate_experiment
from fedbandit.results.replay import (
    hit_curve,
    is_replay,
)

if TYPE_CHECKING:
    from fedbandit.simulation import SeedResult


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_text(data: Any) -> str:
    """The JSON text fedbandit writes (indented, NumPy values as plain numbers)."""
    return json.dumps(data, indent=2, sort_keys=False, default=_jsonable) + "\n"


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json_text(data))


def atomic_write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write_text(path, frame.to_csv(index=False))


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def seed_stem(run_dir: Path, algorithm: str, seed: int) -> Path:
    return run_dir / "runs" / algorithm / f"seed_{seed}"


def seed_status(run_dir: Path, algorithm: str, seed: int) -> str | None:
    """ "complete", "aborted" (lost clients stopped it; rerun on resume), or None (not run)."""
    path = seed_stem(run_dir, algorithm, seed).with_suffix(".json")
    if not path.is_file():
        return None
    return str(read_json(path).get("status", "complete"))


def seed_done(run_dir: Path, algorithm: str, seed: int) -> bool:
    return seed_status(run_dir, algorithm, seed) == "complete"


def completed_seeds(run_dir: Path, algorithm: str, seeds: list[int]) -> list[int]:
    return [s for s in seeds if seed_done(run_dir, algorithm, s)]


def seed_files(
    config: ExperimentConfig | dict[str, Any], seed: int, result: SeedResult
) -> dict[str, str]:
    """The files of one finished (algorithm, seed) as texts, by path relative to the run folder,
    in the order they are written: the ``.json`` last (it marks the seed done).

    The regret curve is stored at the steps of ``analysis.curve_grid(T)`` (every 2^k, T/2, T and
    about 1,500 points spaced evenly on a log and on a linear scale), not at every step."""
    if not isinstance(config, ExperimentConfig):
        config = validate_experiment(config)
    algorithm = result.algorithm
    stem = seed_stem(Path("."), algorithm, seed)
    grid = curve_grid(config.horizon)
    curve = result.regret.mean_cumulative_regret()
    if len(curve) == 0:  # every client was lost before reporting
        curve = np.full(config.horizon, np.nan)
    clients = pd.DataFrame(
        {
            "client_id": result.regret.client_ids,
            "regret": result.regret.client_regret,
            "pulls": result.regret.client_pulls,
        }
    )
    info: dict[str, Any] = {
        "algorithm": algorithm,
        "seed": seed,
        "seconds": result.seconds,
        **({} if result.compile_seconds is None else {"compile_seconds": result.compile_seconds}),
        "totals": result.totals,
        "final_regret": float(curve[-1]),
        "status": result.status,
        "failure": result.failure,
        "dropped": {str(client): round_ for client, round_ in result.dropped.items()},
        "clients_reported": len(result.regret.client_ids),
    }
    if result.data_files:
        info["data_files"] = dict(result.data_files)
    if result.report:
        info["report"] = dict(result.report)
    regret = pd.DataFrame({"t": grid, "regret": curve[grid - 1]})
    if is_replay(config):
        hits = hit_curve(result.regret, config.horizon)
        if hits is None:
            regret["reward"] = np.nan
            info["final_reward"] = None
        else:
            regret["reward"] = hits[grid - 1]
            info["final_reward"] = float(hits[-1])
    return {
        str(stem.with_suffix(".regret.csv")): regret.to_csv(index=False),
        str(stem.with_suffix(".comm.csv")): result.communication.to_csv(index=False),
        str(stem.with_suffix(".clients.csv")): clients.to_csv(index=False),
        str(stem.with_suffix(".json")): json_text(info),
    }


def write_files(run_dir: Path, files: dict[str, str]) -> None:
    """Write ``seed_files`` output into ``run_dir``, each file atomically, in order."""
    for relative, text in files.items():
        atomic_write_text(Path(run_dir) / relative, text)


def write_seed_result(
    config: ExperimentConfig | dict[str, Any], run_dir: Path, seed: int, result: SeedResult
) -> None:
    """Write the files of one finished (algorithm, seed) (``seed_files``), the ``.json`` last."""
    write_files(run_dir, seed_files(config, seed, result))


def remove_stale_temporaries(run_dir: Path) -> None:
    """Delete temporary files an interrupted writer left behind (final files are never partial:
    they appear only by an atomic rename)."""
    for stale in run_dir.rglob(".*.tmp*"):
        stale.unlink(missing_ok=True)
