"""A detached Flower run read back from its log, from any machine (``fedbandit status`` and
``pull``): the files of the seeds that have ended, their progress, the run's error and its
record (``detached_state``); ``AskAgainError`` when the SuperLink cannot answer now.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass

from fedbandit.errors import DeploymentError
from fedbandit.flower.processes import unreachable
from fedbandit.flower.result_log import decode_all, read_progress
from fedbandit.flower.run_record import split_record
from fedbandit.flower.submission import (
    ERROR_MARK,
    LOG_WAIT_SECONDS,
    Submission,
    UnknownRunError,
    moment,
    relaunched,
    why_not_started,
)

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
    #: Why a run that has not started yet will not start by itself: the SuperLink refused its
    #: ServerApp and launched another (``relaunched``), past its ``--start-deadline``.
    refused: str | None = None


def _refused(submission: Submission, env: dict[str, str], run_id: int) -> str | None:
    """For a run whose ServerApp has not started: why it will not start by itself, once the
    SuperLink has refused a ServerApp of it and launched another (Flower 1.42 goes on doing so
    without limit) and ``submission.start_deadline`` has passed since it was queued; else None."""
    try:
        info = submission.run_info(env, run_id)
    except DeploymentError:
        return None  # asked again at the next pull
    queued = moment(info.get("pending-at"))
    if str(info.get("status")) != "starting" or not relaunched(info) or queued is None:
        return None
    waited = (dt.datetime.now(dt.UTC) - queued).total_seconds()
    if waited < submission.start_deadline:
        return None
    details = str(info.get("status-details") or "")
    launches = [str(info.get("pending-at")), str(info.get("starting-at"))]
    why = why_not_started("starting", launches, details)
    return (
        f"Flower run {run_id} did not start within {submission.start_deadline:g} s "
        f"(--start-deadline): {why}"
    )


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
        status, details = submission.run_status(env, run_id)
    except UnknownRunError:
        raise
    except DeploymentError as err:
        raise AskAgainError(
            f"the SuperLink at {submission.superlink} did not say how Flower run {run_id} "
            f"stands ({err}); ask again"
        ) from None
    if not status.startswith(("running", "finished")):  # queued: its log is still empty
        refused = _refused(submission, env, run_id) if status == "starting" else None
        return DetachedState(status, {}, {}, None, [], refused=refused)
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
        error = ended_because(status, details)
    return DetachedState(status, files, progress, error, broken, record)


#: What the SuperLink says of a run whose ServerApp stopped reporting (Flower 1.42): its
#: heartbeat lapsed (seen after the SuperLink was killed and restarted mid-run), or its run
#: expired.
SERVERAPP_LOST = ("No heartbeat received from the task", "because the run expired")


def ended_because(status: str, details: str) -> str:
    """Why a Flower run ended without completing, from its status and the SuperLink's details:
    a run whose ServerApp's heartbeat lapsed lost its ServerApp mid-run (it stops when its
    SuperLink restarts or becomes unreachable, or was killed); a rerun resumes it."""
    if any(said in details for said in SERVERAPP_LOST):
        return (
            f"the Flower run ended {status!r} mid-run: its ServerApp stopped reporting to the "
            "SuperLink (the SuperLink was restarted or unreachable, or the ServerApp was killed; "
            f"Flower: {details!r}); the seeds that ended are kept, rerun to do the others"
        )
    if details:
        return f"the Flower run ended {status!r} (Flower: {details!r})"
    return f"the Flower run ended {status!r}"
