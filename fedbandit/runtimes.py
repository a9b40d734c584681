"""The registry of runtimes: how one seed of a ``RunSpec`` runs and where its files come from.

``local`` (in-process), ``flower-sim`` (Flower's simulation runtime on Ray) and ``flower`` (a
Flower deployment), under the names of ``fedbandit.runspec.RUNTIME_NAMES``. Flower itself (half
a second to import) is imported when a seed runs on one of its runtimes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedbandit.flower.seeds import run_seed, run_seeds
from fedbandit.flower.simulation import simulate_flower, simulate_flower_seeds
from fedbandit.flower.submission import Submission
from fedbandit.registry import build_instance
from fedbandit.results.files import seed_files, write_files, write_seed_result
from fedbandit.runspec import RUNTIME_NAMES, RunSpec
from fedbandit.simulation import SeedResult, simulate
from fedbandit.threads import process_defaults

#: Called after each seed of ``RuntimeEntry.run_seeds`` has left its files: go on?
SeedFinished = Callable[[RunSpec, Path], bool]


@dataclass(frozen=True)
class RuntimeEntry:
    """A registered runtime: how one seed of a ``RunSpec`` runs and leaves its files in the run
    folder. ``parallel`` runtimes may run seeds in worker processes; the others (Flower's) do
    their parallel work on nodes and run seeds one after another. ``run_seeds``, where given,
    runs a command's seeds (spec, run folder) in one go (one start of its machinery, or what one
    seed tells the next: a deployment's clients lost for good under ``drop``), calling
    ``finished`` after each seed's files are written and stopping when it returns False."""

    name: str
    description: str
    run_seed: Callable[[RunSpec, Path], float]
    parallel: bool
    run_seeds: Callable[[list[tuple[RunSpec, Path]], SeedFinished], None] | None = None


def local_seed_files(spec: RunSpec) -> dict[str, str]:
    """Run one seed in this process and return its result files as texts
    (``fedbandit.results.files.seed_files``): what a worker that shares no file system with the
    driver (a Ray task) sends back."""
    process_defaults()
    config = spec.experiment
    result = simulate(
        build_instance(config.instance),
        spec.algorithm,
        config.horizon,
        spec.entropy,
        config.hyperparameters(spec.algorithm),
        config.group_size,
    )
    return seed_files(config, spec.seed, result)


def _run_local(spec: RunSpec, run_dir: Path) -> float:
    started = time.perf_counter()
    write_files(run_dir, local_seed_files(spec))
    return time.perf_counter() - started


def _run_flower_sim(spec: RunSpec, run_dir: Path) -> float:

    result = simulate_flower(spec)
    write_seed_result(spec.experiment, run_dir, spec.seed, result)
    return result.seconds


def _run_flower_sim_seeds(tasks: list[tuple[RunSpec, Path]], finished: SeedFinished) -> None:
    """Every task in one Flower simulation; each seed's files are written as it ends."""
    folders = {spec.model_dump_json(): run_dir for spec, run_dir in tasks}

    def on_seed(spec: RunSpec, result: SeedResult) -> bool:
        run_dir = folders[spec.model_dump_json()]
        write_seed_result(spec.experiment, run_dir, spec.seed, result)
        return finished(spec, run_dir)

    process_defaults()
    simulate_flower_seeds([spec for spec, _ in tasks], on_seed)


def _run_flower(spec: RunSpec, run_dir: Path) -> float:
    """One Flower run on the deployment's SuperLink; the seed's files come back into
    ``run_dir`` (``fedbandit.flower.seeds.run_seed``)."""

    submission = Submission.of(spec.options, Path(run_dir))
    started = time.perf_counter()
    run_seed(submission, spec, Path(run_dir))
    return time.perf_counter() - started


#: Every runtime of ``RUNTIME_NAMES``, by name.
RUNTIMES: dict[str, RuntimeEntry] = {
    entry.name: entry
    for entry in (
        RuntimeEntry("local", RUNTIME_NAMES["local"], _run_local, True),
        RuntimeEntry(
            "flower-sim",
            RUNTIME_NAMES["flower-sim"],
            _run_flower_sim,
            False,
            _run_flower_sim_seeds,
        ),
        RuntimeEntry("flower", RUNTIME_NAMES["flower"], _run_flower, False, run_seeds),
    )
}
