"""Run a named experiment, or a sweep of them: every (algorithm, seed) pair on a registered
runtime (or every (point, algorithm, seed) of a sweep, locally or on Ray), resumable.

Seeds are independent tasks whose randomness depends only on (base_seed, seed index, client id),
so the results are identical whatever the number of workers. A finished task's files are written
atomically and its ``.json`` last; rerunning with the same ``--out`` skips finished tasks. The
manifest says ``incomplete`` until every task is done.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, TextIO

import tomli_w
from tqdm import tqdm

from fedbandit.config import ExperimentConfig, validate_experiment
from fedbandit.errors import ConfigError, DeploymentError, RunStoppedError
from fedbandit.executors.ray_executor import run_on_ray
from fedbandit.flower.deployment import (
    AskAgainError,
    DetachedState,
    Submission,
    UnknownRunError,
    detached_state,
    submit_detached,
    wait_for_secure_nodes,
)
from fedbandit.flower.job import job_from_json
from fedbandit.instances import Instance
from fedbandit.registry import algorithms as registered_algorithms
from fedbandit.registry import build_instance, instance_kinds
from fedbandit.resources import estimate_memory, task_seconds
from fedbandit.results import (
    atomic_write_json,
    atomic_write_text,
    git_commit,
    machine_facts,
    package_versions,
    plot_run,
    read_json,
    remove_stale_temporaries,
    seed_done,
    seed_status,
    seed_stem,
    summarize,
    write_files,
)
from fedbandit.runspec import EXECUTORS, RunSpec, RuntimeOptions
from fedbandit.runtimes import RUNTIMES
from fedbandit.simulation import build_server, problem_spec
from fedbandit.sweep import (
    SweepPoint,
    collect_table,
    config_keys,
    expand,
    write_tables,
)
from fedbandit.threads import available_cpus, process_defaults, set_kernel_threads

RESULTS_ROOT = Path("results")


#: Seconds between progress lines when standard error is not a terminal (a log file).
PLAIN_PROGRESS_SECONDS = 30.0


class Progress(Protocol):
    """What the runner asks of a progress display (tqdm's names)."""

    n: int

    def update(self, n: int = 1) -> object: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> object: ...

    def close(self) -> object: ...


class PlainProgress:
    """Progress for a log file or a pipe: a plain line "NAME: K/N runs done, S s" at most every
    ``every`` seconds and one when closed, instead of a terminal's carriage-return updates."""

    def __init__(
        self,
        total: int,
        desc: str,
        every: float = PLAIN_PROGRESS_SECONDS,
        file: TextIO | None = None,
    ) -> None:
        self.total, self.desc, self.every = total, desc, every
        self.file = file if file is not None else sys.stderr
        self.n = 0
        self.postfix = ""
        self._started = self._shown_at = time.monotonic()
        self._shown = 0

    def _line(self) -> None:
        elapsed = time.monotonic() - self._started
        last = f" (last: {self.postfix})" if self.postfix else ""
        print(
            f"{self.desc}: {self.n}/{self.total} runs done, {elapsed:.0f} s{last}",
            file=self.file,
            flush=True,
        )
        self._shown, self._shown_at = self.n, time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._shown_at >= self.every:
            self._line()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def close(self) -> None:
        if self.n != self._shown or self.n == 0:
            self._line()


def progress_bar(total: int, desc: str, enabled: bool) -> Progress:
    """tqdm's bar on a terminal; plain lines every ``PLAIN_PROGRESS_SECONDS`` otherwise (a log
    file would fill with carriage-return updates); nothing when not ``enabled``."""
    if not enabled:
        return tqdm(total=total, disable=True)
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit="run")
    return PlainProgress(total, desc)


def default_out_dir(config: ExperimentConfig) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return RESULTS_ROOT / config.name / stamp


def config_dict(config: ExperimentConfig) -> dict[str, Any]:
    return config.model_dump(mode="json", exclude_none=True, by_alias=True)


def run_task(spec: RunSpec, run_dir: str) -> float:
    """Run one (algorithm, seed) on its runtime and write its files; returns its seconds."""
    process_defaults()
    return RUNTIMES[spec.options.runtime].run_seed(spec, Path(run_dir))


__all__ = ["run_experiment", "run_sweep", "run_task"]


def check_out_dir(run_dir: Path) -> None:
    """The results folder exists (created if needed) and is writable; else a ConfigError."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--out {run_dir}: exists and is not a folder; choose another --out")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"--out {run_dir}: cannot create the results folder ({err.strerror or err})"
        ) from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {run_dir}: the folder is not writable")


def preflight(
    config: ExperimentConfig,
    instance: Instance,
    algorithms: list[str],
    options: RuntimeOptions | None = None,
) -> None:
    """Build every algorithm's server on the instance before any seed runs, so that what an
    algorithm refuses (its problem checks, too short a horizon, secure aggregation when its
    server sums nothing, a horizon longer than a replayed log) is one clear error up front, before
    the run folder exists; and a deployment whose SuperLink lists too few SuperNodes for secure
    aggregation (``wait_for_secure_nodes``)."""
    check_horizon = getattr(instance, "check_horizon", None)
    if check_horizon is not None:
        check_horizon(config.horizon)
    for algorithm in algorithms:
        server = build_server(
            instance, algorithm, config.horizon, config.hyperparameters(algorithm)
        )
        if options is not None and options.secure_aggregation and not server.secure_sums():
            raise ConfigError(
                f"--secure-aggregation: {algorithm} declares no field that its server only "
                "sums over nodes (it exchanges with one client at a time, needs each client's "
                "values, or is not supported yet), so masking would hide nothing; run it "
                "without --secure-aggregation or leave it out (--algorithms); see "
                "docs/secure-aggregation.md"
            )
    if options is not None and options.runtime == "flower" and options.secure_aggregation:
        # before the folder exists: a deployment with too few SuperNodes for SecAgg+
        with tempfile.TemporaryDirectory(prefix="fedbandit-nodes-") as scratch:
            wait_for_secure_nodes(Submission.of(options, Path(scratch)), options)


def check_memory(
    config: ExperimentConfig, instance: Instance, algorithms: list[str], workers: int, force: bool
) -> None:
    """Refuse a run whose memory estimate exceeds what the machine has available (``force``
    runs it anyway); the message gives the estimate and what to change."""
    specs = [registered_algorithms().get(name) for name in algorithms]
    estimate = estimate_memory(specs, problem_spec(instance, config.horizon), workers)
    if not estimate.fits and not force:
        raise ConfigError(
            f"this run needs {estimate.describe()}: use fewer --workers or clients, or --force "
            "to run it anyway"
        )


def _say_rough_time(
    config: ExperimentConfig, instance: Instance, tasks: list[RunSpec], workers: int
) -> None:
    """One line with a rough time when the remaining runs may take more than a minute."""
    problem = problem_spec(instance, config.horizon)
    total = sum(
        task_seconds(registered_algorithms().get(spec.algorithm), problem) for spec in tasks
    )
    seconds = total / max(min(workers, len(tasks)), 1)
    if seconds > 60:
        print(
            f"fedbandit: roughly {seconds / 60:.0f} min for {len(tasks)} runs on {workers} "
            "worker(s) (an estimate from the sizes, within a factor of about 3)",
            file=sys.stderr,
        )


def prepare_run_folder(
    config: ExperimentConfig,
    run_dir: Path,
    workers: int,
    options: RuntimeOptions,
    instance: Instance,
    other_seeds: bool = False,
    seeds: list[int] | None = None,
) -> dict[str, Any]:
    """Create or reopen the run folder; refuses to mix two different experiments, or runtime
    options that change results, in one folder (the differing keys are named), and refuses to
    resume with fewer seeds than the folder holds finished (their files would be ignored)."""
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
        stored_options = manifest.get("runtime_options", {})
        changed = {
            key: (stored_options[key], value)
            for key, value in options.identity().items()
            if key in stored_options and stored_options[key] != value
        }
        if changed:
            described = ", ".join(
                f"{k}: {old!r} there, {new!r} now" for k, (old, new) in changed.items()
            )
            raise ConfigError(
                f"{run_dir} was run with other runtime options ({described}); resume it with "
                "the same options or choose another --out"
            )
        finished = [
            f"{a}/seed_{s}"
            for a in config.algorithms
            for s in manifest.get("seeds", [])
            if s >= config.seeds and seed_done(run_dir, a, s)
        ]
        if finished and not other_seeds:
            raise ConfigError(
                f"{run_dir} holds finished seeds beyond the {config.seeds} asked for "
                f"({', '.join(finished[:3])}{', ...' if len(finished) > 3 else ''}); resume "
                f"with --seeds {len(manifest.get('seeds', []))} or choose another --out"
            )
        remove_stale_temporaries(run_dir)
    else:
        manifest = {"created": dt.datetime.now().isoformat(timespec="seconds")}
    manifest.update(
        {
            "experiment": config.name,
            "status": "incomplete",
            "updated": dt.datetime.now().isoformat(timespec="seconds"),
            "algorithms": config.algorithms,
            "horizon": config.horizon,
            "seeds": list(seeds) if seeds is not None else list(range(config.seeds)),
            "base_seed": config.base_seed,
            "workers": workers,
            "runtime": options.runtime,
            "nodes": options.nodes,
            "runtime_options": options.model_dump(mode="json"),
            "group_size": config.group_size,
            "instance": instance.summary(),
            "git_commit": git_commit(),
            "packages": package_versions(),
            "plugins": plugin_versions(config.algorithms, config.instance),
            "machine": machine_facts(),
            "config": current,
        }
    )
    manifest.pop("stopped", None)  # a reason of an earlier, stopped attempt
    atomic_write_text(config_path, tomli_w.dumps(current))
    atomic_write_json(manifest_path, manifest)
    return manifest


def plugin_versions(algorithm_names: list[str], instance: Any) -> dict[str, str]:
    """Where each plugin algorithm or instance kind of the run comes from (distribution and
    entry point, with the distribution's version): a result names the code that made it."""
    found = {}
    for registry, names in (
        (registered_algorithms(), algorithm_names),
        (instance_kinds(), [str(getattr(instance, "kind", ""))]),
    ):
        for name in names:
            origin = registry.origins.get(name, "fedbandit")
            if origin != "fedbandit":
                dist = origin.split(" ", 1)[0]
                try:
                    version = metadata.version(dist)
                except metadata.PackageNotFoundError:
                    version = "unknown"
                found[name] = f"{origin}, version {version}"
    return found


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
    selected = list(algorithms) if algorithms is not None else list(config.algorithms)
    if unknown := [a for a in selected if a not in config.algorithms]:
        raise ConfigError(
            f"algorithms {unknown} are not in experiment {config.name!r} "
            f"(its algorithms: {', '.join(config.algorithms)})"
        )
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
        _refuse_pending_detached(run_dir, read_json(run_dir / "manifest.json"))
    manifest = prepare_run_folder(config, run_dir, workers, options, instance)
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
            _say_rough_time(config, instance, tasks, workers)
    if detach and tasks:
        submission = Submission.of(options, run_dir)
        manifest["detached"] = {
            "flower_run": submit_detached(submission, tasks, run_dir),
            "superlink": options.superlink,
            "runs": [f"{spec.algorithm}/seed_{spec.seed}" for spec in tasks],
            "submitted": dt.datetime.now().isoformat(timespec="seconds"),
        }
        record_failures(run_dir, config, manifest)
        atomic_write_json(run_dir / "manifest.json", manifest)
        return run_dir
    bar = progress_bar(len(tasks), config.name, progress)
    failed: DeploymentError | None = None
    try:
        reason = run_tasks([(spec, run_dir) for spec in tasks], workers, bar)
    except DeploymentError as err:  # the deployment failed: keep what finished, say why
        failed, reason = err, str(err)
    except BaseException:
        remove_stale_temporaries(run_dir)  # workers have stopped: nothing is being written
        raise
    finally:
        bar.close()
    if reason is not None:
        manifest["stopped"] = reason
    record_failures(run_dir, config, manifest)
    manifest["updated"] = dt.datetime.now().isoformat(timespec="seconds")
    atomic_write_json(run_dir / "summary.json", summarize(run_dir, manifest))
    atomic_write_json(run_dir / "manifest.json", manifest)
    if failed is not None:
        raise RunStoppedError(str(failed), run_dir) from None
    if plots:
        _plot(run_dir, manifest)
    return run_dir


def _plot(run_dir: Path, manifest: dict[str, Any]) -> None:
    """The run's plots; the results are complete without them, so a plot that cannot be drawn
    is recorded in the manifest (``plots_error``) and reported, not raised."""
    try:
        plot_run(run_dir)
    except Exception as err:  # the files are whole; say what failed and how to redo it
        manifest["plots_error"] = f"{type(err).__name__}: {err}"
        atomic_write_json(run_dir / "manifest.json", manifest)
        print(
            f"fedbandit: warning: the plots were not made ({manifest['plots_error']}); the "
            f"results are complete; retry with `fedbandit plot {run_dir}`",
            file=sys.stderr,
        )
    else:
        if manifest.pop("plots_error", None) is not None:
            atomic_write_json(run_dir / "manifest.json", manifest)


def _refuse_pending_detached(run_dir: Path, manifest: dict[str, Any]) -> None:
    """A folder whose detached Flower run may still deliver seeds is not run again (two runs
    would share its nodes, and the first one's seeds could no longer be pulled)."""
    detached = manifest.get("detached")
    if not detached or manifest.get("status") == "complete" or "stopped" in manifest:
        return
    runs, missing = detached.get("runs", []), manifest.get("missing_runs", [])
    if not runs or any(run in missing for run in runs):  # else: only runs it did not hold
        raise ConfigError(
            f"{run_dir} holds detached Flower run {detached['flower_run']}, not yet ended or "
            f"pulled: `fedbandit pull {run_dir}` until it is complete (a run that ended without "
            "every seed can then be resumed with this --out), or choose another --out"
        )


def _detached_run(
    run_dir: Path, reach: dict[str, Any] | None = None
) -> tuple[dict[str, Any], Submission, int]:
    """The manifest of a folder made by ``run --detach``, the submission that reaches its
    SuperLink (as recorded, or with ``reach``'s ``superlink``, ``root_certificates`` or
    ``insecure`` from another machine) and the Flower run id."""
    manifest_path = Path(run_dir) / "manifest.json"
    if not manifest_path.is_file():
        raise ConfigError(f"{run_dir} holds no run (no manifest.json)")
    manifest = read_json(manifest_path)
    detached = manifest.get("detached")
    if not detached:
        raise ConfigError(
            f"{run_dir} holds no detached run: `fedbandit run ... --runtime flower --detach` "
            "makes one"
        )
    options = RuntimeOptions.model_validate(manifest["runtime_options"])
    reach = reach or {}
    given = {key: reach[key] for key in ("superlink", "root_certificates") if reach.get(key)}
    if reach.get("insecure"):
        given.update(insecure=True, root_certificates=None)
    elif "root_certificates" in given:
        given["insecure"] = False
    if given:
        options = options.model_copy(update=given)
    return manifest, Submission.of(options, Path(run_dir)), int(detached["flower_run"])


def detached_status(
    run_dir: Path, reach: dict[str, Any] | None = None
) -> tuple[str, list[tuple[str, str]]]:
    """A detached run's Flower status and each of its seeds' state: "pulled" (with its
    status), "finished" (not pulled yet), "running, round N", "queued", "failed: REASON" or
    "not run". ``reach`` overrides how the SuperLink is reached (``superlink``,
    ``root_certificates``): from another machine or network."""
    manifest, submission, run_id = _detached_run(run_dir, reach)
    state = detached_state(submission, run_id)
    running = not state.status.startswith("finished")
    lines = []
    for label in manifest["detached"]["runs"]:
        algorithm, seed_text = label.split("/seed_")
        key = (algorithm, int(seed_text))
        event = state.progress.get(key)
        if (status := seed_status(Path(run_dir), *key)) is not None:
            lines.append((label, f"pulled ({status})"))
        elif key in state.files:
            texts = state.files[key]
            info = json.loads(next(t for p, t in texts.items() if p.endswith(".json")))
            lines.append((label, f"finished ({info.get('status', 'complete')}), not pulled yet"))
        elif event is not None and event != "stopped" and running:
            round_ = event.removeprefix("round ") if event.startswith("round") else "0"
            lines.append((label, f"running, round {round_}"))
        elif event is not None and not running:
            lines.append((label, f"failed: {state.error or 'the Flower run ended'}"))
        else:
            lines.append((label, "queued" if running else "not run"))
    return f"Flower run {run_id}: {state.status}", lines


def pull_detached(
    run_dir: Path,
    plots: bool = True,
    reach: dict[str, Any] | None = None,
    run_id: int | None = None,
) -> dict[str, Any]:
    """Fetch the seeds of a detached run that have finished and are not in ``run_dir`` yet
    (idempotent: a seed already here is left as it is), then update the manifest and
    ``summary.json`` (and the plots once every seed has arrived). Returns the manifest, with
    ``pulled`` (how many seeds this call fetched) and, once the Flower run has ended without
    every seed, ``stopped`` (why).

    With ``run_id`` (``pull --run-id``) a folder without a run (lost, or never made here) is
    rebuilt from that Flower run's log alone (``rebuild_detached``); ``reach`` must then say
    how to reach the SuperLink."""
    run_dir = Path(run_dir)
    if run_id is not None and not (run_dir / "manifest.json").is_file():
        return rebuild_detached(run_dir, run_id, reach or {}, plots)
    manifest, submission, recorded_id = _detached_run(run_dir, reach)
    if run_id is not None and run_id != recorded_id:
        raise ConfigError(
            f"{run_dir} holds detached Flower run {recorded_id}, not {run_id}: choose another "
            "folder to rebuild that run in"
        )
    config = validate_experiment(manifest["config"])
    try:
        state = detached_state(submission, recorded_id)
    except UnknownRunError as err:  # its seeds will never come: the folder may be resumed
        manifest["stopped"] = str(err)
        atomic_write_json(run_dir / "manifest.json", manifest)
        raise
    return _take_seeds(run_dir, manifest, config, state, plots)


def _take_seeds(
    run_dir: Path,
    manifest: dict[str, Any],
    config: ExperimentConfig,
    state: DetachedState,
    plots: bool,
) -> dict[str, Any]:
    """``pull_detached``'s second half: write the seeds of ``state`` not yet in ``run_dir``,
    then the manifest, ``summary.json`` and, once complete, the plots."""
    pulled = 0
    for (algorithm, seed), files in state.files.items():
        if seed_status(run_dir, algorithm, seed) is None:
            write_files(run_dir, files)
            pulled += 1
    record_failures(run_dir, config, manifest)
    wanted = manifest["detached"]["runs"]
    arrived = [label for label in wanted if label not in manifest["missing_runs"]]
    if len(arrived) == len(wanted):
        manifest.pop("stopped", None)
    elif state.status.startswith("finished"):
        why = state.error or f"the Flower run ended {state.status!r}"
        manifest["stopped"] = "; ".join([why, *state.broken])
    manifest["detached"]["flower_status"] = state.status
    manifest["updated"] = dt.datetime.now().isoformat(timespec="seconds")
    atomic_write_json(run_dir / "summary.json", summarize(run_dir, manifest))
    atomic_write_json(run_dir / "manifest.json", manifest)
    if plots and manifest["status"] == "complete":
        _plot(run_dir, manifest)
    return {
        **manifest,
        "pulled": pulled,
        "arrived": len(arrived),
        "wanted": len(wanted),
        "broken": state.broken,
    }


def rebuild_detached(
    run_dir: Path, run_id: int, reach: dict[str, Any], plots: bool = True
) -> dict[str, Any]:
    """``fedbandit pull --run-id ID --superlink HOST:PORT OUT``: a detached run's folder made
    anew from Flower run ``run_id``'s log alone (a lost folder, or a run submitted elsewhere).
    Every seed's emission carries the run's record (``RUN_RECORD``: the job, with the
    experiment's configuration and the runtime options, and every seed of the run), so the
    folder gets the manifest and ``config.toml`` the submitting command wrote, then the seeds
    that have finished, as ``pull`` fetches them; later ``pull OUT`` calls go on from there.
    ``AskAgainError`` while no seed has finished yet (nothing to rebuild from so far)."""
    if not reach.get("superlink"):
        raise ConfigError(
            "pull --run-id needs --superlink HOST:PORT (there is no folder to read it from)"
        )
    if not reach.get("insecure") and reach.get("root_certificates") is None:
        raise ConfigError(
            "pull --run-id needs --root-certificates CA.crt (TLS) or --insecure to reach the "
            "SuperLink (there is no folder to read them from)"
        )
    check_out_dir(run_dir)
    connection = RuntimeOptions.of(
        runtime="flower",
        superlink=reach["superlink"],
        insecure=bool(reach.get("insecure")),
        root_certificates=reach.get("root_certificates"),
    )
    submission = Submission.of(connection, run_dir)
    state = detached_state(submission, run_id)
    if state.record is None:
        if state.status.startswith("finished") and not state.files:
            raise DeploymentError(
                f"Flower run {run_id} ended ({state.status}) without a seed's files in its log: "
                "there is nothing to rebuild a folder from"
                + (f" ({state.error})" if state.error else "")
            )
        if state.files:
            raise DeploymentError(
                f"the log of Flower run {run_id} holds seeds' files but no record of the run "
                "(made by a fedbandit before 'pull --run-id'): pull it into its own folder"
            )
        raise AskAgainError(
            f"no seed of Flower run {run_id} ({state.status}) has finished yet, so its log "
            "holds nothing to rebuild the folder from; it goes on, ask again"
        )
    job = job_from_json(str(state.record["job"]))
    spec = job.spec
    options = spec.options.model_copy(
        update={
            "superlink": connection.superlink,
            "insecure": connection.insecure,
            "root_certificates": connection.root_certificates,
        }
    )
    config = spec.experiment
    instance = build_instance(config.instance)
    manifest = prepare_run_folder(config, run_dir, 1, options, instance)
    listed = state.record.get("runs", [])
    runs = [str(label) for label in listed] if isinstance(listed, list) else []
    manifest["detached"] = {
        "flower_run": run_id,
        "superlink": connection.superlink,
        "runs": runs,
        "rebuilt": dt.datetime.now().isoformat(timespec="seconds"),
    }
    return {**_take_seeds(run_dir, manifest, config, state, plots), "rebuilt_now": True}


def record_failures(run_dir: Path, config: ExperimentConfig, manifest: dict[str, Any]) -> None:
    """The manifest's status: "incomplete" while any (algorithm, seed) of the folder is not done
    (aborted by lost clients, or not run yet, as after ``--algorithms``); the aborted seeds with
    the reason, the runs still missing, and the clients dropped from each seed."""
    aborted, dropped, missing = {}, {}, []
    privacy: dict[str, Any] = {}  # each private algorithm's accountant and its inputs
    for algorithm in config.algorithms:
        for seed in manifest.get("seeds", range(config.seeds)):
            path = seed_stem(run_dir, algorithm, seed).with_suffix(".json")
            if not path.is_file():
                missing.append(f"{algorithm}/seed_{seed}")
                continue
            info = read_json(path)
            if "privacy" in info.get("report", {}):
                privacy.setdefault(algorithm, info["report"]["privacy"])
            if info.get("status", "complete") != "complete":
                aborted[f"{algorithm}/seed_{seed}"] = info.get("failure")
            if info.get("dropped"):
                dropped[f"{algorithm}/seed_{seed}"] = info["dropped"]
    manifest["status"] = "incomplete" if aborted or missing else "complete"
    if privacy:
        manifest["privacy"] = privacy
    manifest["aborted_seeds"] = aborted
    manifest["missing_runs"] = missing
    manifest["dropped_clients"] = dropped


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
            _run_on_ray(tasks, address, workers, bar)
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
    atomic_write_json(sweep_path, sweep_manifest)
    return out_dir


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


def _run_on_ray(
    tasks: list[tuple[RunSpec, Path]], address: str | None, workers: int, bar: Progress
) -> None:
    """Every task on a Ray cluster; each returns its files' texts and the driver writes them."""
    folders = {spec.model_dump_json(): run_dir for spec, run_dir in tasks}

    def on_done(spec: RunSpec, files: dict[str, str]) -> None:
        write_files(folders[spec.model_dump_json()], files)
        bar.update()

    # A local Ray instance (no address) gets --workers CPUs; a cluster uses what it has.
    cpus = workers if address is None else None
    run_on_ray([spec for spec, _ in tasks], on_done, address=address, num_cpus=cpus)


def _finish_point(run_dir: Path, config: ExperimentConfig) -> None:
    """A point's failures, summary and status, as ``fedbandit run`` leaves them."""
    manifest = read_json(run_dir / "manifest.json")
    record_failures(run_dir, config, manifest)
    manifest["updated"] = dt.datetime.now().isoformat(timespec="seconds")
    atomic_write_json(run_dir / "summary.json", summarize(run_dir, manifest))
    atomic_write_json(run_dir / "manifest.json", manifest)


def summary_table(summary: dict[str, Any]) -> str:
    """A plain-text table of the summary for the terminal."""
    header = (
        f"{'algorithm':<16}{'R(T)/M':>10}{'95% interval':>22}{'s/seed':>9}"
        f"{'rounds':>8}{'stats':>7}{'up/client':>12}{'down/client':>13}{'epsilon':>9}"
    )
    lines = [
        f"{summary['experiment']}: T = {summary['horizon']}, "
        f"{len(summary['seeds'])} seed{'s' * (len(summary['seeds']) != 1)}, "
        f"status {summary['status']}",
        header,
    ]
    private: list[str] = []
    replay: list[str] = []
    for name, entry in summary.items():
        if not isinstance(entry, dict) or "final_regret_mean" not in entry:
            continue
        if entry.get("final_reward_mean") is not None:
            replay.append(
                f"{name}: reward {entry['final_reward_mean']:.1f}, "
                f"{entry['reward_ratio_mean']:.2f}x random"
            )
        interval = entry["final_regret_ci95"]
        shown = "n/a (1 seed)" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"
        clients = entry.get("uplink_scalars_per_client", float("nan"))
        down = entry.get("downlink_scalars_per_client", float("nan"))
        stats = entry.get("statistics_rounds", "-")  # absent from seeds recorded before
        lines.append(
            f"{name:<16}{entry['final_regret_mean']:>10.2f}{shown:>22}"
            f"{entry['seconds_per_seed']:>9.2f}{entry['rounds']:>8}{stats:>7}"
            f"{clients:>12.4g}{down:>13.4g}"
            + (f"{entry['epsilon']:>9.3g}" if "epsilon" in entry else f"{'-':>9}")
        )
        if "epsilon" in entry:
            private.append(f"{name} ({_privacy_note(entry)})")
    lines.append(
        "R(T)/M: cumulative regret per client at T (mean over seeds); interval: "
        "95% Student-t over seeds; up/down: scalars sent per client over the run"
    )
    lines.append(
        "s/seed: wall seconds per seed; in-process runs leave out the one-time compilation of "
        "kernels (compile_seconds in each seed's JSON)"
    )
    lines.append(
        "rounds: exchanges that carried anything; stats: those that carried statistics (the "
        "others carried only bookkeeping flags: sync triggers, collect requests, joined flags)"
    )
    if replay:
        lines.append(
            "replay of logged events: R(T)/M counts the misses per client (events whose pick was "
            "not the logged choice); reward: logged choices matched, all clients, and its ratio to "
            "uniform choice's expected reward: " + "; ".join(replay)
        )
    if private:
        lines.append(
            "epsilon: privacy spent over the run, by dp_accounting's PLD accountant: "
            + "; ".join(private)
        )
    return "\n".join(lines)


def _privacy_note(entry: dict[str, Any]) -> str:
    """What a private algorithm's epsilon in the table holds against: delta, the privacy model,
    what the server saw (for ``shuffle`` without a secure sum: each silo's node, so the column
    shows epsilon_local and the sum model's value is named beside it), the neighbours."""
    privacy = entry["privacy"]
    saw = f"; server saw {privacy['server_saw']}" if "server_saw" in privacy else ""
    if privacy["model"] == "shuffle" and privacy["epsilon"] != privacy.get("epsilon_secure_sum"):
        saw += (
            f": epsilon_local shown, {privacy['epsilon_secure_sum']:.3g} only with "
            "--secure-aggregation"
        )
    return (
        f"delta {entry['delta']:.3g}, {privacy['model']}{saw}; neighbours: "
        f"{privacy['neighbouring']}"
    )
