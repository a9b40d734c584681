"""Flower deployments: submit and await a seed; read a detached run back.

The SuperLink and SuperNode processes are in ``fedbandit.flower.processes``.

Submitting uses Flower's own CLI (``flwr run``) on the Flower App in ``flwr_app/`` with a run-config
file carrying the job; ``flwr run`` exits 0 even when the ServerApp fails, so the outcome is read
from ``flwr ls --run-id``.

Errors: a deployment that cannot start or went wrong (addresses, client ranges, TLS files, keys,
``flwr`` failures, a refused or failed run) raises ``fedbandit.errors.DeploymentError``; a
combination of arguments this module does not support raises ``ConfigError``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedbandit.errors import DeploymentError
from fedbandit.flower.job import FlowerJob, job_to_json
from fedbandit.flower.processes import unreachable
from fedbandit.flower.result_log import decode_all, read_progress
from fedbandit.flower.run_record import split_record
from fedbandit.flower.submission import (
    ERROR_MARK,
    LOG_WAIT_SECONDS,
    LogStream,
    Submission,
    UnknownRunError,
)
from fedbandit.runspec import RunSpec, RuntimeOptions

# fedbandit.results (pandas, a fifth of a second) is imported by run_seed, which reads a seed's
# files: the command lines and the SuperLink probe stay quick to import for `fedbandit --help`.

#: Seconds between the ServerApp's pulls for replies (each is a request to the SuperLink).
DEPLOYMENT_POLL_SECONDS = 0.05
#: Seconds between the driver's looks at the SuperNodes online, while a secure run waits for
#: enough of them before it is submitted (``wait_for_secure_nodes``).
NODE_POLL_SECONDS = 2.0
#: Seconds a finished run's log may take to arrive (it holds every seed's files).
FINISHED_LOG_WAIT_SECONDS = 120.0
#: Seconds ``status`` and ``pull`` wait for a running run's log. ``flwr log --show`` answers
#: once the run has logged something (a detached run logs a line as each seed starts) and took
#: 12-18 s at load 15-19: a read that does not come back within this time says so (exit 75),
#: it is never taken for an empty log.
RUNNING_LOG_WAIT_SECONDS = 60.0


class AskAgainError(DeploymentError):
    """A detached run's state could not be read now (the SuperLink is down or busy); the run
    itself goes on, or waits for the SuperLink: ``status`` and ``pull`` exit 75, try again."""


def wait_for_secure_nodes(
    submission: Submission,
    options: RuntimeOptions,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Before a run with secure aggregation is submitted (``fedbandit.runs.planning.preflight``,
    once per command, before its folder exists): wait up to ``--start-deadline`` until the
    SuperLink lists enough SuperNodes online (3, or ``--secure-threshold`` when higher), and
    refuse it in one line otherwise, nothing submitted. The ServerApp checks again with the nodes
    that serve the run; a SuperLink that cannot list its nodes (or cannot be reached) leaves the
    check to it."""
    if not options.secure_aggregation or unreachable(submission.superlink):
        return  # an unreachable SuperLink is named by the submission
    from fedbandit.flower.secure_aggregation import MIN_NODES

    needed = max(MIN_NODES, options.secure_threshold or 0)
    deadline = clock() + options.start_deadline
    waiting = False
    while True:
        try:
            left = deadline - clock()
            online = len(submission.online_nodes(timeout=max(5.0, min(30.0, left))))
        except (DeploymentError, ValueError, KeyError, TypeError, AttributeError):
            return
        if online >= needed:
            return
        if clock() >= deadline:
            why = (
                f"--secure-threshold {options.secure_threshold}"
                if needed > MIN_NODES
                else f"SecAgg+ with fewer than {MIN_NODES} nodes lets each learn the others' sum"
            )
            remedy = "start more SuperNodes" + (
                " or lower --secure-threshold" if needed > MIN_NODES else ""
            )
            raise DeploymentError(
                f"secure aggregation needs {needed} or more SuperNodes ({why}), but the SuperLink "
                f"at {submission.superlink} lists {online} online after "
                f"{options.start_deadline:g} s (--start-deadline): {remedy}; nothing was submitted"
            )
        if not waiting:
            print(
                f"fedbandit: waiting up to {options.start_deadline:g} s for {needed} SuperNodes "
                f"(secure aggregation); {online} online",
                file=sys.stderr,
            )
            waiting = True
        sleep(max(0.0, min(NODE_POLL_SECONDS, deadline - clock())))


def run_seed(
    submission: Submission,
    spec: RunSpec,
    run_dir: Path,
    absent_clients: tuple[int, ...] = (),
) -> int:
    """Run one seed of ``spec`` on the deployment and write its result files into ``run_dir``
    (on this machine). Returns the Flower run id.

    The files come back through the Flower run's log, from a SuperLink on any host, reached
    directly, through a tunnel or on loopback alike: the ServerApp is never told a path of the
    driver's, only the folder's name as a hint (``result-hint``: where its host keeps a copy
    when its operator set ``SERVER_RESULTS_VARIABLE``). The log is followed as the run goes
    (``LogStream``), so the end of a seed is noticed when its files have arrived.
    ``absent_clients``: clients lost for good in an earlier seed of the command
    (``--on-client-failure drop``), dropped from this seed at once when no node serves them."""
    from fedbandit.results.files import write_files

    job = FlowerJob(
        spec,
        num_nodes=0,
        poll_seconds=DEPLOYMENT_POLL_SECONDS,
        absent_clients=tuple(sorted(absent_clients)),
    )
    algorithm, seed = spec.algorithm, spec.seed
    run_dir = Path(run_dir).resolve()
    run_config: dict[str, object] = {
        "job": job_to_json(job),
        "seed": seed,
        "result-hint": run_dir.name,
    }
    label = f"{algorithm}-seed{seed}"
    run_id = submission.submit(run_config, label)
    with LogStream(submission, run_id) as stream:
        submission.wait(run_id, label, stream.ended.is_set)
        streamed = stream.text() if stream.ended.is_set() else ""
    write_files(
        run_dir, submission.fetch_result_files(run_id, f"{algorithm} seed {seed}", streamed)
    )
    return run_id


def run_seeds(tasks: list[tuple[RunSpec, Path]], finished: Callable[[RunSpec, Path], bool]) -> None:
    """A command's seeds on the deployment, one Flower run each, one after another; ``finished``
    is called after each seed's files are written and stops the command when it returns False.
    Under ``--on-client-failure drop`` the clients a seed lost go into the following seeds as
    ``absent_clients``: they are dropped at once unless a node serves them again, instead of
    each seed waiting ``--start-deadline`` for them."""
    from fedbandit.results.files import read_json, seed_stem

    lost: set[int] = set()
    for spec, run_dir in tasks:
        submission = Submission.of(spec.options, Path(run_dir))
        run_seed(submission, spec, Path(run_dir), tuple(lost))
        if spec.options.on_client_failure == "drop":
            info = read_json(
                seed_stem(Path(run_dir), spec.algorithm, spec.seed).with_suffix(".json")
            )
            lost |= {int(client) for client in info.get("dropped", {})}
        if not finished(spec, Path(run_dir)):
            return


def submit_detached(submission: Submission, specs: list[RunSpec], run_dir: Path) -> int:
    """Submit ``specs`` (one command's seeds) as one Flower run whose ServerApp runs them one
    after another, and return at once with its run id: each seed's files reach the run's log as
    the seed ends (``detached_state`` reads them back)."""
    jobs = [
        job_to_json(FlowerJob(spec, num_nodes=0, poll_seconds=DEPLOYMENT_POLL_SECONDS))
        for spec in specs
    ]
    run_config = {"jobs": json.dumps(jobs), "seed": -1, "result-hint": Path(run_dir).name}
    return submission.submit(run_config, "detached")


@dataclass(frozen=True)
class DetachedState:
    """What a detached Flower run has done so far: its Flower status, the files of every seed
    that has ended (by (algorithm, seed)), each seed's last progress event, the one-line error
    of a failed run, the emissions that arrived broken, and the run's record (``RUN_RECORD``
    of its latest emission; None before a seed has ended)."""

    status: str
    files: dict[tuple[str, int], dict[str, str]]
    progress: dict[tuple[str, int], str]
    error: str | None
    #: Why an emission of result files in the log could not be read (skipped).
    broken: list[str]
    record: dict[str, object] | None = None


def detached_state(submission: Submission, run_id: int) -> DetachedState:
    """Ask the SuperLink about a detached run (``flwr ls`` and ``flwr log``); every seed's files
    checked against their SHA-256. ``AskAgainError`` when it cannot answer now: unreachable,
    ``flwr ls`` failed, or the log did not come back in time (a slow log is never taken for an
    empty one)."""
    if why := unreachable(submission.superlink):
        raise AskAgainError(
            f"the SuperLink at {submission.superlink} is unreachable ({why}): Flower run "
            f"{run_id} and its results are kept there; ask again when it is back"
        )
    env = submission.environment()
    try:
        status = submission.status(env, run_id)
    except UnknownRunError:
        raise
    except DeploymentError as err:
        raise AskAgainError(
            f"the SuperLink at {submission.superlink} did not say how Flower run {run_id} "
            f"stands ({err}); ask again"
        ) from None
    if not status.startswith(("running", "finished")):
        return DetachedState(status, {}, {}, None, [])  # queued: its log is still empty
    finished = status.startswith("finished")
    wait = FINISHED_LOG_WAIT_SECONDS if finished else RUNNING_LOG_WAIT_SECONDS
    deadline = time.monotonic() + LOG_WAIT_SECONDS
    while True:
        try:
            log = submission.log_text(run_id, timeout=wait)
        except DeploymentError:
            # Not an empty log: a running run that has logged nothing yet and a SuperLink too
            # busy to answer in time look alike, and a finished seed must not look queued.
            raise AskAgainError(
                f"could not read the log of Flower run {run_id} ({status}) in {wait:g} s: "
                "the SuperLink is busy or the run has logged nothing yet; it goes on, ask again"
            ) from None
        broken: list[str] = []
        files: dict[tuple[str, int], dict[str, str]] = {}
        record: dict[str, object] | None = None
        for emission in decode_all(log, f"Flower run {run_id}", broken):
            described, emitted = split_record(emission)
            record = described if described is not None else record
            for path, text in emitted.items():
                if path.endswith(".json"):  # the seed's info names it
                    info = json.loads(text)
                    files[(str(info["algorithm"]), int(info["seed"]))] = emitted
        progress = read_progress(log)
        # A finished run's last lines may reach the SuperLink seconds after it ended.
        late = [key for key in progress if key not in files]
        if not (finished and late) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    marked = [line.split(ERROR_MARK, 1)[1] for line in log.splitlines() if ERROR_MARK in line]
    error = marked[-1] if marked else None
    if error is None and finished and status != "finished:completed":
        error = f"the Flower run ended {status!r}"
    return DetachedState(status, files, progress, error, broken, record)
