"""fedbandit.flower.internals.simulation_poll: the simulation runtime's poll for new messages."""

from __future__ import annotations

import importlib
import queue
import subprocess
import sys
import threading

import pytest

from fedbandit.errors import ConfigError
from fedbandit.flower.internals import UnsupportedFlowerError, simulation_poll


@pytest.fixture
def vce(monkeypatch):
    """Flower's module, restored after the test whatever the test installs."""
    module = importlib.import_module(simulation_poll.MODULE)
    monkeypatch.setattr(module, "add_messages_to_queue", module.add_messages_to_queue)
    return module


class FakeState:
    """Flower's in-memory state as the loop reads it: each node's queued messages."""

    def __init__(self, messages: dict[int, list[str]]) -> None:
        self.messages = messages

    def get_message_ins(self, node_id: int, limit: int) -> list[str]:
        taken, self.messages[node_id] = (
            self.messages[node_id][:limit],
            self.messages[node_id][limit:],
        )
        return taken


class CountingStop:
    """A stop event that records each wait and is set after ``rounds`` of them."""

    def __init__(self, rounds: int) -> None:
        self.waits: list[float] = []
        self.rounds = rounds

    def is_set(self) -> bool:
        return len(self.waits) >= self.rounds

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return self.is_set()


def test_install_replaces_the_loop_with_a_short_poll_that_still_stops(vce, monkeypatch):
    monkeypatch.delenv(simulation_poll.ENV, raising=False)
    original = vce.add_messages_to_queue
    assert simulation_poll.install() is True
    loop = vce.add_messages_to_queue
    assert loop is not original and loop.fedbandit_poll == simulation_poll.DEFAULT_POLL_SECONDS
    state = FakeState({1: ["a", "b"], 2: ["c"]})
    delivered: queue.Queue[str] = queue.Queue()
    stop = CountingStop(rounds=3)
    loop(state, delivered, {1: 0, 2: 1}, stop)  # returns once the stop event is set
    assert stop.waits == [simulation_poll.DEFAULT_POLL_SECONDS] * 3  # Flower's loop waits 0.1 s
    assert [delivered.get_nowait() for _ in range(3)] == ["a", "c", "b"]  # one per node a look
    assert delivered.empty()


def test_the_loop_ends_when_the_simulation_stops(vce):
    simulation_poll.install(0.005)
    stop = threading.Event()
    thread = threading.Thread(
        target=vce.add_messages_to_queue, args=(FakeState({1: []}), queue.Queue(), {1: 0}, stop)
    )
    thread.start()
    stop.set()
    thread.join(timeout=2.0)
    assert not thread.is_alive()


def test_the_environment_chooses_the_poll_or_flowers(vce, monkeypatch):
    original = vce.add_messages_to_queue
    monkeypatch.setenv(simulation_poll.ENV, "flower")
    assert simulation_poll.install() is False and vce.add_messages_to_queue is original
    monkeypatch.setenv(simulation_poll.ENV, "0.02")
    assert simulation_poll.install() is True and vce.add_messages_to_queue.fedbandit_poll == 0.02
    for bad in ("fast", "0", "2", "nan"):
        with pytest.raises(ConfigError, match="FEDBANDIT_SIMULATION_POLL must be seconds in"):
            simulation_poll.poll_from_env(bad)


def test_another_flower_version_is_refused(vce, monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.43.0")
    with pytest.raises(UnsupportedFlowerError, match=r"flwr 1\.43\.0 is installed"):
        simulation_poll.install(0.005)


def test_a_wrong_setting_is_one_line_before_anything_runs(tmp_path):
    out = tmp_path / "never"
    done = subprocess.run(
        [sys.executable, "-m", "fedbandit.cli", "run", "fedpe_tiny", "--runtime", "flower-sim",
         "--out", str(out)],
        capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, simulation_poll.ENV: "fast"},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "fedbandit: error: FEDBANDIT_SIMULATION_POLL must be seconds in [0.001, 1] or 'flower', "
        "got 'fast'"
    ]
    assert not out.exists()
