"""Running a study (``fedbandit sweep``): every (point, algorithm, seed) of the ``[sweep]`` table as
one task of a single worker pool or of a Ray cluster (the driver writes the files a Ray task
returns), then each point's summary and the study's tables (``fedbandit.sweep``)."""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedbandit.config import ExperimentConfig
from fedbandit.errors import ConfigError, require_extra
from fedbandit.registry import build_instance
from fedbandit.results.files import (
    atomic_write_json,
    atomic_write_text,
    read_json,
    remove_stale_temporaries,
    seed_done,
)
from fedbandit.results.provenance import CITATIONS_FILE, citations_bib, write_citations
from fedbandit.results.summary import record_failures, summarize
from fedbandit.runs.execution import run_tasks, run_tasks_on_ray
from fedbandit.runs.planning import (
    check_memory,
    check_out_dir,
    check_run_folder,
    preflight,
    prepare_run_folder,
    select_algorithms,
)
from fedbandit.runs.progress import progress_bar
from fedbandit.runspec import EXECUTORS, RunSpec, RuntimeOptions
from fedbandit.sweep import SweepPoint, collect_table, config_keys, expand, write_tables


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
    algorithms: Sequence[str] | None = None,
) -> Path:
    """Run every (point, algorithm, seed) of the sweep not yet done in ``out_dir``; write each
    point's summary and the sweep's tables (``force``: run even above the memory estimate).
    ``algorithms`` runs only those of the experiment's algorithms, as ``fedbandit run
    --algorithms`` does: each point's folder records them as ``requested`` and is complete when
    they are; a later sweep without them into the same folder adds the others. Returns
    ``out_dir``."""
    if executor not in EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if address is not None and executor != "ray":
        raise ConfigError("--address applies to --executor ray")
    if executor == "ray":  # Ray, an extra: say so before the folder exists
        require_extra("ray", extra="ray", needed_by="--executor ray")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    select_algorithms(config, algorithms)  # a name the experiment lacks: said before expanding
    points = expand(config, extra_grid)
    selected = {p.id: select_algorithms(p.config, algorithms) for p in points}
    seed_list = seeds if seeds is not None else list(range(config.seeds))
    top = max(seed_list) + 1
    every = sum(len(selected[p.id]) for p in points) * len(seed_list)
    workers = workers or min(os.cpu_count() or 1, every)
    options = RuntimeOptions()
    prepared = []
    for point in points:
        point_config = point.config.model_copy(update={"seeds": top})
        instance = build_instance(point_config.instance)
        preflight(point_config, instance, selected[point.id])
        if executor == "local":
            check_memory(point_config, instance, selected[point.id], workers, force)
        prepared.append((point, point_config, instance))
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    sweep_path = out_dir / "sweep.json"
    sweep_manifest = _sweep_manifest(config, points, sweep_path)
    for point, point_config, instance in prepared:  # every refusal before anything is written
        check_run_folder(point_config, out_dir / "points" / point.id, options, instance, True)
    atomic_write_json(sweep_path, sweep_manifest)
    tasks: list[tuple[RunSpec, Path]] = []
    for point, point_config, instance in prepared:
        run_dir = out_dir / "points" / point.id
        earlier = run_dir / "manifest.json"
        previous = read_json(earlier).get("seeds", []) if earlier.is_file() else []
        recorded = sorted(set(previous) | set(seed_list))
        manifest = prepare_run_folder(
            point_config,
            run_dir,
            workers,
            options,
            instance,
            other_seeds=True,
            seeds=recorded,
            requested_algorithms=selected[point.id],
        )
        manifest["sweep_point"] = {"id": point.id, "values": point.values}
        atomic_write_json(run_dir / "manifest.json", manifest)
        tasks += [
            (RunSpec(experiment=point_config, algorithm=a, seed=s, options=options), run_dir)
            for a in selected[point.id]
            for s in seed_list
            if not seed_done(run_dir, a, s)
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
    bar = progress_bar(len(tasks), config.name, progress)
    started = time.perf_counter()
    try:
        if executor == "ray":
            run_tasks_on_ray(tasks, address, workers, bar)
        else:
            run_tasks(tasks, workers, bar)
    except BaseException:
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
    _write_sweep_citations(out_dir, [(out_dir / "points" / p.id, c) for p, c, _ in prepared])
    atomic_write_json(sweep_path, sweep_manifest)
    return out_dir


def _write_sweep_citations(out_dir: Path, points: list[tuple[Path, ExperimentConfig]]) -> None:
    """The study's ``CITATIONS.bib``: fedbandit and the papers of every algorithm that ran at
    some point (each point folder holds its own)."""
    ran: list[str] = []
    for folder, point_config in points:
        for name in point_config.algorithms:
            if name not in ran and any((folder / "runs" / name).glob("seed_*.json")):
                ran.append(name)
    atomic_write_text(out_dir / CITATIONS_FILE, citations_bib(ran))


def _clients(config: ExperimentConfig) -> int:
    return int(getattr(config.instance, "num_clients", 1) or 1)


def _sweep_manifest(
    config: ExperimentConfig, points: list[SweepPoint], path: Path
) -> dict[str, Any]:
    """sweep.json: the experiment, its points; refuses a folder holding another sweep."""
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


def _finish_point(run_dir: Path, config: ExperimentConfig) -> None:
    """A point's failures, summary and status, as ``fedbandit run`` leaves them."""
    manifest = read_json(run_dir / "manifest.json")
    record_failures(run_dir, config, manifest)
    manifest["updated"] = dt.datetime.now().isoformat(timespec="seconds")
    atomic_write_json(run_dir / "summary.json", summarize(run_dir, manifest))
    write_citations(run_dir, config.algorithms)
    atomic_write_json(run_dir / "manifest.json", manifest)
