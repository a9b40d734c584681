"""Retry a SuperLink's HTTP 500 on the SuperNode and in the ServerApp before giving up.

Flower 1.42's HTTP clients retry a request that the network lost or that the SuperLink refused
with 502, 503 or 504 (``flwr.supercore.retry.http_retry``), but give up at once on 500, the
answer of a SuperLink whose SQLite store stayed locked past its 5 s busy timeout ("database is
locked"). Under load that happens: with 16 SuperNodes on 2 cores every run met one, and the node
it hit either never received its next round (the seed aborted after the round's deadline) or
failed to upload its last reply (the seed aborted with the node still alive).

``tolerate_server_errors(invoker)`` makes one of Flower's retry invokers treat 500 as the
transient error it is here: retried with Flower's own back-off (1 s doubling, at most 20 s), up
to ``SERVER_ERROR_RETRIES`` times in a row (about 51 s, short of a round's 120 s deadline); the
next success starts the count again. A SuperLink that keeps answering 500 still ends the request,
and every other status keeps Flower's rule. A lock fails the statement it hits and writes nothing
of it; Flower's handlers read before they write (a pull marks what it delivered last), so asking
again returns what the refused request would have. A lock on a handler's later write after an
earlier one succeeded is not covered: that request's message can be lost, and the round's deadline
then decides, as before.

``install_supernode()`` applies it to the SuperNode's connection (``supernode_main``);
``install_serverapp(grid)`` to a deployed ServerApp's grid (``fedbandit.flower.apps``). Both use
Flower internals and refuse another Flower series.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from logging import WARNING
from typing import Any

from fedbandit.flower.internals import UnsupportedFlowerError, require_flower

#: A request the SuperLink answers with HTTP 500 is asked again at most this many times in a row.
SERVER_ERROR_RETRIES = 6
#: The status retried here (Flower already retries 502, 503, 504 and lost connections).
INTERNAL_SERVER_ERROR = 500
SUPERNODE_MODULE = "flwr.supernode.fleet_http_connection"


def is_server_error(exc: BaseException) -> bool:
    """True for an ``httpx.HTTPStatusError`` whose response is HTTP 500."""
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None) == INTERNAL_SERVER_ERROR


class ServerErrorTolerance:
    """The ``should_giveup`` and ``on_success`` of a Flower ``RetryInvoker`` that retries HTTP 500
    up to ``retries`` times in a row and otherwise defers to the invoker's own rule."""

    def __init__(self, invoker: Any, retries: int = SERVER_ERROR_RETRIES) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.retries = retries
        self.in_a_row = 0
        self._lock = threading.Lock()
        self._flower_giveup: Callable[[Exception], bool] | None = invoker.should_giveup
        self._flower_success: Callable[[Any], None] | None = invoker.on_success

    def should_giveup(self, exc: Exception) -> bool:
        if not is_server_error(exc):
            return self._flower_giveup(exc) if self._flower_giveup is not None else False
        with self._lock:
            self.in_a_row += 1
            retry = self.in_a_row <= self.retries
        if retry:
            from flwr.supercore import log

            log(WARNING, "SuperLink answered HTTP 500: retry %d of %d", self.in_a_row, self.retries)
        return not retry

    def on_success(self, state: Any) -> None:
        with self._lock:
            self.in_a_row = 0
        if self._flower_success is not None:
            self._flower_success(state)


def tolerate_server_errors(invoker: Any, retries: int = SERVER_ERROR_RETRIES) -> Any:
    """``invoker`` (a Flower ``RetryInvoker``), now retrying HTTP 500 up to ``retries`` times in
    a row; applying it twice changes nothing."""
    if isinstance(getattr(invoker.should_giveup, "__self__", None), ServerErrorTolerance):
        return invoker
    tolerance = ServerErrorTolerance(invoker, retries)
    invoker.should_giveup = tolerance.should_giveup
    invoker.on_success = tolerance.on_success
    return invoker


def install_supernode(retries: int = SERVER_ERROR_RETRIES) -> None:
    """Every retry invoker the SuperNode's Fleet connection makes from now on retries HTTP 500."""
    require_flower("retry of SuperLink errors", "run plain flower-supernode instead")
    import importlib

    module = importlib.import_module(SUPERNODE_MODULE)
    original = getattr(module, "make_simple_http_retry_invoker", None)
    if original is None:
        raise UnsupportedFlowerError(
            f"{SUPERNODE_MODULE} has no make_simple_http_retry_invoker: run plain "
            "flower-supernode instead"
        )
    original = getattr(original, "fedbandit_original", original)

    def make_invoker() -> Any:
        return tolerate_server_errors(original(), retries)

    make_invoker.fedbandit_original = original  # type: ignore[attr-defined]
    module.make_simple_http_retry_invoker = make_invoker  # type: ignore[attr-defined]


def install_serverapp(grid: Any, retries: int = SERVER_ERROR_RETRIES) -> bool:
    """Make a deployed ServerApp's grid retry HTTP 500; False for a grid without Flower's HTTP
    retry invoker (the simulation's in-memory grid, which has no SuperLink to fail)."""
    invoker = getattr(grid, "_retry_invoker", None)
    if invoker is None or not hasattr(invoker, "should_giveup"):
        return False
    require_flower("retry of SuperLink errors", "use Flower 1.42")
    tolerate_server_errors(invoker, retries)
    return True
