"""The results folder: atomic writes, the manifest, per-seed files, and the summary.

Layout of ``results/NAME/<timestamp>/``::

    config.toml                  the resolved experiment (after --set overrides)
    manifest.json                versions, git commit, seeds, instance facts, status
    runs/ALGO/seed_K.regret.csv  t, regret: mean per-client cumulative regret R(t)/M
    runs/ALGO/seed_K.comm.csv    round, kind, direction, t, messages, scalars, bytes
    runs/ALGO/seed_K.clients.csv client_id, regret, pulls (at the horizon)
    runs/ALGO/seed_K.json        totals and timing; written last: marks the seed done
    summary.json                 per algorithm: final regret, CI, communication, checkpoints,
                                 R(T)/R(T/2) averaged over seeds
    plots/regret.png, plots/communication.png

Every file is written to a temporary name and renamed, so a file is whole or absent.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedbandit.analysis import INTERVAL, checkpoint_times, interval_or_none

PACKAGES = ("fedbandit", "numpy", "scipy", "cvxpy", "clarabel", "flwr", "pandas", "matplotlib")


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


@functools.cache
def package_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


@functools.cache
def git_commit() -> str | None:
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine_facts() -> dict[str, Any]:
    return {"platform": platform.platform(), "cpus": os.cpu_count()}


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def load_curves(run_dir: Path, algorithm: str, seeds: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Regret curves of the completed seeds: (t (n,), curves (seeds, n))."""
    frames = [
        pd.read_csv(seed_stem(run_dir, algorithm, s).with_suffix(".regret.csv")) for s in seeds
    ]
    t = frames[0]["t"].to_numpy()
    for frame in frames[1:]:
        if not np.array_equal(frame["t"].to_numpy(), t):
            raise ValueError(f"{run_dir}: seeds of {algorithm!r} are stored on different grids")
    return t, np.stack([f["regret"].to_numpy() for f in frames])


def completed_seeds(run_dir: Path, algorithm: str, seeds: list[int]) -> list[int]:
    return [s for s in seeds if seed_done(run_dir, algorithm, s)]


def summarize(run_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """summary.json: stable keys, one entry per algorithm name plus experiment, horizon, seeds."""
    horizon = int(manifest["horizon"])
    summary: dict[str, Any] = {
        "experiment": manifest["experiment"],
        "horizon": horizon,
        "seeds": manifest["seeds"],
        "status": manifest["status"],
        "interval": INTERVAL + " (lower end clipped at 0; none for a single seed)",
        "units": {
            "final_regret": "R(T)/M: cumulative regret per client",
            "uplink_scalars, downlink_scalars, *_bytes, *_messages": "whole run, all clients",
            "*_per_client": "whole run, per client",
        },
    }
    for algorithm in manifest["algorithms"]:
        seeds = completed_seeds(run_dir, algorithm, manifest["seeds"])
        if not seeds:
            continue
        t, curves = load_curves(run_dir, algorithm, seeds)
        infos = [read_json(seed_stem(run_dir, algorithm, s).with_suffix(".json")) for s in seeds]
        final = curves[:, -1]
        interval = interval_or_none(final)
        entry: dict[str, Any] = {
            "final_regret_mean": float(np.mean(final)),
            #: None with a single seed (no interval); see "interval" for how it is made.
            "final_regret_ci95": list(interval) if interval is not None else None,
            "seconds_per_seed": float(np.mean([i["seconds"] for i in infos])),
            "seeds_completed": seeds,
        }
        for key in (
            "rounds",
            "uplink_scalars",
            "downlink_scalars",
            "uplink_bytes",
            "downlink_bytes",
            "uplink_messages",
            "downlink_messages",
        ):
            values = [i["totals"][key] for i in infos]
            entry[key] = int(values[0]) if len(set(values)) == 1 else float(np.mean(values))
        clients = int(manifest["instance"]["num_clients"])
        for key in ("uplink_scalars", "downlink_scalars"):
            entry[f"{key}_per_client"] = float(entry[key]) / clients
        half = int(np.searchsorted(t, horizon // 2))
        if t[half] == horizon // 2 and np.all(curves[:, half] > 0):
            entry["regret_growth_last_doubling"] = float(np.mean(curves[:, -1] / curves[:, half]))
        index = np.searchsorted(t, checkpoint_times(horizon))
        entry["regret_checkpoints"] = {
            str(int(t[i])): float(curves[:, i].mean()) for i in index if i < len(t)
        }
        summary[algorithm] = entry
    return summary
