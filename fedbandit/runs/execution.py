"""Executing a command's tasks: one (algorithm, seed) on its runtime (``run_task``), inline or in
one pool of long-lived worker processes, every worker stopped at once on an error or interrupt."""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from fedbandit.results.files import (
    read_json,
    seed_stem,
    write_files,
)
from fedbandit.runs.progress import Progress
from fedbandit.runspec import RunSpec
from fedbandit.runtimes import RUNTIMES
from fedbandit.threads import available_cpus, process_defaults, set_kernel_threads


def run_task(spec: RunSpec, run_dir: str) -> float:
    """Run one (algorithm, seed) on its runtime and write its files; returns its seconds."""
    process_defaults()
    return RUNTIMES[spec.options.runtime].run_seed(spec, Path(run_dir))


def run_tasks(tasks: list[tuple[RunSpec, Path]], workers: int, bar: Progress) -> str | None:
    """Run (spec, run folder) tasks inline or in one pool of long-lived worker processes,
    advancing ``bar``; on any exception or interrupt every worker is stopped at once.

    Inline, a seed aborted under ``on_client_failure = "abort"`` (lost clients) ends the whole
    run: the tasks after it are not started, and the reason is returned (None: all ran). A
    runtime that runs a command's seeds in one go (``RuntimeEntry.run_seeds``: flower-sim, one
    simulation for all of them; flower, which carries the clients lost for good under ``drop``
    from seed to seed) gets them all at once."""
    if not tasks:
        return None
    if workers == 1:
        stopped: list[str] = []

        def finished(spec: RunSpec, run_dir: Path) -> bool:
            bar.update()
            info = read_json(seed_stem(run_dir, spec.algorithm, spec.seed).with_suffix(".json"))
            if info.get("status") == "aborted":
                failure = str(info.get("failure"))
                advice = (
                    ": too few nodes were left to unmask a secure sum: restart the lost nodes (or "
                    "lower --secure-threshold) and rerun with the same --out"
                    if "secure aggregation halted" in failure
                    else " (--on-client-failure abort): restart the lost node, or choose "
                    "--on-client-failure drop, and rerun with the same --out"
                )
                stopped.append(
                    f"{spec.algorithm} seed {spec.seed} aborted ({failure}); the runs after it "
                    f"were not started{advice}"
                )
                return False
            return True

        entry = RUNTIMES[tasks[0][0].options.runtime]
        if entry.run_seeds is not None:
            bar.set_postfix_str(f"{len(tasks)} runs on {entry.name}")
            entry.run_seeds(tasks, finished)
        else:
            for spec, run_dir in tasks:
                bar.set_postfix_str(f"{spec.algorithm} seed {spec.seed}")
                run_task(spec, str(run_dir))
                if not finished(spec, Path(run_dir)):
                    break
        return stopped[0] if stopped else None
    # The workers share the cores: each runs its compiled kernels on its share of them.
    share = (max(1, available_cpus() // workers),)
    with ProcessPoolExecutor(workers, initializer=set_kernel_threads, initargs=share) as pool:
        futures = {pool.submit(run_task, spec, str(run_dir)): spec for spec, run_dir in tasks}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    future.result()
                    spec = futures[future]
                    bar.set_postfix_str(f"{spec.algorithm} seed {spec.seed}")
                    bar.update()
        except BaseException:
            _stop_workers(pool)
            raise
    return None


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Stop every worker now (Ctrl-C, SIGTERM or a failed task): running seeds are abandoned,
    their temporary files removed by the caller; finished seeds' files are whole."""
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)  # no new task starts
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=10)


def run_tasks_on_ray(
    tasks: list[tuple[RunSpec, Path]], address: str | None, workers: int, bar: Progress
) -> None:
    """Every task on Ray (``address``: a cluster; None: a local Ray with ``workers`` CPUs); each
    returns its files' texts and the driver writes them, into every folder that asked for the
    same run (each distinct run is made once)."""
    from fedbandit.executors.ray_executor import run_on_ray

    folders: dict[str, list[Path]] = {}
    unique: dict[str, RunSpec] = {}
    for spec, folder in tasks:
        text = spec.model_dump_json()
        folders.setdefault(text, []).append(folder)
        unique[text] = spec

    def on_done(spec: RunSpec, files: dict[str, str]) -> None:
        for folder in folders[spec.model_dump_json()]:
            write_files(folder, files)
        bar.update()

    cpus = workers if address is None else None
    run_on_ray(list(unique.values()), on_done, address=address, num_cpus=cpus)
