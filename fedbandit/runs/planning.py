"""Planning a run before any seed starts: the results folder (where, writable, created or reopened
with its manifest, refusing to mix two configurations), every algorithm's server built on the
instance (its problem checks), the memory estimate and a rough time."""

from __future__ import annotations

import datetime as dt
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from fedbandit.config import ExperimentConfig
from fedbandit.errors import ConfigError, require_extra
from fedbandit.flower.seeds import wait_for_secure_nodes
from fedbandit.flower.submission import Submission
from fedbandit.instances import Instance, data_files
from fedbandit.registry import algorithms as registered_algorithms
from fedbandit.resources import estimate_memory, task_seconds
from fedbandit.results.files import (
    atomic_write_json,
    atomic_write_text,
    read_json,
    remove_stale_temporaries,
    seed_done,
)
from fedbandit.results.provenance import (
    git_commit,
    machine_facts,
    package_versions,
    plugin_versions,
)
from fedbandit.runspec import RunSpec, RuntimeOptions
from fedbandit.simulation import build_server, problem_spec

RESULTS_ROOT = Path("results")


def default_out_dir(config: ExperimentConfig) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return RESULTS_ROOT / config.name / stamp


def config_dict(config: ExperimentConfig) -> dict[str, Any]:
    return config.model_dump(mode="json", exclude_none=True, by_alias=True)


def select_algorithms(config: ExperimentConfig, names: Sequence[str] | None) -> list[str]:
    """The algorithms a run or a study asks for (``--algorithms``): ``names``, each once in the
    order given, or (None) every algorithm of the experiment. A name the experiment does not
    list is a ConfigError naming it and the experiment's algorithms."""
    if names is None:
        return list(config.algorithms)
    selected = list(dict.fromkeys(name.strip() for name in names if name.strip()))
    listed = ", ".join(config.algorithms)
    if not selected:
        raise ConfigError(
            f"--algorithms names no algorithm (expected A,B,... of experiment {config.name!r}; "
            f"its algorithms: {listed})"
        )
    if unknown := [name for name in selected if name not in config.algorithms]:
        which = "algorithm" if len(unknown) == 1 else "algorithms"
        verb = "is" if len(unknown) == 1 else "are"
        raise ConfigError(
            f"--algorithms: {which} {', '.join(map(repr, unknown))} {verb} not in experiment "
            f"{config.name!r} (its algorithms: {listed})"
        )
    return selected


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
    if options is not None and options.runtime == "flower-sim":  # Ray, an extra: say so first
        require_extra("ray", extra="simulation", needed_by="--runtime flower-sim")
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
                "`fedbandit docs secure-aggregation`"
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


def say_rough_time(
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


def recorded_data_files(manifest: dict[str, Any]) -> dict[str, str]:
    """The data files (path -> SHA-256) a folder's manifest records for its seeds: its
    ``data_files``, else (a folder made before fedbandit recorded them) the hashes of the
    instance summary (``events_sha256``, ``features_sha256``, ``data_sha256``)."""
    if isinstance(manifest.get("data_files"), dict):
        return dict(manifest["data_files"])
    summary = manifest.get("instance") or {}
    found: dict[str, str] = {}
    for path_key, sha_key in LEGACY_HASHES:
        paths, shas = summary.get(path_key), summary.get(sha_key)
        if isinstance(paths, str) and isinstance(shas, str):
            found[paths] = shas
        elif isinstance(paths, list) and isinstance(shas, list) and len(paths) == len(shas):
            found.update(zip(map(str, paths), map(str, shas), strict=True))
    return found


#: Where instance summaries recorded a data file's path and hash before ``data_files``.
LEGACY_HASHES = (
    ("events_file", "events_sha256"),
    ("features_file", "features_sha256"),
    ("source", "data_sha256"),
    ("files", "data_sha256"),
)


def _refuse_other_data(
    run_dir: Path, recorded: dict[str, str], current: dict[str, str], who: str
) -> None:
    """A folder holds the results of one set of data files: refuse data that differs from what
    ``who`` read (the path, the hash recorded and the hash now). Files are compared by their
    bytes: the same file read at another path (a ServerApp's host, a moved folder) is the same
    data."""
    for path, sha in recorded.items():
        now = current.get(path)
        if now == sha or sha in current.values():
            continue
        if now is None:
            reads = ", ".join(current) or "no data file"
            raise ConfigError(
                f"{run_dir}: {who} read the data file {path} (sha256 {sha}), this run reads "
                f"{reads}; a results folder holds the results of one data file: choose another "
                "--out"
            )
        raise ConfigError(
            f"{run_dir}: the data file {path} has changed since {who} read it (sha256 {sha} "
            f"recorded, {now} now); a results folder holds the results of one data file: "
            "choose another --out (or restore the file)"
        )


def check_data_files(run_dir: Path, manifest: dict[str, Any], current: dict[str, str]) -> None:
    """Refuse to resume ``run_dir`` on data files other than those its manifest and every seed
    it holds recorded (``current``: what this run reads, path -> SHA-256)."""
    _refuse_other_data(run_dir, recorded_data_files(manifest), current, "the folder's first run")
    for path in sorted((run_dir / "runs").glob("*/seed_*.json")):
        try:
            recorded = read_json(path).get("data_files")
        except (OSError, ValueError):
            continue  # not a seed's record: summarize reports it
        if isinstance(recorded, dict):
            who = f"{path.parent.name}/{path.stem}"
            _refuse_other_data(run_dir, recorded, current, who)


def check_run_folder(
    config: ExperimentConfig,
    run_dir: Path,
    options: RuntimeOptions,
    instance: Instance,
    other_seeds: bool = False,
) -> dict[str, Any] | None:
    """The refusals of ``prepare_run_folder``, nothing written: a folder of a different
    configuration, runtime options that change results, other data files than its seeds read,
    or fewer seeds than it holds finished. Returns the folder's manifest (None: a new folder)."""
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.exists():
        return None
    current = config_dict(config)
    manifest: dict[str, Any] = read_json(manifest_path)
    stored = manifest.get("config", {})
    differs = {
        k for k in set(stored) | set(current) if k != "seeds" and stored.get(k) != current.get(k)
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
    check_data_files(run_dir, manifest, data_files(instance))
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
    return manifest


def prepare_run_folder(
    config: ExperimentConfig,
    run_dir: Path,
    workers: int,
    options: RuntimeOptions,
    instance: Instance,
    other_seeds: bool = False,
    seeds: list[int] | None = None,
    requested_algorithms: list[str] | None = None,
) -> dict[str, Any]:
    """Create or reopen the run folder; refuses (``check_run_folder``, before anything is
    written) to mix two different experiments, runtime options that change results, or two
    versions of a data file in one folder (the differing keys or the file are named), and to
    resume with fewer seeds than the folder holds finished (their files would be ignored). The
    manifest's ``data_files`` are those of the folder's first run, never rewritten. The
    manifest's ``requested`` records what this run asks for (``requested_algorithms``, default
    all; the seeds), so that its status says whether that is done."""
    config_path = run_dir / "config.toml"
    manifest_path = run_dir / "manifest.json"
    current = config_dict(config)
    stored = check_run_folder(config, run_dir, options, instance, other_seeds)
    if stored is not None:
        manifest = stored
        remove_stale_temporaries(run_dir)
    else:
        manifest = {"created": dt.datetime.now().isoformat(timespec="seconds")}
    manifest.setdefault("data_files", data_files(instance))
    manifest.update(
        {
            "experiment": config.name,
            "status": "incomplete",
            "updated": dt.datetime.now().isoformat(timespec="seconds"),
            "algorithms": config.algorithms,
            "horizon": config.horizon,
            "seeds": list(seeds) if seeds is not None else list(range(config.seeds)),
            "requested": {
                "algorithms": list(requested_algorithms or config.algorithms),
                "seeds": list(seeds) if seeds is not None else list(range(config.seeds)),
            },
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
