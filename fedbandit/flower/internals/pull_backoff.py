"""Shorter waits for a message's objects in Flower 1.42's SuperNode and ServerApp.

A Flower message travels as a registered message plus its objects (records, arrays), uploaded in
separate requests after the message is registered. A poller that sees the message before the
last object has arrived waits ``PULL_INITIAL_BACKOFF`` = 1 s (doubling, up to 10 s) before
asking again: the SuperNode for the server's message (``flwr.supernode.start_client_internal``)
and the ServerApp for the replies (``flwr.superlink.grid.http_grid``). The uploads take tens of
milliseconds, so with short polls most rounds pay that second (a round took 1.7 s median and
0.7 s when no poll fell in the window; ``fedbandit bench deploy``).

``install(module)`` replaces the ``pull_objects`` that module calls by one whose first wait is 0.02
s, doubling up to 0.2 s (each retry is one request), as the warm executor already does for its task
input, and which gives up on a message after ``OBJECT_WAIT_SECONDS`` in the ServerApp and
``SUPERNODE_OBJECT_WAIT_SECONDS`` on a SuperNode (Flower: 500 tries or two hours). A message whose
sender was killed while uploading its objects never completes, and the ServerApp pulls the replies
of a round one message after another: waiting for the dead node's reply held back the live nodes'
replies past the round's deadline, so that every node of the round was lost (caught by a
killed-node test with a 45 s round deadline; the lost-node tests of ``test_deployment_faults.py``
cover it now); the ServerApp therefore waits at most a quarter of the round's deadline for one
reply's objects (``object_wait_seconds``).
``FEDBANDIT_PULL_BACKOFF="FIRST,CAP"`` sets other waits; ``"flower"`` keeps Flower's (and its
limit: for uploads slower than that). It uses a Flower internal, so it is pinned to Flower 1.42
and refuses another version (``fedbandit.flower.internals.require_flower``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from fedbandit.errors import ConfigError
from fedbandit.flower.internals import UnsupportedFlowerError, require_flower, seconds_setting

ENV = "FEDBANDIT_PULL_BACKOFF"
#: First wait and longest wait (s) before asking again for an object not uploaded yet.
DEFAULT_BACKOFF = (0.02, 0.2)
#: The modules whose ``pull_objects`` calls wait for objects: SuperNode and ServerApp.
SUPERNODE_MODULE = "flwr.supernode.start_client_internal"
#: Seconds one message's objects may take to arrive before the pull gives up (the message then
#: comes back as Flower's error reply, "objects unavailable"): far beyond an upload's tens of
#: milliseconds here, and short of a round's deadline (``--round-timeout``, 120 s by default).
OBJECT_WAIT_SECONDS = 20.0
#: The SuperNode's limit for its message's objects. Giving up early only loses the message (the
#: ServerApp counts the node as lost at the round's deadline anyway), and the first message of a
#: run takes long under load: at 32 SuperNodes on 2 cores (load 33) six nodes gave up on it after
#: 20 s and the run failed; the longest wait of the run that then passed was 51 s. The warm
#: executor waits for the same objects at most ``warm_executor.OBJECT_PULL_SECONDS`` = 60 s, and a
#: node still waiting when its SuperLink dies serves a new run only after this limit.
SUPERNODE_OBJECT_WAIT_SECONDS = 60.0
#: Sets another SuperNode limit (seconds, 1-3600). A message of the ServerApp whose push the
#: SuperLink half lost stays incomplete for good (``object_push``): a node that pulled it waits
#: this long before it takes the next message (the ServerApp's copy sent again).
SUPERNODE_OBJECT_WAIT_ENV = "FEDBANDIT_SUPERNODE_OBJECT_WAIT"
#: The ServerApp waits for one reply's objects at most this fraction of the round's deadline: it
#: pulls a round's replies one after another, so the live nodes' replies still arrive in time.
ROUND_SHARE = 0.25
SERVERAPP_MODULE = "flwr.superlink.grid.http_grid"
#: The error code of the reply the ServerApp makes of a message whose objects did not arrive in
#: time (Flower's ``ErrorCode.MESSAGE_UNAVAILABLE``, not in its public API).
MESSAGE_UNAVAILABLE = 3


def backoff_from_env(text: str | None) -> tuple[float, float] | None:
    """``FEDBANDIT_PULL_BACKOFF``: None for "flower", else (first, cap) (default when unset)."""
    if text is None or not text.strip():
        return DEFAULT_BACKOFF
    if text.strip() == "flower":
        return None
    try:
        first, cap = (float(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"{ENV} must be FIRST,CAP seconds or 'flower', got {text!r}") from None
    if not 0 < first <= cap <= 10:
        raise ConfigError(f"{ENV}: need 0 < FIRST <= CAP <= 10, got {text!r}")
    return first, cap


def supernode_object_wait_from_env() -> float:
    """``FEDBANDIT_SUPERNODE_OBJECT_WAIT`` (default ``SUPERNODE_OBJECT_WAIT_SECONDS``); a
    ``ConfigError`` unless it is seconds in [1, 3600]."""
    text = os.environ.get(SUPERNODE_OBJECT_WAIT_ENV, str(SUPERNODE_OBJECT_WAIT_SECONDS))
    return seconds_setting(SUPERNODE_OBJECT_WAIT_ENV, text, 1.0, 3600.0)


def object_wait_seconds(round_timeout: float | None = None) -> float:
    """How long one message's objects may take: ``OBJECT_WAIT_SECONDS``, and at most
    ``ROUND_SHARE`` of ``round_timeout`` when the poller works to a round's deadline."""
    if round_timeout is None:
        return OBJECT_WAIT_SECONDS
    return min(OBJECT_WAIT_SECONDS, ROUND_SHARE * round_timeout)


def install(
    module_name: str,
    backoff: tuple[float, float] | None = None,
    round_timeout: float | None = None,
    max_time: float | None = None,
) -> bool:
    """Make ``module_name``'s ``pull_objects`` wait ``backoff`` (default: from ``ENV``) and give
    up after ``max_time`` seconds (default ``object_wait_seconds(round_timeout)``); False when
    ``ENV`` says to keep Flower's waits. Raises ``ConfigError`` for a wrong ``ENV`` and
    ``UnsupportedFlowerError`` on another Flower."""
    if backoff is None:
        backoff = backoff_from_env(os.environ.get(ENV))
        if backoff is None:
            return False
    version = require_flower(f"shorter object-pull waits ({module_name})", f"set {ENV}=flower")
    module = importlib.import_module(module_name)
    original: Callable[..., Any] | None = getattr(module, "pull_objects", None)
    if original is None:
        raise UnsupportedFlowerError(
            f"{module_name} of flwr {version} has no pull_objects to shorten: set {ENV}=flower"
        )
    if getattr(original, "fedbandit_backoff", None) is not None:
        original = original.fedbandit_original  # type: ignore[attr-defined]
    first, cap = backoff
    if max_time is None:
        max_time = object_wait_seconds(round_timeout)

    def pull_objects(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("initial_backoff", first)
        kwargs.setdefault("backoff_cap", cap)
        kwargs.setdefault("max_time", max_time)
        return original(*args, **kwargs)

    pull_objects.fedbandit_backoff = backoff  # type: ignore[attr-defined]
    pull_objects.fedbandit_original = original  # type: ignore[attr-defined]
    module.pull_objects = pull_objects  # type: ignore[attr-defined]
    return True
