"""fedbandit.flower.internals.simulation_stop: an interrupted simulation drains its ClientApp
tasks before Ray stops, so no worker thread waits forever on a Ray that is gone."""

from __future__ import annotations

import importlib
import threading
import time

import pytest

from fedbandit.flower.internals import UnsupportedFlowerError, simulation_stop


class FakePool:
    """Flower's actor pool as the drain reads it: the tasks in flight, future -> actor."""

    def __init__(self, tasks: dict[str, str]) -> None:
        self._future_to_actor = dict(tasks)


class FakeBackend:
    def __init__(self, tasks: dict[str, str]) -> None:
        self.pool = FakePool(tasks)
        self.events: list[str] = []


def terminate(backend: FakeBackend) -> None:
    """Flower's terminate as the drain sees it: Ray stops; the tasks still in flight at that
    moment are the ones whose worker threads would wait forever."""
    backend.events.append(f"terminate with {sorted(backend.pool._future_to_actor)} in flight")


@pytest.fixture
def short_waits(monkeypatch):
    monkeypatch.setattr(simulation_stop, "DRAIN_SECONDS", 0.3)
    monkeypatch.setattr(simulation_stop, "KILLED_SECONDS", 0.3)


def test_an_idle_backend_is_terminated_at_once_without_kills(short_waits):
    backend = FakeBackend({})
    killed: list[str] = []
    started = time.monotonic()
    simulation_stop.drain_then(terminate, killed.append)(backend)
    assert time.monotonic() - started < 0.2
    assert killed == [] and backend.events == ["terminate with [] in flight"]


def test_tasks_that_end_by_themselves_are_waited_for_and_nothing_is_killed(short_waits):
    backend = FakeBackend({"f1": "a1", "f2": "a2"})
    killed: list[str] = []

    def worker_threads_finish() -> None:  # each worker takes its actor back as ray.get returns
        time.sleep(0.05)
        backend.pool._future_to_actor.pop("f1")
        time.sleep(0.05)
        backend.pool._future_to_actor.pop("f2")

    thread = threading.Thread(target=worker_threads_finish)
    thread.start()
    simulation_stop.drain_then(terminate, killed.append)(backend)
    thread.join()
    assert killed == [] and backend.events == ["terminate with [] in flight"]


def test_stuck_tasks_have_their_actors_killed_before_ray_stops(short_waits):
    backend = FakeBackend({"f1": "a1", "f2": "a2"})
    killed: list[str] = []

    def kill(actor: str) -> None:  # a killed actor's ray.get raises: its worker takes it back
        killed.append(actor)
        future = next(f for f, a in backend.pool._future_to_actor.items() if a == actor)
        del backend.pool._future_to_actor[future]

    simulation_stop.drain_then(terminate, kill)(backend)
    assert sorted(killed) == ["a1", "a2"]
    assert backend.events == ["terminate with [] in flight"]


def test_terminate_still_runs_when_a_kill_fails_or_a_task_never_ends(short_waits):
    backend = FakeBackend({"f1": "a1"})

    def kill(actor: str) -> None:
        raise ValueError("actor already gone")

    started = time.monotonic()
    simulation_stop.drain_then(terminate, kill)(backend)
    assert 0.55 <= time.monotonic() - started < 2.0  # both waits, bounded
    assert backend.events == ["terminate with ['f1'] in flight"]


def test_a_backend_without_a_pool_has_nothing_in_flight():
    assert simulation_stop.in_flight(object()) == {}
    assert simulation_stop.wait_until_idle(object(), 0.0) is True


@pytest.fixture
def raybackend(monkeypatch):
    """Flower's Ray backend class with Flower's own terminate (an earlier flower-sim run in this
    process may have wrapped it); whatever it had is restored after the test."""
    module = importlib.import_module(simulation_stop.MODULE)
    terminate = module.RayBackend.terminate
    monkeypatch.setattr(
        module.RayBackend, "terminate", getattr(terminate, "fedbandit_original", terminate)
    )
    return module.RayBackend


def test_install_wraps_flowers_terminate_once(raybackend):
    original = raybackend.terminate
    assert simulation_stop.install() is True
    wrapped = raybackend.terminate
    assert wrapped is not original and wrapped.fedbandit_drain is True
    assert wrapped.fedbandit_original is original
    assert simulation_stop.install() is False and raybackend.terminate is wrapped


def test_another_flower_version_is_refused(raybackend, monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.43.0")
    with pytest.raises(UnsupportedFlowerError, match=r"flwr 1\.43\.0 is installed"):
        simulation_stop.install()
