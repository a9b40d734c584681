"""The only fedbandit code that uses Flower's private modules (``flwr.supercore``, ``flwr.proto``,
``flwr.supernode``, ``flwr.superlink``); everything else under ``fedbandit/flower/`` uses Flower's
public API (``flwr.app``, ``flwr.clientapp``, ``flwr.serverapp``, ``flwr.simulation``, the
``flwr`` and ``flower-*`` commands). A Flower upgrade touches this folder alone.

- ``supernode_main``: ``flower-supernode`` with a short idle poll, optionally next to
- ``warm_executor``: one long-lived process that runs every ClientApp task of a SuperNode;
- ``superlink_main``: ``flower-superlink`` with its SuperExec in its process group, as
- ``superexec_main``: a SuperExec that reaps its finished task processes and stops the running
  ones when it stops;
- ``pull_backoff``: short waits for a message's objects in the SuperNode and the ServerApp;
- ``server_error_retry``: the SuperNode and the ServerApp retry a SuperLink's HTTP 500;
- ``object_push``: tells a ServerApp push whose objects the SuperLink lost, to send it again;
- ``simulation_poll``: a short poll for new messages in the simulation runtime (flower-sim);
- ``simulation_stop``: a simulation interrupted mid-round waits for its ClientApp tasks before
  Ray stops, so the command exits;
- ``legacy_records``: the legacy ``FitRes``/``Parameters`` record layout that Flower's SecAgg+
  workflow and mod read (secure aggregation).

Each is written against one Flower series and refuses any other through ``require_flower``.
"""

from __future__ import annotations

import importlib.metadata

from fedbandit.errors import ConfigError, DeploymentError

#: The Flower release series whose internals this subpackage was written against.
FLOWER_SERIES = "1.42."


class UnsupportedFlowerError(DeploymentError, RuntimeError):
    """The installed Flower is not the series whose internals fedbandit uses."""


def installed_flower() -> str:
    """The installed flwr version."""
    return importlib.metadata.version("flwr")


def require_flower(what: str, remedy: str) -> str:
    """The installed flwr version; ``UnsupportedFlowerError`` naming ``what`` needs Flower's
    internals and ``remedy`` unless it is of ``FLOWER_SERIES``."""
    version = installed_flower()
    if not version.startswith(FLOWER_SERIES):
        raise UnsupportedFlowerError(
            f"fedbandit's {what} uses Flower {FLOWER_SERIES}x internals, but flwr {version} is "
            f"installed: {remedy}, or pin flwr to {FLOWER_SERIES}x"
        )
    return version


def seconds_setting(name: str, text: str, low: float, high: float, alternative: str = "") -> float:
    """The seconds that the environment variable ``name`` holds (``text``); a ``ConfigError``
    naming it unless they lie in [low, high] (``alternative``: the other values it accepts, for
    the message)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not low <= seconds <= high:
        raise ConfigError(
            f"{name} must be seconds in [{low:g}, {high:g}]{alternative}, got {text!r}"
        )
    return seconds
