"""`flower-superlink` whose SuperExec stays in its process group and stops its ServerApps:
`python -m fedbandit.flower.internals.superlink_main ARGS`.

Flower 1.42's SuperLink starts its SuperExec (``flower-superexec``, which starts one ServerApp
process per run) in a session of its own (``flwr.superlink.cli.flower_superlink``), so stopping
the SuperLink's process group leaves the SuperExec and its ServerApps running. This entry point
starts the SuperExec in the SuperLink's process group instead, as
``fedbandit.flower.internals.superexec_main`` (which reaps finished ServerApps and stops the
running ones when it stops), then runs Flower's own ``flower_superlink`` with the same arguments.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from fedbandit.flower.internals import require_flower
from fedbandit.flower.internals.superexec_main import MODULE as SUPEREXEC_MODULE
from fedbandit.flower.internals.superexec_main import SUPEREXEC_COMMAND

#: The module of Flower's SuperLink command (the package exports a function of the same name).
FLOWER_MODULE = "flwr.superlink.cli.flower_superlink"


def install() -> None:
    """Start the SuperExec as ``superexec_main`` in this process group (fails loudly if Flower
    changed that module)."""
    require_flower("SuperLink that stops its ServerApps", "run plain flower-superlink instead")
    flower_superlink = importlib.import_module(FLOWER_MODULE)

    superexec_command = getattr(flower_superlink, "_get_superexec_command", None)
    if superexec_command is None or not hasattr(flower_superlink, "get_popen_detach_kwargs"):
        raise RuntimeError(
            "flwr.superlink.cli.flower_superlink is not as fedbandit expects (Flower upgraded?): "
            "run plain flower-superlink instead"
        )

    def command(*args: Any, **kwargs: Any) -> list[str]:
        flower = superexec_command(*args, **kwargs)
        if flower[:1] != [SUPEREXEC_COMMAND]:
            raise RuntimeError(f"Flower's SuperExec command is {flower[:1]}, not as expected")
        return [sys.executable, "-m", SUPEREXEC_MODULE, *flower[1:]]

    setattr(flower_superlink, "_get_superexec_command", command)  # noqa: B010
    setattr(flower_superlink, "get_popen_detach_kwargs", dict)  # noqa: B010


def main(argv: list[str] | None = None) -> int:
    install()
    sys.argv = ["flower-superlink", *(sys.argv[1:] if argv is None else argv)]
    importlib.import_module(FLOWER_MODULE).flower_superlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
