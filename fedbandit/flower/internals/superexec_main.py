"""`flower-superexec` that keeps track of the task processes it starts:
`python -m fedbandit.flower.internals.superexec_main ARGS`.

Flower 1.42's SuperExec starts each ServerApp (or ClientApp) as ``subprocess.Popen(args)`` and
forgets it (``flwr.supercore.superexec.executor.subprocess_executor``): a finished task process
stays a zombie until the SuperExec starts another or exits, and a SuperExec that stops leaves its
task processes running (a ServerApp whose SuperLink is gone retries it for minutes). This entry
point keeps every process it starts, reaps the finished ones on each turn of the SuperExec's loop
(``reconcile``), and when the SuperExec stops (``close``, from Flower's exit handlers: SIGINT,
SIGTERM, or its parent gone) sends SIGTERM to the live ones and SIGKILL to what is left after
``STOP_GRACE_SECONDS``. Then it runs Flower's own ``flower_superexec`` with the same arguments.
"""

from __future__ import annotations

import subprocess
import sys
import time
from types import ModuleType, SimpleNamespace
from typing import Any

from fedbandit.flower.internals import require_flower

#: Seconds a task process has to end after SIGTERM before it gets SIGKILL.
STOP_GRACE_SECONDS = 3.0
#: This entry point, which replaces Flower's ``SUPEREXEC_COMMAND``.
MODULE = "fedbandit.flower.internals.superexec_main"
SUPEREXEC_COMMAND = "flower-superexec"


class TaskProcesses:
    """The processes a SuperExec started: ``popen`` starts and keeps one, ``reap`` forgets the
    finished ones (collecting their exit status, so none stays a zombie), ``stop`` ends the rest
    (SIGTERM, then SIGKILL after ``grace`` seconds)."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen[Any]] = []

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        process: subprocess.Popen[Any] = subprocess.Popen(*args, **kwargs)
        self.live.append(process)
        return process

    def reap(self) -> None:
        self.live = [process for process in self.live if process.poll() is None]

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        self.reap()
        for process in self.live:
            process.terminate()
        deadline = time.monotonic() + grace
        for process in self.live:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.live = []


def install(tasks: TaskProcesses) -> None:
    """Make Flower's subprocess executor start its processes through ``tasks``, reap them on
    every ``reconcile`` and stop them on ``close`` (fails loudly if Flower changed that module)."""
    require_flower("SuperExec that stops its task processes", "run plain flower-superexec instead")
    from flwr.supercore.superexec.executor import subprocess_executor

    executor = subprocess_executor.SubprocessExecutor
    if subprocess_executor.subprocess is not subprocess or not all(
        hasattr(executor, name) for name in ("launch", "reconcile", "close")
    ):
        raise RuntimeError(
            "flwr.supercore.superexec.executor.subprocess_executor is not as fedbandit expects "
            "(Flower upgraded?): run plain flower-superexec instead"
        )
    subprocess_executor.subprocess = _subprocess_with(tasks.popen)  # type: ignore[assignment]
    reconcile, close = executor.reconcile, executor.close

    def reconcile_and_reap(self: Any) -> None:
        tasks.reap()
        reconcile(self)

    def close_and_stop(self: Any) -> None:
        tasks.stop()
        close(self)

    executor.reconcile = reconcile_and_reap  # type: ignore[method-assign]
    executor.close = close_and_stop  # type: ignore[method-assign]


def start_superexec_as_ours(module: ModuleType) -> None:
    """Make ``module`` (a Flower module that starts ``flower-superexec`` with
    ``subprocess.Popen``) start this entry point instead, with the same arguments."""
    if getattr(module, "subprocess", None) is not subprocess:
        raise RuntimeError(
            f"{module.__name__} no longer starts processes as fedbandit expects (Flower "
            "upgraded?): run plain Flower instead"
        )

    def popen(command: Any, *args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        if isinstance(command, list) and command[:1] == [SUPEREXEC_COMMAND]:
            command = [sys.executable, "-m", MODULE, *command[1:]]
        return subprocess.Popen(command, *args, **kwargs)

    module.subprocess = _subprocess_with(popen)  # type: ignore[attr-defined]


def _subprocess_with(popen: Any) -> SimpleNamespace:
    """A stand-in for the ``subprocess`` module whose ``Popen`` is ``popen``."""
    names = {name: getattr(subprocess, name) for name in dir(subprocess) if name[:2] != "__"}
    names["Popen"] = popen
    return SimpleNamespace(**names)


def main(argv: list[str] | None = None) -> int:
    install(TaskProcesses())
    from flwr.supercore.cli import flower_superexec

    sys.argv = ["flower-superexec", *(sys.argv[1:] if argv is None else argv)]
    flower_superexec()
    return 0


if __name__ == "__main__":
    sys.exit(main())
