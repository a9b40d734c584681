"""ServerApp and ClientApp driving fedbandit's server and client logic; the job they share.

A (virtual) SuperNode hosts one client group: a contiguous range of logical clients. Every message
is handled by rebuilding the group from the job description and restoring its state from
``context.state`` (a Flower deployment starts a fresh ClientApp process per message), so nodes keep
only arrays. The ServerApp builds the server logic through ``fedbandit.simulation.build_server``,
learns each node's range before round 1 (``discover_nodes``: the ranges must cover every client
exactly once) and runs ``run_federation`` over a ``FlowerGridRuntime``
(``fedbandit.flower.grid_runtime``). What travels, and how the state is kept in
``context.state``, is ``fedbandit.flower.codec``'s.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from logging import ERROR, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from fedbandit import secure_sum
from fedbandit.config import validate_experiment
from fedbandit.errors import DeploymentError, FedbanditError
from fedbandit.federation import Message as BanditMessage
from fedbandit.federation.protocol import ClientLogic, ServerLogic
from fedbandit.federation.run_ahead import Ahead, rewind, run_ahead
from fedbandit.federation.runtime import FederationResult, run_federation
from fedbandit.flower.codec import (
    answer_regret_query,
    clear_group_state,
    decode,
    decode_ahead,
    decode_state,
    encode,
    encode_ahead,
    encode_hello,
    encode_state,
    encode_steps,
    get_ahead,
    remember_reply,
    remembered_reply,
    request_key,
    set_handler_seconds,
)
from fedbandit.flower.grid_runtime import FlowerGridRuntime, discover_nodes
from fedbandit.flower.internals import pull_backoff, server_error_retry
from fedbandit.flower.job import FlowerJob, job_from_json, job_to_json
from fedbandit.flower.processes import unreachable
from fedbandit.flower.result_log import encode_files, progress_line, write_line
from fedbandit.flower.run_record import keep_on_server, run_record
from fedbandit.flower.secure_aggregation import (
    MIN_CONTRIBUTORS,
    MIN_NODES,
    SecureRequest,
    SecureSettings,
    close_session,
    count_reply,
    declaration_mismatch,
    held_values,
    open_session,
    secure_reply,
    slotted_secaggplus_mod,
    unwrap_request,
)
from fedbandit.flower.submission import ERROR_MARK
from fedbandit.instances import Instance, data_files
from fedbandit.registry import build_instance
from fedbandit.simulation import SeedResult, build_federation, build_server

# fedbandit.results loads pandas (a fifth of a second): the ServerApp imports it where it writes
# a seed's files, so that a ClientApp process (one per message with a cold SuperNode) does not.

#: Seconds between a detached run's progress lines in its log (at most one per round).
PROGRESS_SECONDS = 5.0

__all__ = [
    "FlowerGridRuntime",  # re-exported from fedbandit.flower.grid_runtime
    "FlowerJob",  # re-exported from fedbandit.flower.job
    "NodeStore",
    "build_client_app",
    "build_server_app",
    "discover_nodes",  # re-exported from fedbandit.flower.grid_runtime
    "job_from_json",  # re-exported from fedbandit.flower.job
    "job_to_json",  # re-exported from fedbandit.flower.job
    "latency_file",
    "node_clients",
]


@functools.lru_cache(maxsize=4)
def _instance(config_json: str) -> Instance:
    return build_instance(validate_experiment(json.loads(config_json)).instance)


def _instance_of(job: FlowerJob) -> Instance:
    """The job's instance, built once per process (a warm executor serves many messages)."""
    return _instance(job.config.model_dump_json())


#: What a simulation's ServerApp calls after each seed: (job, outcome, seconds) -> go on?
SeedDone = Callable[[FlowerJob, FederationResult, float], bool]
#: The ``context.state`` record that names the job whose client state the node holds.
JOB_RECORD = "fedbandit-job"


def _jobs(jobs: FlowerJob | Sequence[FlowerJob] | None) -> list[FlowerJob] | None:
    return [jobs] if isinstance(jobs, FlowerJob) else None if jobs is None else list(jobs)


@functools.lru_cache(maxsize=4)
def _jobs_of_run(text: str) -> list[FlowerJob] | None:
    """The jobs of a detached deployment run (its run config's ``jobs``: a JSON list of jobs),
    run one after another by one ServerApp; None for a run of one ``job``."""
    return [job_from_json(job) for job in json.loads(text)] if text else None


def _job(jobs: list[FlowerJob] | None, message: Message, context: Context) -> FlowerJob:
    """The job of ``message``: one of those given to the app builder (a simulation runs several,
    one after another; the message's ``group_id`` is its index), or the one the run config
    carries (a deployment runs one job per Flower run). A node that held another job's client
    state forgets it first: every job starts from its own fresh client groups."""
    key = message.metadata.group_id or "0"
    if jobs is None:
        jobs = _jobs_of_run(str(context.run_config.get("jobs", "")))
    if jobs is None:
        job = job_from_json(str(context.run_config.get("job", "")))
    else:
        if not key.isdigit() or int(key) >= len(jobs):
            raise ValueError(f"message of unknown job {key!r}: this app runs {len(jobs)} job(s)")
        job = jobs[int(key)]
    held = context.state.config_records.get(JOB_RECORD)
    if held is None or held["id"] != key:
        clear_group_state(context.state)
        context.state.config_records[JOB_RECORD] = ConfigRecord({"id": key})
    return job


def node_clients(num_clients: int, partition: int, num_partitions: int) -> np.ndarray:
    """The contiguous client range of node ``partition`` of ``num_partitions``."""
    if not 0 <= partition < num_partitions or num_partitions > num_clients:
        raise ValueError(f"partition {partition} of {num_partitions} for {num_clients} clients")
    return np.array_split(np.arange(num_clients, dtype=np.int64), num_partitions)[partition]


class NodeStore:
    """A node's client statistics on disk, so that a restarted SuperNode resumes a run.

    One file per run, job and client range, ``STATE_DIR/run-ID/clients-FIRST-COUNT.npz`` (a
    detached run's job K > 0: ``run-ID/job-K/...``), holds the
    state after the last round the node handled, the state before it, and that round's number: a
    round delivered again (its reply was lost with the old process) is handled again from the
    state before it, which gives the same reply, since the state includes every random stream.
    Written atomically (temporary file, then rename) after every round.
    """

    def __init__(
        self, directory: Path, run_id: int, client_ids: np.ndarray, job: str = "0"
    ) -> None:
        first, count = int(client_ids[0]), len(client_ids)
        folder = Path(directory) / f"run-{run_id}"
        if job != "0":  # a detached run's later jobs: each seed its own state
            folder = folder / f"job-{job}"
        self.path = folder / f"clients-{first}-{count}.npz"

    def load(self) -> tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]] | None:
        """(round, state before it, state after it), or None when nothing was saved."""
        if not self.path.is_file():
            return None
        with np.load(self.path, allow_pickle=False) as data:
            parts: dict[str, dict[str, np.ndarray]] = {"before": {}, "after": {}}
            for key in data.files:
                part, _, name = key.partition(":")
                if part in parts:
                    parts[part][name] = data[key]
            return int(data["round"]), parts["before"], parts["after"]

    def save(self, round_: int, before: dict[str, np.ndarray], after: dict[str, np.ndarray]):
        arrays = {
            "round": np.array(round_),
            **{f"before:{k}": v for k, v in before.items()},
            **{f"after:{k}": v for k, v in after.items()},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(temporary, "wb") as handle:
            np.savez(handle, allow_pickle=False, **arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)


def _store(context: Context, client_ids: np.ndarray) -> NodeStore | None:
    """The node's store when it was started with a state folder (``--persist``)."""
    directory = context.node_config.get("state-dir")
    if not directory:
        return None
    held = context.state.config_records.get(JOB_RECORD)  # set by ``_job`` for this message
    job = str(held["id"]) if held is not None else "0"
    return NodeStore(Path(str(directory)), context.run_id, client_ids, job)


def _copy(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {key: np.array(value, copy=True) for key, value in state.items()}


def _client_logic(
    job: FlowerJob, context: Context, round_: int | None = None
) -> tuple[ClientLogic, NodeStore | None]:
    """The node's client group with its state: from ``context.state`` when the SuperNode kept
    it, else from the node's store (a restarted SuperNode): the state before ``round_`` when
    that round was already handled, else the latest."""
    config = job.config
    instance = _instance_of(job)
    node = context.node_config
    if "first-client" in node:
        first, count = int(node["first-client"]), int(node["num-clients"])
        ids = np.arange(first, first + count, dtype=np.int64)
    else:
        ids = node_clients(
            instance.num_clients, int(node["partition-id"]), int(node["num-partitions"])
        )
    _, groups = build_federation(
        instance,
        job.algorithm,
        config.horizon,
        job.entropy,
        config.hyperparameters(job.algorithm),
        client_ids=ids,
    )
    logic = groups[0]
    store = _store(context, logic.client_ids)
    state = decode_state(context.state)
    if state is None and store is not None:
        saved = store.load()
        if saved is not None:
            handled, before, after = saved
            logic.load_state_dict(before if handled == round_ else after)
            return logic, store
    if state is not None:
        logic.load_state_dict(state)
    return logic, store


def answered_once(
    handler: Callable[[Message, Context], Message],
) -> Callable[[Message, Context], Message]:
    """``handler``, answering a request it answered last (the same ``request_key``) with the
    kept answer instead of doing the work again: the ServerApp sends a request again when the
    reply's upload was lost (``FlowerGridRuntime``), and a client group's state must advance
    once per round. The answer is kept in ``context.state``, which the SuperNode keeps."""

    @functools.wraps(handler)
    def answer_once(message: Message, context: Context) -> Message:
        key = request_key(message)
        kept = remembered_reply(key, context.state)
        if kept is not None:
            log(WARNING, "%s asked again: sending the kept answer", message.metadata.message_type)
            return Message(kept, reply_to=message)
        reply = handler(message, context)
        remember_reply(key, reply.content, context.state)
        return reply

    return answer_once


def build_client_app(jobs: FlowerJob | Sequence[FlowerJob] | None = None) -> ClientApp:
    """The ClientApp of ``jobs`` (a simulation: each message names its job by ``group_id``);
    without them (a deployment) each message reads its job from the run config."""
    app = ClientApp()
    known = _jobs(jobs)

    @app.query("hello")
    def hello(message: Message, context: Context) -> Message:
        logic, _ = _client_logic(_job(known, message, context), context)
        return Message(encode_hello(logic.client_ids), reply_to=message)

    def answer(
        message: Message,
        content: RecordDict,
        context: Context,
        hold: SecureRequest | None = None,
        dry: bool = False,
    ) -> tuple[ClientLogic, list[BanditMessage]]:
        """The group and its replies to the encoded request ``content``: one, or with run-ahead
        instructions those of every exchange it ran; its state kept for the next message unless
        ``dry`` (a secure count: the same request comes again). ``hold``: a secure sum's
        request, whose held-back blocks the clients keep (``hold`` field)."""
        request = decode(content)
        job = _job(known, message, context)
        logic, store = _client_logic(job, context, request.round)
        if hold is not None and getattr(logic, "HOLDS_SECURE_BLOCKS", False):
            request = dataclasses.replace(
                request, fields={**request.fields, "hold": hold.hold(request.num_clients)}
            )
        control = get_ahead(content)
        if control is not None:
            _rewind(logic, context, control[1], dry)
        before = _copy(logic.state_dict()) if store is not None and not dry else {}
        if control is None:
            replies = [logic.handle(request)]
        else:
            secure = job.spec.options.secure_aggregation
            replies, ahead = run_ahead(logic, request, control[0], stop_before_upload=secure)
            if not dry:
                encode_ahead(ahead, context.state)
        if dry:
            return logic, replies
        encode_state(logic.state_dict(), context.state)
        if store is not None:
            store.save(request.round, before, logic.state_dict())
        return logic, replies

    @app.train("step")
    @answered_once
    def step(message: Message, context: Context) -> Message:
        started = time.perf_counter()
        _, replies = answer(message, message.content, context)
        if get_ahead(message.content) is None:
            content = encode(replies[0])
        else:
            content = encode_steps(replies)
        set_handler_seconds(content, time.perf_counter() - started)
        return Message(content, reply_to=message)

    @app.train(mods=[slotted_secaggplus_mod])
    def secure_step(message: Message, context: Context) -> Message:
        """An exchange under secure aggregation (``fedbandit.flower.secure_aggregation``):
        ``secaggplus_mod`` (one state per slot: ``slotted_secaggplus_mod``) runs SecAgg+'s
        stages and calls this with the node's request; the reply's summed fields go back
        masked, the rest in the clear."""
        started = time.perf_counter()
        request = unwrap_request(message.content)
        summed = request.summed
        count = request.phase == "count"
        logic, replies = answer(message, request.content, context, request, dry=count)
        if len(replies) != 1:
            raise RuntimeError(f"a secure exchange ran {len(replies)} exchanges, expected 1")
        summable = logic.summable(replies[0], summed)
        seconds = time.perf_counter() - started
        if count:
            holds = bool(getattr(logic, "HOLDS_SECURE_BLOCKS", False))
            return Message(count_reply(summable, summed, holds, seconds), reply_to=message)
        if leaked := held_values(summable, summed, request.held):
            raise RuntimeError(f"the clients did not hold back blocks {request.held} of {leaked}")
        if request.expect is not None and (
            mismatch := declaration_mismatch(summable, summed, request.expect)
        ):
            raise RuntimeError(
                "the clients' values do not match the contributors the server declared ("
                + "; ".join(mismatch)
                + "): not sent"
            )
        return Message(secure_reply(summable, summed, seconds), reply_to=message)

    @app.query("regret")
    def regret(message: Message, context: Context) -> Message:
        logic = _client_logic(_job(known, message, context), context)[0]
        control = get_ahead(message.content)
        if control is not None:
            _rewind(logic, context, control[1])
            encode_state(logic.state_dict(), context.state)
        return Message(
            answer_regret_query(logic.regret_record(), message.content), reply_to=message
        )

    return app


def _rewind(logic: ClientLogic, context: Context, consumed: int, dry: bool = False) -> None:
    """Bring a group that ran ahead in its last delivery back to the ``consumed`` exchanges the
    server used (0: nothing to do), from its run-ahead memory in ``context.state`` (kept as it
    is when ``dry``)."""
    if consumed == 0:
        return
    ahead = decode_ahead(context.state, logic.client_ids)
    if ahead is None:
        raise RuntimeError(
            f"asked to go back to exchange {consumed} of the last delivery, but this node holds "
            "no run-ahead memory (was it restarted?)"
        )
    rewind(logic, ahead, consumed)
    if not dry:
        encode_ahead(Ahead(None, ahead.first, min(consumed, ahead.ran)), context.state)


def build_server_app(
    jobs: FlowerJob | Sequence[FlowerJob] | None = None,
    on_seed: SeedDone | None = None,
    stop: threading.Event | None = None,
) -> ServerApp:
    """The ServerApp. With ``jobs`` (a simulation) it runs them one after another on the same
    nodes, each with its own client groups (its messages carry its index as ``group_id``), and
    hands each outcome to ``on_seed`` (also kept in ``job.results``); ``on_seed`` returning
    False, or ``stop`` being set, ends the run before the next job. Without ``jobs`` (a
    deployment) it reads its one job from the run config and sends each seed's result files, with
    the run's record, through the run's log (``_write_result``; a copy on the SuperLink host only
    in the folder its operator configured, ``fedbandit superlink --results-dir``)."""
    app = ServerApp()
    known = _jobs(jobs)

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        if known is None:
            deployed(grid, context)
            return
        for index, job in enumerate(known):
            if stop is not None and stop.is_set():
                return
            started = time.perf_counter()
            run(job, grid, str(index))
            if on_seed is not None and not on_seed(
                job, job.results[-1], time.perf_counter() - started
            ):
                return

    def deployed(grid: Grid, context: Context) -> None:
        started = time.perf_counter()
        if (address := runtime_api_address(sys.argv)) is not None:
            exit_when_unreachable(address)
        try:
            detached = _jobs_of_run(str(context.run_config.get("jobs", "")))
            if detached is not None:
                run_detached(detached, grid, context)
                return
            job = job_from_json(str(context.run_config.get("job", "")))
            # the replies' objects: short waits, and a dead uploader costs a share of the round
            pull_backoff.install(pull_backoff.SERVERAPP_MODULE, round_timeout=job.round_timeout)
            server_error_retry.install_serverapp(grid)
            run(job, grid, "")
            _write_result(job, context, time.perf_counter() - started)
        except FedbanditError as err:  # foreseen: the driver shows this line, not the traceback
            log(ERROR, "%s%s", ERROR_MARK, err)
            raise

    def run_detached(jobs: list[FlowerJob], grid: Grid, context: Context) -> None:
        """A detached command's seeds, one after another, each job's messages in its own group;
        each seed's files go into the log as it ends, with progress lines in between. A seed
        aborted under ``on_client_failure = "abort"`` ends the run, as in an attached command."""
        pull_backoff.install(pull_backoff.SERVERAPP_MODULE, round_timeout=jobs[0].round_timeout)
        server_error_retry.install_serverapp(grid)
        for index, job in enumerate(jobs):
            started = time.perf_counter()
            algorithm, seed = job.algorithm, job.spec.seed
            write_line(progress_line(algorithm, seed, "start"))
            run(job, grid, str(index), RoundReporter(algorithm, seed))
            result = _write_result(job, context, time.perf_counter() - started)
            if result.status == "aborted" and job.on_client_failure == "abort":
                write_line(progress_line(algorithm, seed, "stopped"))
                return

    def run(
        job: FlowerJob, grid: Grid, group: str, on_round: Callable[[int], None] | None = None
    ) -> None:
        config = job.config
        instance = _instance_of(job)
        server = build_server(
            instance, job.algorithm, config.horizon, config.hyperparameters(job.algorithm)
        )
        ranges = discover_nodes(grid, job, instance.num_clients, group, stop)
        secure = _secure_settings(job, server, len(ranges))
        runtime = FlowerGridRuntime(
            grid,
            ranges,
            job.round_timeout,
            job.poll_seconds,
            job.reconnect_seconds,
            job.spec.options.run_ahead_budget,
            group,
            stop,
            secure,
            # a SuperNode answers one message at a time: keys set up ahead never overlap a stage
            prepare_keys=job.spec.options.runtime == "flower",
        )
        runtime.on_round = on_round
        if secure is not None:
            open_session(grid, secure.min_contributors)
        try:
            outcome = run_federation(server, runtime, job.on_client_failure)
        finally:
            runtime.close()  # keys set up ahead for an exchange that will not come
            session = close_session(grid)
        if secure is not None:
            outcome.report["secure_aggregation"] = {
                "threshold": secure.threshold_for(len(ranges)),
                "nodes": len(ranges),
                **runtime.secure_report,
                **session.report(),
            }
            _report_clipped(job, runtime.secure_report.get("clipped_values", 0))
        job.results.append(outcome)
        job.timings[:] = runtime.timings

    return app


def _secure_settings(job: FlowerJob, server: ServerLogic, num_nodes: int) -> SecureSettings | None:
    """The run's secure aggregation, or None without it; a DeploymentError when fewer than
    ``MIN_NODES`` nodes serve the clients (the runner refuses algorithms with nothing to sum)."""
    options = job.spec.options
    if not options.secure_aggregation:
        return None
    if num_nodes < MIN_NODES:
        raise DeploymentError(
            f"secure aggregation needs {MIN_NODES} or more nodes, but {num_nodes} serve the "
            f"clients: start more SuperNodes, each with its own --clients range"
        )
    minimum = getattr(options, "secure_min_contributors", None) or MIN_CONTRIBUTORS
    settings = SecureSettings(
        server.secure_fields,
        options.secure_threshold,
        minimum,
        server.secure_contributors,
        server.secure_follows,
    )
    if num_nodes > secure_sum.MAX_NODES:
        raise DeploymentError(
            f"secure aggregation sums at most {secure_sum.MAX_NODES} nodes (SecAgg+'s modulus "
            f"2^32), but {num_nodes} serve the clients: give each SuperNode more clients"
        )
    if settings.threshold is not None and settings.threshold > num_nodes:
        raise DeploymentError(
            f"secure_threshold {settings.threshold} asks for more surviving nodes than the "
            f"{num_nodes} that serve the clients: lower --secure-threshold or start more "
            "SuperNodes"
        )
    return settings


def _report_clipped(job: FlowerJob, clipped: int) -> None:
    """Say on the terminal (the ServerApp's log, which a simulation and an attached deployment
    show) that secure aggregation clipped values at +-2^52: the sums are then wrong."""
    if clipped:
        log(
            WARNING,
            "%s seed %d: secure aggregation clipped %d value(s) at +-2^%d; the sums that held "
            "them are wrong (a statistic that large is a bug upstream: "
            "report.secure_aggregation.clipped_values)",
            job.algorithm,
            job.spec.seed,
            clipped,
            secure_sum.INTEGER_BITS,
        )


class RoundReporter:
    """Prints a seed's round into the run's log, at most every ``PROGRESS_SECONDS``."""

    def __init__(self, algorithm: str, seed: int) -> None:
        self.algorithm, self.seed = algorithm, seed
        self.last = -PROGRESS_SECONDS

    def __call__(self, round_: int) -> None:
        if time.monotonic() - self.last >= PROGRESS_SECONDS:
            self.last = time.monotonic()
            write_line(progress_line(self.algorithm, self.seed, f"round {round_}"))


def runtime_api_address(argv: list[str]) -> str | None:
    """The SuperLink's ServerApp API, ``--runtime-api-address HOST:PORT`` of ``flwr-serverapp``."""
    for flag, value in itertools.pairwise(argv):
        if flag == "--runtime-api-address":
            return value
    return None


def exit_when_unreachable(
    address: str, grace_seconds: float = 15.0, every_seconds: float = 1.0
) -> threading.Thread:
    """Stop this ServerApp process when its SuperLink has refused connections for
    ``grace_seconds``: Flower's ServerApp otherwise retries without limit after its SuperLink
    died. Logs why, then interrupts the process as Flower does for a stopped run (SIGINT: its
    exit handlers run), and ends it if that has not within 10 s."""

    def watch() -> None:
        lost_since: float | None = None
        while True:
            time.sleep(every_seconds)
            if unreachable(address, timeout=every_seconds) is None:
                lost_since = None
                continue
            lost_since = lost_since if lost_since is not None else time.monotonic()
            if time.monotonic() - lost_since >= grace_seconds:
                break
        log(
            ERROR,
            "%sthe SuperLink at %s is unreachable (for %g s); this ServerApp stops",
            ERROR_MARK,
            address,
            grace_seconds,
        )
        # process-directed: delivered to the main thread, whatever wait it is in (a signal
        # raised from this thread would wait for the main thread to run Python code)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
        os._exit(1)

    thread = threading.Thread(target=watch, name="superlink-watch", daemon=True)
    thread.start()
    return thread


def _write_result(job: FlowerJob, context: Context, seconds: float) -> SeedResult:
    """Send the finished seed's files to the driver through the run's log
    (``fedbandit.flower.result_log``), with the run's record (``run_record.run_record``: what
    ``fedbandit pull --run-id`` rebuilds a lost folder from). Nothing is written where the
    driver says: a copy stays on this host only in the folder its operator named
    (``run_record.keep_on_server``)."""
    from fedbandit.results.files import seed_files  # pandas: the ServerApp's end only

    outcome = job.results.pop()
    files_read = data_files(_instance_of(job))
    result = SeedResult.of(job.algorithm, job.entropy, outcome, seconds, data_files=files_read)
    files = {
        **latency_file(job.algorithm, job.spec.seed, job.timings),
        **seed_files(job.config, job.spec.seed, result),
    }
    for line in encode_files({**run_record(job, context), **files}):
        write_line(line)
    keep_on_server(context, files)
    return result


def latency_file(algorithm: str, seed: int, timings: list[dict[str, Any]]) -> dict[str, str]:
    """``seed_K.latency.csv`` as (relative path, text): per exchange the server compute, Flower
    transport and client compute seconds (transport = exchange wall time minus the slowest
    node's handler)."""
    import pandas as pd  # a fifth of a second to import: only where a latency table is written

    from fedbandit.results.files import seed_stem

    frame = pd.DataFrame(timings, columns=["round", "kind", "server_s", "exchange_s", "client_s"])
    frame["transport_s"] = frame["exchange_s"] - frame["client_s"]
    path = seed_stem(Path("."), algorithm, seed).with_suffix(".latency.csv")
    return {str(path): frame.to_csv(index=False)}
