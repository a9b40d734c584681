"""Run a named experiment: every (algorithm, seed) pair on a registered runtime, resumable. This
module composes the rooms of ``fedbandit.runs``: planning (the folder, preflight, memory),
execution (the worker pool), detached Flower runs, and the report (plots); a study's runs are
``fedbandit.runs.sweeps.run_sweep``.

Seeds are independent tasks whose randomness depends only on (base_seed, seed index, client id),
so the results are identical whatever the number of workers. A finished task's files are written
atomically and its ``.json`` last; rerunning with the same ``--out`` skips finished tasks. The
manifest says ``incomplete`` until every task is done.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

from fedbandit.config import ExperimentConfig
from fedbandit.errors import ConfigError, DeploymentError, RunStoppedError
from fedbandit.flower.seeds import submit_detached
from fedbandit.flower.submission import Submission
from fedbandit.registry import build_instance
from fedbandit.results.files import (
    atomic_write_json,
    read_json,
    remove_stale_temporaries,
    seed_done,
)
from fedbandit.results.provenance import write_citations
from fedbandit.results.summary import record_failures, summarize
from fedbandit.runs.detached import refuse_pending_detached, wait_detached_start
from fedbandit.runs.execution import run_tasks
from fedbandit.runs.planning import (
    check_memory,
    check_out_dir,
    default_out_dir,
    preflight,
    prepare_run_folder,
    say_rough_time,
    select_algorithms,
)
from fedbandit.runs.progress import progress_bar
from fedbandit.runs.report import plot_after_run
from fedbandit.runspec import RunSpec, RuntimeOptions
from fedbandit.runtimes import RUNTIMES

__all__ = ["run_experiment"]


def record_interruption(run_dir: Path, config: ExperimentConfig, manifest: dict) -> None:
    """The manifest of a run stopped by Ctrl-C or a signal: what finished (the clients dropped
    from it too), what is missing, and that rerunning resumes. Best effort: the interruption
    itself is what the caller reports."""
    manifest["stopped"] = "interrupted before every run was done: the same command resumes it"
    manifest["updated"] = dt.datetime.now().isoformat(timespec="seconds")
    try:
        record_failures(run_dir, config, manifest)
        atomic_write_json(run_dir / "manifest.json", manifest)
    except Exception as err:  # never hide the interruption behind this
        print(f"fedbandit: could not update {run_dir / 'manifest.json'}: {err}", file=sys.stderr)


def run_experiment(
    config: ExperimentConfig,
    out_dir: Path | None = None,
    workers: int | None = None,
    progress: bool = True,
    options: RuntimeOptions | None = None,
    algorithms: list[str] | None = None,
    plots: bool = True,
    force: bool = False,
    detach: bool = False,
) -> Path:
    """Run every (algorithm, seed) not yet done in ``out_dir`` on the runtime of ``options``
    (default: local); ``algorithms`` restricts the run to some of the experiment's algorithms.
    Writes the manifest, ``summary.json`` and (with ``plots``) the plots; returns the folder.
    ``detach`` (runtime ``flower`` only) submits the seeds as one Flower run and returns at
    once, the run recorded in the manifest's ``detached`` (``pull_detached`` fetches them)."""
    options = options or RuntimeOptions()
    if detach and options.runtime != "flower":
        raise ConfigError(f"--detach applies to --runtime flower, not {options.runtime!r}")
    entry = RUNTIMES[options.runtime]
    run_dir = Path(out_dir) if out_dir is not None else default_out_dir(config)
    selected = select_algorithms(config, algorithms)
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    if not entry.parallel:
        workers = 1  # the nodes do the parallel work
    workers = workers or min(os.cpu_count() or 1, config.seeds * len(selected))
    instance = build_instance(config.instance)
    preflight(config, instance, selected, options)
    if entry.parallel:
        check_memory(config, instance, selected, workers, force)
    check_out_dir(run_dir)
    resumed = (run_dir / "manifest.json").is_file()
    if resumed:
        refuse_pending_detached(run_dir, read_json(run_dir / "manifest.json"))
    manifest = prepare_run_folder(
        config, run_dir, workers, options, instance, requested_algorithms=selected
    )
    manifest.pop("detached", None)  # an earlier detached run that has ended: replaced below
    every = [(a, s) for a in selected for s in range(config.seeds)]
    tasks = [
        RunSpec(experiment=config, algorithm=a, seed=s, options=options)
        for a, s in every
        if not seed_done(run_dir, a, s)
    ]
    if progress:
        done = len(every) - len(tasks)
        what = f"resuming {run_dir}: {done} of {len(every)} runs already done"
        print(f"fedbandit: {what if resumed else f'results folder {run_dir}'}", file=sys.stderr)
        if not detach:
            say_rough_time(config, instance, tasks, workers)
    if detach and tasks:
        submission = Submission.of(options, run_dir)
        flower_run = submit_detached(submission, tasks, run_dir)
        manifest["detached"] = {
            "flower_run": flower_run,
            "superlink": options.superlink,
            "runs": [f"{spec.algorithm}/seed_{spec.seed}" for spec in tasks],
            "submitted": dt.datetime.now().isoformat(timespec="seconds"),
        }
        record_failures(run_dir, config, manifest)
        atomic_write_json(run_dir / "manifest.json", manifest)
        wait_detached_start(submission, flower_run, run_dir)
        return run_dir
    bar = progress_bar(len(tasks), config.name, progress)
    failed: DeploymentError | None = None
    try:
        reason = run_tasks([(spec, run_dir) for spec in tasks], workers, bar)
    except DeploymentError as err:  # the deployment failed: keep what finished, say why
        failed, reason = err, str(err)
    except BaseException:
        remove_stale_temporaries(run_dir)  # workers have stopped: nothing is being written
        record_interruption(run_dir, config, manifest)
        raise
    finally:
        bar.close()
    if reason is not None:
        manifest["stopped"] = reason
    record_failures(run_dir, config, manifest)
    manifest["updated"] = dt.datetime.now().isoformat(timespec="seconds")
    atomic_write_json(run_dir / "summary.json", summarize(run_dir, manifest))
    write_citations(run_dir, config.algorithms)
    atomic_write_json(run_dir / "manifest.json", manifest)
    if failed is not None:
        raise RunStoppedError(str(failed), run_dir) from None
    if plots:
        plot_after_run(run_dir, manifest)
    return run_dir
