"""Detached Flower runs (``fedbandit run --detach``): a folder's submitted run, its seeds' status,
pulling the finished seeds into the folder, and rebuilding a lost folder from the run's log."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedbandit.config import ExperimentConfig, validate_experiment
from fedbandit.errors import ConfigError, DeploymentError
from fedbandit.flower.job import job_from_json
from fedbandit.flower.run_log import AskAgainError, DetachedState, detached_state
from fedbandit.flower.submission import StartDeadlineError, Submission, UnknownRunError
from fedbandit.registry import build_instance
from fedbandit.results.files import (
    atomic_write_json,
    read_json,
    seed_status,
    write_files,
)
from fedbandit.results.provenance import write_citations
from fedbandit.results.summary import record_failures, summarize
from fedbandit.runs.planning import check_out_dir, prepare_run_folder, recorded_data_files
from fedbandit.runs.report import plot_after_run
from fedbandit.runspec import RuntimeOptions


def refuse_pending_detached(run_dir: Path, manifest: dict[str, Any]) -> None:
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


def wait_detached_start(submission: Submission, run_id: int, run_dir: Path) -> None:
    """After ``run --detach`` has submitted Flower run ``run_id`` and recorded it in
    ``run_dir``'s manifest: wait, saying so now and then, until its ServerApp has started
    (``Submission.wait_started``, at most ``--start-deadline``). ``StartDeadlineError`` past
    it: with ``may_start`` (a slow start, the run left as it is) ``pull`` follows it as any
    detached run; without (the SuperLink refused a ServerApp that reported late and launches
    another, without limit) the run is stopped and the manifest says why (``stopped``), so
    that the folder may be rerun."""
    try:
        submission.wait_started(submission.environment(), run_id, "detached")
    except StartDeadlineError as err:
        if err.may_start:
            raise StartDeadlineError(
                f"{err}; it may still start: `fedbandit pull {run_dir}` follows it (exit 75 "
                "while it goes on)",
                may_start=True,
            ) from None
        if not submission.stop_unstarted(run_id, "detached"):
            raise StartDeadlineError(
                f"{err}; `flwr stop {run_id}` failed, the run may still start: `fedbandit pull "
                f"{run_dir}` follows it",
                may_start=True,
            ) from None
        manifest_path = Path(run_dir) / "manifest.json"
        manifest = read_json(manifest_path)
        manifest["stopped"] = f"{err}; the run was stopped"
        manifest["detached"]["flower_status"] = "finished:stopped"
        atomic_write_json(manifest_path, manifest)
        raise StartDeadlineError(
            f"{manifest['stopped']}: rerun with the same --out when the SuperLink's host is less "
            "loaded",
            may_start=False,
        ) from None


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
    refused = f" ({state.refused}; `fedbandit pull` stops it)" if state.refused else ""
    return f"Flower run {run_id}: {state.status}{refused}", lines


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
    if state.refused is not None:  # Flower would launch its ServerApp again and again
        if not submission.stop_unstarted(recorded_id, "detached"):
            raise AskAgainError(f"{state.refused}; `flwr stop {recorded_id}` failed: ask again")
        state = replace(
            state, status="finished:stopped", error=f"{state.refused}; the run was stopped"
        )
    return _take_seeds(run_dir, manifest, config, state, plots)


def _refuse_pulled_data(
    run_dir: Path, recorded: dict[str, str], label: str, read: dict[str, str]
) -> None:
    """A seed pulled from a deployment that read other data files (compared by their bytes)
    than the folder records is not written: one line naming the file and both hashes."""
    for path, sha in recorded.items():
        if sha in read.values():
            continue
        seen = ", ".join(f"{other} (sha256 {digest})" for other, digest in read.items())
        raise ConfigError(
            f"{run_dir}: {label}, pulled from the deployment, read {seen or 'no data file'}, "
            f"not the data file {path} (sha256 {sha}) this folder's runs read; a results folder "
            "holds the results of one data file: give the deployment's hosts the same file as "
            "this machine and run again, nothing was written"
        )


def _take_seeds(
    run_dir: Path,
    manifest: dict[str, Any],
    config: ExperimentConfig,
    state: DetachedState,
    plots: bool,
) -> dict[str, Any]:
    """``pull_detached``'s second half: write the seeds of ``state`` not yet in ``run_dir``,
    then the manifest, ``summary.json`` and, once complete, the plots. A seed that read other
    data files than the folder's first run refuses the pull before anything is written."""
    new = {
        key: files
        for key, files in state.files.items()
        if seed_status(run_dir, key[0], key[1]) is None
    }
    recorded = recorded_data_files(manifest)
    for (algorithm, seed), files in new.items():
        info = json.loads(next(text for path, text in files.items() if path.endswith(".json")))
        if isinstance(info.get("data_files"), dict):
            _refuse_pulled_data(run_dir, recorded, f"{algorithm}/seed_{seed}", info["data_files"])
    for files in new.values():
        write_files(run_dir, files)
    pulled = len(new)
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
    write_citations(run_dir, config.algorithms)
    atomic_write_json(run_dir / "manifest.json", manifest)
    if plots and manifest["status"] == "complete":
        plot_after_run(run_dir, manifest)
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
