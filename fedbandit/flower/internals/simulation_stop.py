"""A simulation that stops while ClientApp tasks are in flight still exits: `install()`.

When Flower 1.42's simulation runtime stops (Ctrl-C, SIGTERM), ``RayBackend.terminate`` calls
``ray.shutdown()`` at once (``flwr.server.superlink.fleet.vce.backend.raybackend``). A worker
thread of the runtime that is waiting for a ClientApp task (``ray.get`` in
``BasicActorPool.fetch_result_and_return_actor_to_pool``) then waits forever: Ray is gone, and
the interpreter joins that thread before it exits, so the interrupted command never ends
(measured: a Ctrl-C during a round left ``fedbandit run`` hanging after its "interrupted" line).

``install`` wraps ``terminate``: it first waits up to ``DRAIN_SECONDS`` for the tasks in flight
(each worker thread takes its task's actor back when ``ray.get`` returns or raises), then kills
the actors still busy so that their ``ray.get`` raises, waits up to ``KILLED_SECONDS`` more, and
only then lets Flower shut Ray down. It uses Flower internals, so it is pinned to Flower 1.42
and refuses another version (``fedbandit.flower.internals.require_flower``).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

from fedbandit.flower.internals import UnsupportedFlowerError, require_flower

#: The module whose backend's ``terminate`` is wrapped.
MODULE = "flwr.server.superlink.fleet.vce.backend.raybackend"
#: Seconds to let the tasks in flight end by themselves (a ClientApp task takes milliseconds).
DRAIN_SECONDS = 5.0
#: Seconds to let the worker threads see their killed actors' errors.
KILLED_SECONDS = 5.0


def in_flight(backend: Any) -> dict[Any, Any]:
    """The backend's ClientApp tasks in flight: future -> actor (Flower's pool keeps them until
    its worker thread takes the actor back)."""
    pool = getattr(backend, "pool", None)
    tasks = getattr(pool, "_future_to_actor", None)
    return tasks if isinstance(tasks, dict) else {}


def wait_until_idle(backend: Any, seconds: float, poll: float = 0.01) -> bool:
    """Wait up to ``seconds`` until ``backend`` has no task in flight; True if it has none."""
    deadline = time.monotonic() + seconds
    while in_flight(backend) and time.monotonic() < deadline:
        time.sleep(poll)
    return not in_flight(backend)


def drain_then(
    terminate: Callable[[Any], None], kill: Callable[[Any], None]
) -> Callable[[Any], None]:
    """``terminate`` preceded by the drain: wait for the tasks in flight, ``kill`` the actors of
    those that remain, wait for their worker threads, then ``terminate``."""

    def drained_terminate(backend: Any) -> None:
        if not wait_until_idle(backend, DRAIN_SECONDS):
            for actor in list(in_flight(backend).values()):
                try:
                    kill(actor)
                except Exception:  # an actor already gone needs no kill
                    continue
            wait_until_idle(backend, KILLED_SECONDS)
        terminate(backend)

    drained_terminate.fedbandit_drain = True  # type: ignore[attr-defined]
    drained_terminate.fedbandit_original = terminate  # type: ignore[attr-defined]
    return drained_terminate


def install() -> bool:
    """Wrap the Ray backend's ``terminate`` with the drain (once); False if already wrapped.
    Raises ``UnsupportedFlowerError`` on another Flower."""
    require_flower(f"clean stop of a simulation ({MODULE})", "use --runtime local")
    module = importlib.import_module(MODULE)
    backend_class = getattr(module, "RayBackend", None)
    terminate = getattr(backend_class, "terminate", None)
    if backend_class is None or not callable(terminate):
        raise UnsupportedFlowerError(f"{MODULE} has no RayBackend.terminate: use --runtime local")
    if getattr(terminate, "fedbandit_drain", False):
        return False
    import ray

    def kill(actor: Any) -> None:
        ray.kill(actor, no_restart=True)

    backend_class.terminate = drain_then(terminate, kill)
    return True
