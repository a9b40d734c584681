"""A command's seeds on a Flower deployment: one Flower run each, submitted and awaited
(``run_seed``, ``run_seeds``), or all in one detached run submitted at once (``submit_detached``);
before either, a secure run waits for enough SuperNodes (``wait_for_secure_nodes``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fedbandit.errors import DeploymentError
from fedbandit.flower.job import FlowerJob, job_to_json
from fedbandit.flower.processes import unreachable
from fedbandit.flower.submission import LogStream, Submission
from fedbandit.runspec import RunSpec, RuntimeOptions

# fedbandit.results (pandas, a fifth of a second) is imported by run_seed and run_seeds, which
# write and read a seed's files: the modules that import this one stay quick to import for
# `fedbandit --help`.

#: Seconds between the ServerApp's pulls for replies (each is a request to the SuperLink).
DEPLOYMENT_POLL_SECONDS = 0.05
#: Seconds between the driver's looks at the SuperNodes online, while a secure run waits for
#: enough of them before it is submitted (``wait_for_secure_nodes``).
NODE_POLL_SECONDS = 2.0


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
