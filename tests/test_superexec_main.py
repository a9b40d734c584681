"""The SuperExec's task processes (``fedbandit.flower.internals.superexec_main``): a finished one
is reaped (no zombie), running ones are stopped when the SuperExec closes, SIGKILL for one that
ignores SIGTERM; and Flower's subprocess executor goes through them once installed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from fedbandit.flower.internals import superexec_main
from fedbandit.flower.internals.superexec_main import TaskProcesses

IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)"
    "; time.sleep(60)"
)


def state(pid: int) -> str:
    """The process state letter (Z: zombie), or "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def wait_for_state(pid: int, wanted: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while state(pid) != wanted:
        assert time.monotonic() < deadline, f"{pid} is {state(pid)!r}, not {wanted!r}"
        time.sleep(0.02)


def test_finished_processes_are_reaped_and_running_ones_stopped():
    tasks = TaskProcesses()
    done = tasks.popen([sys.executable, "-c", "pass"])
    running = tasks.popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = tasks.popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE)
    wait_for_state(done.pid, "Z")  # Flower's executor would leave it so
    tasks.reap()
    assert state(done.pid) == "" and tasks.live == [running, stubborn]
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    tasks.stop(grace=1.0)
    assert tasks.live == []
    assert running.returncode == -15 and stubborn.returncode == -9
    assert state(running.pid) == state(stubborn.pid) == ""
    stubborn.stdout.close()


def test_flowers_executor_launches_reaps_and_stops_through_them(monkeypatch):
    from flwr.supercore.superexec.executor import subprocess_executor

    executor_class = subprocess_executor.SubprocessExecutor
    for name in ("reconcile", "close"):  # restored after the test
        monkeypatch.setattr(executor_class, name, getattr(executor_class, name))
    monkeypatch.setattr(subprocess_executor, "subprocess", subprocess)
    tasks = TaskProcesses()
    superexec_main.install(tasks)
    executor = executor_class()
    subprocess_executor.subprocess.Popen([sys.executable, "-c", "pass"])
    subprocess_executor.subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    finished, running = tasks.live
    wait_for_state(finished.pid, "Z")
    executor.reconcile()
    assert tasks.live == [running] and state(finished.pid) == ""
    executor.close()
    assert tasks.live == [] and running.returncode == -15


def test_a_flower_module_starts_this_superexec_instead_of_flowers():
    module = ModuleType("flower_module")
    module.subprocess = subprocess  # type: ignore[attr-defined]
    superexec_main.start_superexec_as_ours(module)
    ours = module.subprocess.Popen(["flower-superexec", "--version"], stdout=subprocess.PIPE)
    other = module.subprocess.Popen([sys.executable, "-c", "pass"])
    output, _ = ours.communicate(timeout=120)
    assert ours.args[:3] == [sys.executable, "-m", superexec_main.MODULE]
    assert ours.args[3:] == ["--version"] and ours.returncode == 0
    assert b"Flower version" in output
    assert other.wait(timeout=60) == 0 and other.args == [sys.executable, "-c", "pass"]
