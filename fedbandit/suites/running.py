"""Running a suite: every (environment, entry, seed) not yet done as one task of a worker pool or
of a Ray cluster, through the harness's own run folders (``fedbandit.runs``), then the suite's
tables.

Each (environment, entry) is an ordinary one-algorithm run folder. A built-in algorithm's folder
lives in the suite cache, named by its cache key (fedbandit's version and the resolved
configuration, ``PlannedRun.key``), so that another suite folder (``--out``) reuses the
built-ins' finished seeds and a researcher pays only for their own algorithm; a plugin's folder
lives in the suite folder (``OUT/runs/ENV/NAME``), whose code fedbandit cannot fingerprint.

The suite folder holds ``suite.json`` (the plan: environments, their runs and folders, the
algorithms left out and why), ``results.csv`` (one row per environment, entry and seed: final
regret per client and communication per client) and ``curves.csv`` (the mean regret curve of
each environment and entry); none records a time, so a rerun that resumes writes the same bytes.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from fedbandit._version import __version__
from fedbandit.errors import ConfigError
from fedbandit.results.files import (
    atomic_write_csv,
    atomic_write_json,
    read_json,
    remove_stale_temporaries,
    seed_done,
    seed_stem,
)
from fedbandit.results.summary import record_failures, summarize
from fedbandit.runs.execution import run_tasks, run_tasks_on_ray
from fedbandit.runs.planning import check_memory, check_out_dir, prepare_run_folder
from fedbandit.runs.progress import progress_bar
from fedbandit.runspec import EXECUTORS, RunSpec, RuntimeOptions
from fedbandit.suites.score import RESULT_COLUMNS
from fedbandit.suites.spec import Environment, PlannedRun, SuiteConfig, resolve

#: Where the built-ins' run folders are cached (default: ``~/.cache/fedbandit/suite-runs``, or
#: under ``$XDG_CACHE_HOME``).
CACHE_VARIABLE = "FEDBANDIT_SUITE_CACHE"


def default_cache() -> Path:
    """``$FEDBANDIT_SUITE_CACHE``, else ``$XDG_CACHE_HOME/fedbandit/suite-runs``, else
    ``~/.cache/fedbandit/suite-runs``."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE]).expanduser()
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "fedbandit" / "suite-runs"


@dataclass(frozen=True)
class SuiteRun:
    """What ``run_suite`` did: the folder, the runs it started, those it found done, whether
    every run is complete, and its wall seconds."""

    out: Path
    started: int
    reused: int
    complete: bool
    seconds: float
    environments: list[Environment]


def run_folder(run: PlannedRun, out: Path, cache: Path | None) -> Path:
    """A built-in's folder in the cache (by key); a plugin's, or every run without a cache,
    in the suite folder."""
    if run.builtin and cache is not None:
        return cache / run.key()
    return out / "runs" / run.environment / run.label


def run_suite(
    suite: SuiteConfig,
    out: Path,
    *,
    extra_algorithms: list[str] | None = None,
    seeds: int | None = None,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    cache: Path | None = None,
    progress: bool = True,
    force: bool = False,
) -> SuiteRun:
    """Run every (environment, entry, seed) of the suite not yet done, then write the suite's
    tables into ``out``. ``cache`` None: every run folder inside ``out``."""
    if executor not in EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if address is not None and executor != "ray":
        raise ConfigError("--address applies to --executor ray")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    if seeds is not None:
        if seeds < 2:
            raise ConfigError(f"--seeds must be >= 2 (the intervals need two), got {seeds}")
        suite = suite.model_copy(update={"seeds": seeds})
    started_at = time.perf_counter()
    environments = resolve(suite, extra_algorithms)
    out = Path(out)
    check_out_dir(out)
    plan_path = out / "suite.json"
    plan = _plan(suite, environments, out, cache)
    if plan_path.is_file():
        stored = dict(read_json(plan_path).get("suite", {}))
        current = dict(plan["suite"])
        stored.pop("seeds", None)  # more seeds extend the same runs
        current.pop("seeds", None)
        if stored != current:
            raise ConfigError(
                f"{out} holds the results of another suite definition (suite.json's 'suite' "
                "differs); choose another --out"
            )
    seed_list = list(range(suite.seeds))
    folders: dict[Path, tuple[PlannedRun, Any]] = {}
    for environment in environments:
        for run in environment.runs:
            folder = run_folder(run, out, cache)
            folders.setdefault(folder, (run, environment.instance))
    every = len(folders) * len(seed_list)
    workers = workers or min(os.cpu_count() or 1, every)
    if executor == "local" and not force:
        for run, instance in folders.values():
            check_memory(run.config, instance, run.config.algorithms, workers, force)
    options = RuntimeOptions()
    tasks: list[tuple[RunSpec, Path]] = []
    for folder, (run, instance) in folders.items():
        earlier = folder / "manifest.json"
        previous = read_json(earlier).get("seeds", []) if earlier.is_file() else []
        recorded = sorted(set(previous) | set(seed_list))
        prepare_run_folder(
            run.config, folder, workers, options, instance, other_seeds=True, seeds=recorded
        )
        tasks += [
            (
                RunSpec(experiment=run.config, algorithm=run.algorithm, seed=s, options=options),
                folder,
            )
            for s in seed_list
            if not seed_done(folder, run.algorithm, s)
        ]
    # Longest first (clients x horizon), so that no worker idles at the end on a big task.
    tasks.sort(key=lambda task: -task[0].experiment.horizon * _clients(task[0]))
    if progress:
        print(
            f"fedbandit: suite {suite.name} into {out}: {len(environments)} environments, "
            f"{every} runs, {every - len(tasks)} already done",
            file=sys.stderr,
        )
    bar = progress_bar(len(tasks), suite.name, progress)
    try:
        if executor == "ray":
            run_tasks_on_ray(tasks, address, workers, bar)
        else:
            run_tasks(tasks, workers, bar)
    except BaseException:
        for folder in folders:
            remove_stale_temporaries(folder)  # workers have stopped: nothing is being written
        raise
    finally:
        bar.close()
    for folder, (run, _) in folders.items():
        _finish_folder(folder, run)
    results, curves = collect(environments, out, cache, seed_list)
    complete = len(results) == sum(len(env.runs) for env in environments) * len(seed_list)
    plan["status"] = "complete" if complete else "incomplete"
    atomic_write_csv(out / "results.csv", results)
    atomic_write_csv(out / "curves.csv", curves)
    atomic_write_json(plan_path, plan)
    return SuiteRun(
        out=out,
        started=len(tasks),
        reused=every - len(tasks),
        complete=complete,
        seconds=time.perf_counter() - started_at,
        environments=environments,
    )


def _clients(spec: RunSpec) -> int:
    return int(getattr(spec.experiment.instance, "num_clients", 1) or 1)


def _plan(
    suite: SuiteConfig, environments: list[Environment], out: Path, cache: Path | None
) -> dict[str, Any]:
    """suite.json: the suite as given, fedbandit's version, and per environment its runs (with
    their folders and cache keys) and the algorithms left out with the registry's reason."""
    return {
        "suite": suite.model_dump(mode="json", exclude_none=True, by_alias=True),
        "fedbandit": __version__,
        "seeds": suite.seeds,
        "environments": {
            env.name: {
                "description": env.spec.description,
                "tags": env.spec.tags,
                "horizon": env.horizon,
                "num_clients": env.num_clients,
                "runs": {
                    run.label: {
                        "role": run.role,
                        "algorithm": run.algorithm,
                        "params": run.config.hyperparameters(run.algorithm),
                        "key": run.key(),
                        "folder": str(run_folder(run, out, cache)),
                    }
                    for run in env.runs
                },
                "excluded": env.excluded,
            }
            for env in environments
        },
    }


def _finish_folder(folder: Path, run: PlannedRun) -> None:
    """A run folder's failures, summary and status, as ``fedbandit run`` leaves them."""
    manifest = read_json(folder / "manifest.json")
    record_failures(folder, run.config, manifest)
    manifest["updated"] = dt.datetime.now().isoformat(timespec="seconds")
    atomic_write_json(folder / "summary.json", summarize(folder, manifest))
    atomic_write_json(folder / "manifest.json", manifest)


def collect(
    environments: list[Environment], out: Path, cache: Path | None, seeds: list[int]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """results.csv (one row per finished environment, entry and seed; communication per client
    in the run tables' units: scalars and bytes each way over the whole run) and curves.csv
    (per environment and entry, the mean over the finished seeds of R(t)/M at each stored t)."""
    rows = []
    curves = []
    for environment in environments:
        clients = environment.num_clients
        for run in environment.runs:
            folder = run_folder(run, out, cache)
            finished = [s for s in seeds if seed_done(folder, run.algorithm, s)]
            for seed in finished:
                info = read_json(seed_stem(folder, run.algorithm, seed).with_suffix(".json"))
                totals = info["totals"]
                rows.append(
                    {
                        "environment": environment.name,
                        "algorithm": run.label,
                        "role": run.role,
                        "seed": seed,
                        "final_regret": info["final_regret"],
                        "rounds": totals["rounds"],
                        "uplink_scalars_per_client": totals["uplink_scalars"] / clients,
                        "downlink_scalars_per_client": totals["downlink_scalars"] / clients,
                        "uplink_bytes_per_client": totals["uplink_bytes"] / clients,
                        "downlink_bytes_per_client": totals["downlink_bytes"] / clients,
                    }
                )
            if finished:
                frames = [
                    pd.read_csv(seed_stem(folder, run.algorithm, s).with_suffix(".regret.csv"))
                    for s in finished
                ]
                curve = pd.concat(frames).groupby("t", sort=True)["regret"].mean().reset_index()
                curve.insert(0, "algorithm", run.label)
                curve.insert(0, "environment", environment.name)
                curves.append(curve)
    results = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    columns = ["environment", "algorithm", "t", "regret"]
    curve_table = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(columns=columns)
    return results, curve_table
