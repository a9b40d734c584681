"""`flower-supernode` with a shorter idle poll:
`python -m fedbandit.flower.internals.supernode_main ARGS`.

Flower 1.42's SuperNode sleeps a hard-coded 3 s whenever the SuperLink has no message for it, and
polls its own memory every 0.5 s for a finished reply (``flwr.supernode.start_client_internal``).
A fedbandit round is short, so those sleeps dominate a deployment's round time. This entry point
caps the idle sleep at ``FEDBANDIT_SUPERNODE_POLL`` seconds (default 0.2; each poll is a request
to the SuperLink) and the local waits at ``LOCAL_WAIT_SECONDS`` (cheap in-memory checks), then
runs Flower's own ``flower_supernode`` unchanged, with the same arguments. Plain
``flower-supernode`` works too, only slower (about 3 s more per round).

With ``--warm-executor`` (taken out of the arguments Flower sees) the SuperNode runs with
``--isolation process`` and this process first starts ``fedbandit.flower.internals.warm_executor``
as a child (same Python and environment) on the SuperNode's runtime API (``--host``/``--port``):
one warm process runs every ClientApp task instead of a fresh ``flwr-clientapp`` process per
message.
The child is stopped when the SuperNode exits (from Flower's exit handlers, and again when this
launcher returns), and stops itself if this process dies.

Without ``--warm-executor`` Flower's SuperNode starts its SuperExec, which starts a ClientApp
process per message, as ``fedbandit.flower.internals.superexec_main``: finished ClientApps are
reaped at once and running ones stopped with the SuperExec.

It also shortens the SuperNode's wait for the objects of a message it saw before they finished
uploading (``fedbandit.flower.internals.pull_backoff``: 0.02 s doubling to 0.2 s instead of 1 s
to 10 s), and retries a SuperLink's HTTP 500 ("database is locked" under load) before giving
up (``fedbandit.flower.internals.server_error_retry``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from types import SimpleNamespace

from fedbandit.flower.internals import (
    pull_backoff,
    require_flower,
    seconds_setting,
    server_error_retry,
    superexec_main,
)

#: Seconds between a SuperNode's polls of the SuperLink when it is idle.
DEFAULT_POLL_SECONDS = 0.2
#: Cap of the SuperNode's waits for a reply of its ClientApp (Flower: 0.5 s; an in-memory check).
LOCAL_WAIT_SECONDS = 0.02
#: The flag that asks for the warm executor (not a Flower flag).
WARM_FLAG = "--warm-executor"


def capped_time(poll_seconds: float, local_seconds: float = LOCAL_WAIT_SECONDS) -> SimpleNamespace:
    """A stand-in for the ``time`` module whose ``sleep`` never exceeds ``poll_seconds``, nor
    ``local_seconds`` for Flower's sub-second sleeps (the waits for a local reply)."""
    names = {name: getattr(time, name) for name in dir(time) if not name.startswith("__")}

    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, poll_seconds if seconds >= 1 else local_seconds))

    names["sleep"] = sleep
    return SimpleNamespace(**names)


def poll_seconds_from_env() -> float:
    """``FEDBANDIT_SUPERNODE_POLL`` (default ``DEFAULT_POLL_SECONDS``); a ``ConfigError`` (a
    ValueError) unless it is seconds in [0.01, 3]."""
    text = os.environ.get("FEDBANDIT_SUPERNODE_POLL", str(DEFAULT_POLL_SECONDS))
    return seconds_setting("FEDBANDIT_SUPERNODE_POLL", text, 0.01, 3.0)


def install_poll_interval(poll_seconds: float) -> None:
    """Cap the sleeps of Flower's SuperNode loop (fails loudly if Flower changed that module)."""
    if not 0.01 <= poll_seconds <= 3.0:
        raise ValueError(f"SuperNode poll interval must lie in [0.01, 3] s, got {poll_seconds}")
    require_flower("shorter SuperNode poll", "run plain flower-supernode instead")
    from flwr.supernode import start_client_internal

    if getattr(start_client_internal, "time", None) is not time:
        raise RuntimeError(
            "flwr.supernode.start_client_internal no longer uses the time module as fedbandit "
            "expects (Flower upgraded?): run plain flower-supernode instead"
        )
    setattr(start_client_internal, "time", capped_time(poll_seconds))  # noqa: B010


def warm_executor_command(flower_args: list[str], parent_pid: int) -> list[str]:
    """The warm executor's command line for a SuperNode started with ``flower_args``; raises
    ``ValueError`` for SuperNode options it cannot serve."""
    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT, UVICORN_DEFAULT_HOST

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--isolation", default="process")
    parser.add_argument("--host", default=UVICORN_DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=SUPERNODE_UVICORN_DEFAULT_PORT)
    parser.add_argument("--ssl-ca-certfile")
    parser.add_argument("--superexec-auth-secret-file")
    args, _ = parser.parse_known_args(flower_args)
    if args.isolation != "process":
        raise ValueError(f"{WARM_FLAG} needs --isolation process, not {args.isolation!r}")
    if args.superexec_auth_secret_file:
        raise ValueError(f"{WARM_FLAG} does not support --superexec-auth-secret-file")
    host = f"[{args.host}]" if ":" in args.host else args.host
    command = [sys.executable, "-m", "fedbandit.flower.internals.warm_executor"]
    command += ["--runtime-api-address", f"{host}:{args.port}", "--parent-pid", str(parent_pid)]
    if args.ssl_ca_certfile:
        command += ["--root-certificates", args.ssl_ca_certfile]
    else:
        command.append("--insecure")
    return command


def stop_process(process: subprocess.Popen, seconds: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``seconds``."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _stop_with_flower(executor: subprocess.Popen) -> None:
    """SIGTERM the warm executor from Flower's own exit path (``flwr_exit``, which may end this
    process with ``os._exit`` before a ``finally`` here runs); the executor ends itself within its
    grace period (``warm_executor.STOP_GRACE_SECONDS``), and also when this process is gone."""
    from flwr.supercore.exit.exit_handler import add_exit_handler

    def terminate() -> None:
        if executor.poll() is None:
            executor.terminate()

    add_exit_handler(terminate, run_before_force_exit=True)


def main(argv: list[str] | None = None) -> int:
    flower_args = list(sys.argv[1:] if argv is None else argv)
    try:  # the settings first: a wrong one is one line, before any process starts
        poll_seconds = poll_seconds_from_env()
        backoff = pull_backoff.backoff_from_env(os.environ.get(pull_backoff.ENV))
        object_wait = pull_backoff.supernode_object_wait_from_env()
    except ValueError as err:
        print(f"fedbandit: {err}", file=sys.stderr)
        return 2
    executor = None
    if WARM_FLAG in flower_args:
        flower_args = [arg for arg in flower_args if arg != WARM_FLAG]
        if not any(arg == "--isolation" or arg.startswith("--isolation=") for arg in flower_args):
            flower_args += ["--isolation", "process"]
        try:
            command = warm_executor_command(flower_args, os.getpid())
        except ValueError as err:
            print(f"fedbandit: {err}", file=sys.stderr)
            return 2
        # Started first: its imports overlap the SuperNode's; it waits for the runtime API.
        executor = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    if executor is not None:
        _stop_with_flower(executor)
    try:
        install_poll_interval(poll_seconds)
        if backoff is not None:
            pull_backoff.install(
                pull_backoff.SUPERNODE_MODULE,
                backoff,
                max_time=object_wait,
            )
        server_error_retry.install_supernode()
        if executor is None:  # Flower's SuperExec starts the ClientApps: one that reaps them
            from flwr.supernode import start_client_internal

            superexec_main.start_superexec_as_ours(start_client_internal)
        from flwr.supernode.cli import flower_supernode

        sys.argv = ["flower-supernode", *flower_args]
        flower_supernode()
        return 0
    except pull_backoff.UnsupportedFlowerError as err:
        print(f"fedbandit: {err}", file=sys.stderr)
        return 2
    finally:
        if executor is not None:
            stop_process(executor)


if __name__ == "__main__":
    sys.exit(main())
