"""A shorter poll in Flower 1.42's simulation runtime: `install()`.

The simulation runtime hands the ServerApp's messages to the virtual SuperNodes from a thread
that looks for new messages, then sleeps 0.1 s (``add_messages_to_queue`` in
``flwr.server.superlink.fleet.vce.vce_api``): every exchange of a federation waits 0.05 s on
average, about 0.1 s measured, which is most of a Fed-PE seed's time on flower-sim (25
exchanges: 2.5 s against 0.03 s in-process). ``install`` replaces that thread's function by the
same loop with a sleep of ``FEDBANDIT_SIMULATION_POLL`` seconds (default 0.005; ``"flower"``
keeps Flower's 0.1 s). The loop reads Flower's in-memory state only, so a short poll costs
little CPU. It uses a Flower internal, so it is pinned to Flower 1.42 and refuses another
version (``fedbandit.flower.internals.require_flower``).
"""

from __future__ import annotations

import importlib
import os
import threading
from queue import Queue
from typing import Any

from fedbandit.flower.internals import UnsupportedFlowerError, require_flower, seconds_setting

ENV = "FEDBANDIT_SIMULATION_POLL"
#: Seconds between the simulation runtime's looks for new messages (Flower's: 0.1).
DEFAULT_POLL_SECONDS = 0.005
#: The module whose message-pickup loop is replaced.
MODULE = "flwr.server.superlink.fleet.vce.vce_api"


def poll_from_env(text: str | None) -> float | None:
    """``FEDBANDIT_SIMULATION_POLL``: None for "flower", else seconds in [0.001, 1]."""
    if text is None or not text.strip():
        return DEFAULT_POLL_SECONDS
    if text.strip() == "flower":
        return None
    return seconds_setting(ENV, text, 0.001, 1.0, " or 'flower'")


def install(poll_seconds: float | None = None) -> bool:
    """Make the simulation runtime look for new messages every ``poll_seconds`` (default: from
    ``ENV``); False when ``ENV`` says to keep Flower's poll. Raises ``ConfigError`` for a wrong
    ``ENV`` and ``UnsupportedFlowerError`` on another Flower."""
    if poll_seconds is None:
        poll_seconds = poll_from_env(os.environ.get(ENV))
        if poll_seconds is None:
            return False
    require_flower(f"shorter simulation poll ({MODULE})", f"set {ENV}=flower")
    module = importlib.import_module(MODULE)
    if not callable(getattr(module, "add_messages_to_queue", None)):
        raise UnsupportedFlowerError(f"{MODULE} has no add_messages_to_queue: set {ENV}=flower")
    wait = poll_seconds

    def add_messages_to_queue(
        state: Any, queue: Queue[Any], nodes_mapping: Any, f_stop: threading.Event
    ) -> None:
        """Flower's loop (put each node's new messages in the queue), with a shorter sleep."""
        while not f_stop.is_set():
            for node_id in nodes_mapping:
                for message in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(message)
            f_stop.wait(wait)

    add_messages_to_queue.fedbandit_poll = wait  # type: ignore[attr-defined]
    module.add_messages_to_queue = add_messages_to_queue  # type: ignore[attr-defined]
    return True
