"""Run a named experiment: every (algorithm, seed) pair, in parallel processes, resumable.

Seeds are independent tasks whose randomness depends only on (base_seed, seed index, client id),
so the results are identical whatever the number of workers. A finished task's files are written
atomically and its ``.json`` last; rerunning with the same ``--out`` skips finished tasks. The
manifest says ``incomplete`` until every task is done.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import tomli_w
from tqdm import tqdm

from fedbandit.analysis import curve_grid
from fedbandit.config import ConfigError, ExperimentConfig, validate_experiment
from fedbandit.instances import build_instance
from fedbandit.results import (
    atomic_write_csv,
    atomic_write_json,
    atomic_write_text,
    git_commit,
    machine_facts,
    package_versions,
    read_json,
    seed_done,
    seed_stem,
    summarize,
)
from fedbandit.rng import run_entropy
from fedbandit.simulation import SeedResult, simulate
from fedbandit.threads import single_threaded_blas

if TYPE_CHECKING:
    from fedbandit.flower.deployment import Submission

RESULTS_ROOT = Path("results")
RUNTIMES = ("local", "flower-sim", "flower")


def default_out_dir(config: ExperimentConfig) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return RESULTS_ROOT / config.name / stamp


def config_dict(config: ExperimentConfig) -> dict[str, Any]:
    return config.model_dump(mode="json", exclude_none=True)


def run_task(
    config_data: dict[str, Any],
    algorithm: str,
    seed: int,
    run_dir: str,
    runtime: str = "local",
    nodes: int | None = None,
    deployment: Submission | None = None,
    job_options: dict[str, Any] | None = None,
) -> float:
    """Run one (algorithm, seed) on ``runtime`` and write its files; returns its seconds.

    On ``flower`` the ServerApp of a deployment (``deployment``) writes the files."""
    single_threaded_blas()
    config = validate_experiment(config_data)
    entropy = run_entropy(config.base_seed, seed)
    if runtime == "flower":
        from fedbandit.flower.deployment import run_seed

        if deployment is None:
            raise ConfigError("--runtime flower needs --superlink HOST:PORT")
        started = time.perf_counter()
        run_seed(deployment, config_data, algorithm, seed, entropy, Path(run_dir), job_options)
        return time.perf_counter() - started
    if runtime == "flower-sim":
        from fedbandit.flower.simulation import simulate_flower

        result = simulate_flower(config_data, algorithm, entropy, nodes, job_options=job_options)
    else:
        result = simulate(
            build_instance(config.instance),
            algorithm,
            config.horizon,
            entropy,
            config.hyperparameters(algorithm),
            config.group_size,
        )
    write_seed_result(config_data, Path(run_dir), seed, result)
    return result.seconds


def write_seed_result(
    config_data: dict[str, Any], run_dir: Path, seed: int, result: SeedResult
) -> None:
    """The files of one finished (algorithm, seed), the ``.json`` last (it marks the seed done)."""
    config = validate_experiment(config_data)
    algorithm = result.algorithm
    stem = seed_stem(run_dir, algorithm, seed)
    grid = curve_grid(config.horizon)
    curve = result.regret.mean_cumulative_regret()
    if len(curve) == 0:  # every client was lost before reporting
        curve = np.full(config.horizon, np.nan)
    atomic_write_csv(
        stem.with_suffix(".regret.csv"), pd.DataFrame({"t": grid, "regret": curve[grid - 1]})
    )
    atomic_write_csv(stem.with_suffix(".comm.csv"), result.communication)
    atomic_write_csv(
        stem.with_suffix(".clients.csv"),
        pd.DataFrame(
            {
                "client_id": result.regret.client_ids,
                "regret": result.regret.client_regret,
                "pulls": result.regret.client_pulls,
            }
        ),
    )
    atomic_write_json(
        stem.with_suffix(".json"),
        {
            "algorithm": algorithm,
            "seed": seed,
            "seconds": result.seconds,
            "totals": result.totals,
            "final_regret": float(curve[-1]),
            "status": result.status,
            "failure": result.failure,
            "dropped": {str(client): round_ for client, round_ in result.dropped.items()},
            "clients_reported": len(result.regret.client_ids),
        },
    )


def remove_stale_temporaries(run_dir: Path) -> None:
    """Delete temporary files an interrupted writer left behind (final files are never partial:
    they appear only by an atomic rename)."""
    for stale in run_dir.rglob(".*.tmp*"):
        stale.unlink(missing_ok=True)


def _prepare(
    config: ExperimentConfig, run_dir: Path, workers: int, runtime: str, nodes: int | None
) -> dict[str, Any]:
    """Create or reopen the run folder; refuses to mix two different experiments in one folder."""
    config_path = run_dir / "config.toml"
    manifest_path = run_dir / "manifest.json"
    current = config_dict(config)
    if manifest_path.exists():
        manifest = read_json(manifest_path)
        stored = manifest.get("config", {})
        differs = {
            k
            for k in set(stored) | set(current)
            if k != "seeds" and stored.get(k) != current.get(k)
        }
        if differs:
            raise ConfigError(
                f"{run_dir} holds a run of a different configuration (keys differing: "
                f"{', '.join(sorted(differs))}); choose another --out"
            )
        remove_stale_temporaries(run_dir)
    else:
        manifest = {"created": dt.datetime.now().isoformat(timespec="seconds")}
    instance = build_instance(config.instance)
    manifest.update(
        {
            "experiment": config.name,
            "status": "incomplete",
            "updated": dt.datetime.now().isoformat(timespec="seconds"),
            "algorithms": config.algorithms,
            "horizon": config.horizon,
            "seeds": list(range(config.seeds)),
            "base_seed": config.base_seed,
            "workers": workers,
            "runtime": runtime,
            "nodes": nodes,
            "group_size": config.group_size,
            "instance": instance.summary(),
            "git_commit": git_commit(),
            "packages": package_versions(),
            "machine": machine_facts(),
            "config": current,
        }
    )
    atomic_write_text(config_path, tomli_w.dumps(current))
    atomic_write_json(manifest_path, manifest)
    return manifest


def run_experiment(
    config: ExperimentConfig,
    out_dir: Path | None = None,
    workers: int | None = None,
    progress: bool = True,
    runtime: str = "local",
    nodes: int | None = None,
    deployment: Submission | None = None,
    job_options: dict[str, Any] | None = None,
) -> Path:
    """Run every (algorithm, seed) not yet done in ``out_dir`` on ``runtime``: ``local``,
    ``flower-sim`` on ``nodes`` virtual SuperNodes, or ``flower`` on the SuperLink of
    ``deployment`` (one Flower run per seed; ``job_options`` are timeouts and the failure
    policy); returns the run folder."""
    if runtime not in RUNTIMES:
        raise ConfigError(f"unknown runtime {runtime!r}; known: {', '.join(RUNTIMES)}")
    run_dir = Path(out_dir) if out_dir is not None else default_out_dir(config)
    if runtime in ("flower-sim", "flower"):
        workers = 1  # the nodes do the parallel work
    workers = workers or min(os.cpu_count() or 1, config.seeds * len(config.algorithms))
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    manifest = _prepare(config, run_dir, workers, runtime, nodes)
    tasks = [
        (a, s)
        for a in config.algorithms
        for s in range(config.seeds)
        if not seed_done(run_dir, a, s)
    ]
    data = config_dict(config)
    bar = tqdm(total=len(tasks), desc=config.name, unit="run", disable=not progress)
    try:
        options = {
            "runtime": runtime,
            "nodes": nodes,
            "deployment": deployment,
            "job_options": job_options,
        }
        _run_tasks(tasks, data, run_dir, workers, bar, options)
    except BaseException:
        remove_stale_temporaries(run_dir)  # workers have stopped: nothing is being written
        raise
    finally:
        bar.close()
    _record_failures(run_dir, config, manifest)
    manifest["updated"] = dt.datetime.now().isoformat(timespec="seconds")
    atomic_write_json(run_dir / "summary.json", summarize(run_dir, manifest))
    atomic_write_json(run_dir / "manifest.json", manifest)
    from fedbandit.plotting import plot_run

    plot_run(run_dir)
    return run_dir


def _record_failures(run_dir: Path, config: ExperimentConfig, manifest: dict[str, Any]) -> None:
    """The manifest's status ("incomplete" while any seed was aborted by lost clients), the
    aborted seeds with the reason, and the clients dropped from each seed."""
    aborted, dropped = {}, {}
    for algorithm in config.algorithms:
        for seed in range(config.seeds):
            path = seed_stem(run_dir, algorithm, seed).with_suffix(".json")
            info = read_json(path) if path.is_file() else {}
            if info.get("status", "complete") != "complete":
                aborted[f"{algorithm}/seed_{seed}"] = info.get("failure")
            if info.get("dropped"):
                dropped[f"{algorithm}/seed_{seed}"] = info["dropped"]
    manifest["status"] = "incomplete" if aborted else "complete"
    manifest["aborted_seeds"] = aborted
    manifest["dropped_clients"] = dropped


def _run_tasks(
    tasks: list[tuple[str, int]],
    data: dict[str, Any],
    run_dir: Path,
    workers: int,
    bar: tqdm,
    options: dict[str, Any],
) -> None:
    """Run the (algorithm, seed) tasks, inline or in a process pool, advancing ``bar``."""
    if workers == 1:
        for algorithm, seed in tasks:
            bar.set_postfix_str(f"{algorithm} seed {seed}")
            run_task(data, algorithm, seed, str(run_dir), **options)
            bar.update()
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {
                pool.submit(run_task, data, a, s, str(run_dir), **options): (a, s) for a, s in tasks
            }
            pending = set(futures)
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        future.result()
                        algorithm, seed = futures[future]
                        bar.set_postfix_str(f"{algorithm} seed {seed}")
                        bar.update()
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise


def summary_table(summary: dict[str, Any]) -> str:
    """A plain-text table of the summary for the terminal."""
    header = (
        f"{'algorithm':<16}{'R(T)/M mean':>13}{'95% CI':>22}{'s/seed':>9}"
        f"{'rounds':>8}{'up scalars':>13}{'down scalars':>14}"
    )
    lines = [
        f"{summary['experiment']}: T = {summary['horizon']}, "
        f"{len(summary['seeds'])} seeds, status {summary['status']}",
        header,
    ]
    for name, entry in summary.items():
        if not isinstance(entry, dict) or "final_regret_mean" not in entry:
            continue
        low, high = entry["final_regret_ci95"]
        lines.append(
            f"{name:<16}{entry['final_regret_mean']:>13.2f}{f'[{low:.2f}, {high:.2f}]':>22}"
            f"{entry['seconds_per_seed']:>9.2f}{entry['rounds']:>8}"
            f"{entry['uplink_scalars']:>13.4g}{entry['downlink_scalars']:>14.4g}"
        )
    return "\n".join(lines)
