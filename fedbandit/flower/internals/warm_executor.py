"""A warm ClientApp executor for ``flower-supernode --isolation process``.

In Flower's default ``--isolation subprocess`` a SuperNode starts ``flower-superexec``, which polls
the SuperNode's runtime API (``AcquireTask``) and spawns a fresh ``flwr-clientapp`` process for
every message; importing Flower and fedbandit there costs seconds per message. With
``--isolation process`` the SuperNode starts no executor: this module is one, long-lived, that
acquires the tasks itself and runs each one *in this process*, in the main thread, one at a time
(a SuperNode hands out one message at a time anyway), doing what
``flwr.supernode.runtime.run_clientapp`` does: pull the task input, install the FAB (once per
hash), load the ClientApp (once per (fab_id, version, hash)), call it, push the reply (or the error
reply Flower makes when the ClientApp raises) and the task output with the updated context, and
send task heartbeats meanwhile. Unlike ``flwr-clientapp`` it never registers exit handlers or calls
``flwr_exit`` per task; a failing task leaves the executor running.

It exits on SIGTERM/SIGINT and when the ``--parent-pid`` process (its SuperNode) is gone, in
whatever it is doing: ``stop`` (a signal handler, or the thread that watches the SuperNode) makes
every retried request give up at once, interrupts the main thread with a process-directed SIGTERM
(a signal raised from another thread would not interrupt a wait in the main thread, such as
Flower's wait for the object pulls and pushes of a task), and ends the process with ``os._exit``
if it is still there ``STOP_GRACE_SECONDS`` later. No request to the SuperNode is retried for more
than ``RETRY_SECONDS``. ``fedbandit.flower.internals.supernode_main --warm-executor`` starts one
next to the SuperNode.

Differences from ``flwr-clientapp``, all deliberate: the objects of a task's message are asked
for again after 0.02-0.2 s, not 1-10 s (the task is acquired before the SuperNode has them), and
for at most ``OBJECT_PULL_SECONDS``, not two hours (a task of a run whose SuperLink died would
otherwise keep the node from serving any other run);
failed requests are retried without Flower's SIGINT to the whole process on HTTP 401; a rejected
heartbeat logs a warning instead of interrupting the task. The ClientApp's module state lives on
between messages (fedbandit's apps keep only caches; their state travels in ``context.state``),
and a ClientApp that never returns blocks its node, as a hung ``flwr-clientapp`` would.

It uses Flower's own runtime client and task functions, several of them internal, so it is pinned
to Flower 1.42 and refuses to start on any other version. Not supported: runtime dependency
installation, SuperExec authentication (``--superexec-auth-secret-file``), AgentApp tasks.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from pathlib import Path
from types import FrameType
from typing import Any

from fedbandit.flower.internals import require_flower

_HELP = "run the SuperNode with Flower's own executor instead (`fedbandit supernode --cold`)"
_flwr_version = require_flower("warm ClientApp executor", _HELP)
try:
    import httpx
    from flwr.app import Context, Message
    from flwr.app.error import Error
    from flwr.cli.install import install_from_fab
    from flwr.clientapp.client_app import ClientApp, LoadClientAppError
    from flwr.clientapp.utils import get_load_client_app_fn
    from flwr.common.config import get_project_dir
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.node_pb2 import Node
    from flwr.proto.runtime_pb2 import (
        AcquireTaskRequest,
        PullAppMessagesRequest,
        PullTaskInputRequest,
        SendTaskHeartbeatRequest,
    )
    from flwr.supercore import log
    from flwr.supercore.address import resolve_bind_address
    from flwr.supercore.constant import TaskType
    from flwr.supercore.fab import Fab
    from flwr.supercore.heartbeat import HeartbeatSender
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import (
        ObjectPullError,
        pull_and_inflate_object_from_tree,
    )
    from flwr.supercore.interceptors import (
        RuntimeTokenHttpInterceptor,
        RuntimeVersionHttpInterceptor,
    )
    from flwr.supercore.retry.http_retry import (
        _RETRYABLE_STATUS_CODES,
        _RETRYABLE_TRANSPORT_ERRORS,
    )
    from flwr.supercore.retry.retry_invoker import RetryInvoker, exponential
    from flwr.supercore.run import Run
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import push_message, push_task_output
except ImportError as err:  # pragma: no cover - only with a changed Flower
    raise RuntimeError(
        f"fedbandit's warm ClientApp executor cannot import the Flower internals it uses "
        f"({err}); flwr {_flwr_version} is installed: {_HELP}"
    ) from err

#: Seconds between ``AcquireTask`` polls when idle (Flower's SuperExec reads the same variable).
POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
DEFAULT_POLL_SECONDS = 0.1
#: Longest wait between retries of a failed runtime API request (Flower's: 20 s).
MAX_RETRY_DELAY = 2
#: Longest a runtime API request is retried (transport errors, HTTP 502-504) before it fails:
#: the SuperNode is gone (Flower's: without limit, which kept an orphaned executor waiting).
RETRY_SECONDS = 30.0
#: Seconds a stopping executor has for its clean-up (the running task reported failed, clients
#: closed, threads joined) before ``os._exit`` ends it.
STOP_GRACE_SECONDS = 5.0
#: Set once the executor is stopping: no request is retried any more.
STOPPING = threading.Event()
#: Modules imported at start-up so that the first task does not pay for them.
DEFAULT_PRELOAD = ("fedbandit.flower.apps",)
LOAD_ERROR_REASON = "An exception was raised when attempting to load `ClientApp`"
#: First and longest wait (s) before asking again for an object of the task's message that the
#: SuperNode does not hold yet (Flower's: 1 and 10).
PULL_BACKOFF = (0.02, 0.2)
#: Seconds a task waits for its message's objects before the executor gives up on it and goes
#: back to serving (Flower's: 7200). They never come when the SuperLink died or stopped the run.
OBJECT_PULL_SECONDS = 60.0


def error_of(ex: BaseException) -> tuple[int, str]:
    """The (error code, reason) of the error reply Flower sends when a task raises ``ex``."""
    if isinstance(ex, LoadClientAppError):
        return ErrorCode.LOAD_CLIENT_APP_EXCEPTION, LOAD_ERROR_REASON
    # Flower's format, e.g. "<class 'ZeroDivisionError'>:<'division by zero'>"
    return ErrorCode.CLIENT_APP_RAISED_EXCEPTION, str(type(ex)) + ":<'" + str(ex) + "'>"


def retry_invoker(*closing: threading.Event) -> RetryInvoker:
    """Flower's HTTP retry policy (transport errors, 502/503/504) without its side effects:
    ``make_simple_http_retry_invoker`` sends SIGINT to the whole process on HTTP 401 (an expired
    task token), which would stop this executor. Once any ``closing`` event (or ``STOPPING``) is
    set nothing is retried (as flwr-clientapp's exit handler does), and no request is retried for
    longer than ``RETRY_SECONDS``."""

    def give_up(exc: Exception) -> bool:
        if STOPPING.is_set() or any(event.is_set() for event in closing):
            return True
        return (
            isinstance(exc, httpx.HTTPStatusError)
            and exc.response.status_code not in _RETRYABLE_STATUS_CODES
        )

    def wait(seconds: float) -> None:
        closing[0].wait(seconds)

    return RetryInvoker(
        lambda: exponential(max_delay=MAX_RETRY_DELAY),
        (*_RETRYABLE_TRANSPORT_ERRORS, httpx.HTTPStatusError),
        max_tries=None,
        max_time=RETRY_SECONDS,
        should_giveup=give_up,
        wait_function=wait,
    )


def heartbeat_fn(client: RuntimeHttpClient) -> Callable[[], bool]:
    """``make_task_heartbeat_fn_http`` without its SIGINT when the SuperNode no longer knows the
    task (an in-process ClientApp cannot be interrupted safely): a warning instead."""
    request = SendTaskHeartbeatRequest()

    def send() -> bool:
        try:
            reply = client.SendTaskHeartbeat(request)
        except httpx.TransportError:
            return False
        except httpx.HTTPStatusError as err:
            if err.response.status_code in (503, 504):
                return False
            raise
        if not reply.success:
            log(WARNING, "[warm-executor] the SuperNode rejected a task heartbeat (task expired?)")
        return True

    return send


def pull_task_input(client: RuntimeHttpClient) -> tuple[Message, Context, Run, Fab]:
    """``flwr.supernode.runtime.run_clientapp.pull_task_input`` with a short retry backoff.

    The SuperNode creates the task before it fetches the message's objects from the SuperLink, and
    a warm executor acquires the task at once: Flower's backoff (1, 2, 4 ... s, fine for a process
    that takes seconds to start) would make it wait seconds longer than needed."""
    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context = context_from_proto(res.context)
    run, fab = run_from_proto(res.run), fab_from_proto(res.fab)
    messages = client.PullMessages(PullAppMessagesRequest())
    if not messages.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node = Node(node_id=context.node_id)
    tree = messages.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(
            client.ConfirmMessageReceived, node, context.run_id
        ),
        return_type=Message,
        max_time=OBJECT_PULL_SECONDS,
        max_tries_per_object=None,  # bounded by max_time instead
        initial_backoff=PULL_BACKOFF[0],
        backoff_cap=PULL_BACKOFF[1],
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # not part of the deflated message
    return message, context, run, fab


@dataclass
class AppCache:
    """Installed FABs (by hash) and loaded ClientApps (by fab_id, version, hash).

    Flower imports an app's modules by name and keeps them in ``sys.modules``; before another
    FAB's app is loaded the modules of the apps loaded so far are forgotten (the loaded ClientApp
    objects stay usable), so that a new FAB is never served by an old FAB's module."""

    install: Callable[[bytes], Any] = field(
        default=lambda content: install_from_fab(content, skip_prompt=True)
    )
    load: Callable[[str, str, str], ClientApp] = field(
        default_factory=lambda: get_load_client_app_fn("", None, multi_app=True)
    )
    project_dir: Callable[[str, str, str], Path] = get_project_dir
    installed: set[str] = field(default_factory=set)
    apps: dict[tuple[str, str, str], ClientApp] = field(default_factory=dict)

    def client_app(self, run: Run, fab: Fab) -> ClientApp:
        if fab.hash_str not in self.installed:
            self.install(fab.content)
            self.installed.add(fab.hash_str)
        key = (run.fab_id, run.fab_version, fab.hash_str)
        if key not in self.apps:
            for other in self.apps:
                forget_modules(Path(self.project_dir(*other)))
            self.apps[key] = self.load(*key)
        return self.apps[key]


def forget_modules(directory: Path) -> None:
    """Drop the modules loaded from ``directory`` from ``sys.modules``, and it from ``sys.path``."""
    root = directory.resolve()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and Path(path).resolve().is_relative_to(root):
            del sys.modules[name]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != root]


class WarmExecutor:
    """Acquires the ClientApp tasks of one SuperNode and runs them in this process."""

    def __init__(
        self,
        runtime_api_address: str,
        root_certificates: bytes | None = None,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        apps: AppCache | None = None,
    ) -> None:
        self.address, self.certificates = runtime_api_address, root_certificates
        self.poll_seconds = poll_seconds
        self.apps = apps if apps is not None else AppCache()
        #: Set on shutdown: requests are no longer retried.
        self.closing = threading.Event()
        self.tasks = 0

    def _client(
        self, component: str, token: str | None = None, *closing: threading.Event
    ) -> RuntimeHttpClient:
        interceptors: list[Any] = [
            RuntimeTracingInterceptor(),
            RuntimeVersionHttpInterceptor(component_name=component),
        ]
        if token is not None:
            interceptors.append(RuntimeTokenHttpInterceptor(token))
        return RuntimeHttpClient.from_server_address(
            server_address=self.address,
            insecure=self.certificates is None,
            root_certificates=self.certificates,
            interceptors=interceptors,
            retry_invoker=retry_invoker(self.closing, *closing),
        )

    def serve(self) -> None:
        """Poll for tasks and run them until interrupted (SIGTERM/SIGINT, SuperNode gone)."""
        client = self._client("SuperExec")
        request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value])
        try:
            while True:
                try:
                    reply = client.AcquireTask(request)
                except Exception as ex:  # a refused poll must not leave the SuperNode unserved
                    log(ERROR, "[warm-executor] polling for a task failed: %r", ex)
                    time.sleep(1.0)
                    continue
                if reply.HasField("task") and reply.token:
                    self.run_task(reply.token)
                else:
                    time.sleep(self.poll_seconds)
        finally:
            self.closing.set()
            client.close()

    def run_task(self, token: str) -> str:
        """Run one task (``run_clientapp`` minus process set-up and exit); its sub-status."""
        clock = [time.perf_counter()]  # start, input pulled, app returned, reply pushed, end
        task_done = threading.Event()
        client = self._client("flwr-clientapp", token, task_done)
        heartbeat = HeartbeatSender(heartbeat_fn(client))
        message: Message | None = None
        reply: Message | None = None
        context: Context | None = None
        sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        try:
            try:
                heartbeat.start()
                message, context, run, fab = pull_task_input(client)
                clock.append(time.perf_counter())
                app = self.apps.client_app(run, fab)
                reply = app(message=message, context=context)
                sub_status, details = SubStatus.COMPLETED, ""
            except ObjectPullError as ex:  # the SuperLink is gone or stopped the run
                details = f"the task's message did not arrive within {OBJECT_PULL_SECONDS:g} s"
                log(
                    WARNING,
                    "[warm-executor] giving up on run %s: %s (%s); serving other runs",
                    TaskIdentity.run_id,
                    details,
                    ex,
                )
            except Exception as ex:  # reported to the server, as Flower does
                code, details = error_of(ex)
                log(ERROR, "ClientApp raised an exception", exc_info=ex)
                if message is not None:
                    reply = Message(Error(code=code, reason=details), reply_to=message)
            clock += [time.perf_counter()] * (3 - len(clock))
            if reply is not None and context is not None:
                try:
                    push_message(client, reply, context)
                except Exception as ex:  # as Flower: the task output still goes
                    log(ERROR, "Failed to push reply message", exc_info=ex)
            clock.append(time.perf_counter())
        finally:
            # As flwr-clientapp's exit handler: no more retries; the status and context last.
            # Failures here are logged, not raised: a stop (SystemExit) must reach the caller.
            task_done.set()
            try:
                if heartbeat.is_running:
                    heartbeat.stop()
                push_task_output(
                    client=client, context=context, sub_status=sub_status, details=details
                )
            except Exception as ex:  # the SuperNode is gone: nobody to report to
                log(WARNING, "[warm-executor] could not report the task's output: %r", ex)
            finally:
                client.close()
        clock.append(time.perf_counter())
        self.tasks += 1
        steps = [b - a for a, b in itertools.pairwise(clock)]
        log(
            INFO,
            "[warm-executor] task %d %s in %.3f s (pull %.3f, app %.3f, reply %.3f, output %.3f)",
            self.tasks,
            sub_status,
            clock[-1] - clock[0],
            *steps,
        )
        return sub_status


def stop(reason: str, code: int = 0) -> None:
    """End this process, from any thread: nothing is retried any more (``STOPPING``), the main
    thread is interrupted (a process-directed SIGTERM, which Linux delivers to the main thread;
    its handler raises SystemExit there, even inside a blocking wait), and a last-resort timer
    ends the process with ``os._exit(code)`` after ``STOP_GRACE_SECONDS`` should the clean-up
    hang. Calling it again does nothing more."""
    if STOPPING.is_set():
        return
    STOPPING.set()
    log(INFO, "[warm-executor] stopping (%s)", reason)
    _last_resort(code)
    if threading.current_thread() is not threading.main_thread():
        os.kill(os.getpid(), signal.SIGTERM)


def _last_resort(code: int) -> None:
    def end() -> None:
        time.sleep(STOP_GRACE_SECONDS)
        log(WARNING, "[warm-executor] clean-up took over %g s: exiting now", STOP_GRACE_SECONDS)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    threading.Thread(target=end, name="last-resort-exit", daemon=True).start()


def _stop_on_signals() -> None:
    """SIGTERM/SIGINT end the executor (``stop``, then SystemExit in the main thread: the running
    task reports failure first); a second signal while that clean-up runs ends the process at
    once."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, lambda s, _f: os._exit(128 + s))
        signal.signal(signal.SIGINT, lambda s, _f: os._exit(128 + s))
        stop(signal.Signals(signum).name)  # a no-op when ``stop`` sent this signal
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def watch_parent(pid: int, seconds: float = 0.2) -> threading.Thread:
    """``stop`` this process when process ``pid`` is gone (or, if it is our parent, when we were
    orphaned: a dead parent not yet reaped still exists as a zombie)."""
    child = os.getppid() == pid

    def gone() -> bool:
        if child and os.getppid() != pid:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False

    def watch() -> None:
        while not gone():
            time.sleep(seconds)
        stop(f"the SuperNode (process {pid}) is gone")

    thread = threading.Thread(target=watch, name="watch-parent", daemon=True)
    thread.start()
    return thread


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fedbandit.flower.internals.warm_executor",
        description="Run a SuperNode's ClientApp tasks in one warm process "
        "(for flower-supernode --isolation process)",
    )
    parser.add_argument(
        "--runtime-api-address",
        default="127.0.0.1:9094",
        help="the SuperNode's runtime API, its --host:--port (default: 127.0.0.1:9094)",
    )
    security = parser.add_mutually_exclusive_group()
    security.add_argument(
        "--insecure", action="store_true", help="plain HTTP to the runtime API (the default)"
    )
    security.add_argument(
        "--root-certificates", help="CA certificate of a runtime API served over TLS"
    )
    parser.add_argument("--parent-pid", type=int, help="exit when this process (SuperNode) ends")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=float(os.environ.get(POLL_ENV, DEFAULT_POLL_SECONDS)),
        help=f"seconds between polls for a task when idle (default: ${POLL_ENV} or "
        f"{DEFAULT_POLL_SECONDS})",
    )
    parser.add_argument(
        "--preload",
        action="append",
        help=f"module to import at start-up (repeatable; default: {', '.join(DEFAULT_PRELOAD)})",
    )
    args = parser.parse_args(argv)
    if not 0.01 <= args.poll_interval <= 60:
        parser.error(f"--poll-interval must lie in [0.01, 60] s, got {args.poll_interval}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _stop_on_signals()
    if args.parent_pid is not None:
        watch_parent(args.parent_pid)
    for module in args.preload or DEFAULT_PRELOAD:
        importlib.import_module(module)
    certificates = validate_and_resolve_root_certificates(args.root_certificates, args.insecure)
    address = resolve_bind_address(args.runtime_api_address)
    executor = WarmExecutor(address, certificates, args.poll_interval)
    log(INFO, "[warm-executor] serving the ClientApp tasks of the SuperNode at %s", address)
    with contextlib.suppress(SystemExit):
        executor.serve()
    log(INFO, "[warm-executor] stopped after %d tasks", executor.tasks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
