"""`flower-superlink` whose SuperExec stays in its process group and stops its ServerApps:
`python -m fedbandit.flower.internals.superlink_main ARGS`.

Flower 1.42's SuperLink starts its SuperExec (``flower-superexec``, which starts one ServerApp
process per run) in a session of its own (``flwr.superlink.cli.flower_superlink``), so stopping
the SuperLink's process group leaves the SuperExec and its ServerApps running. This entry point
starts the SuperExec in the SuperLink's process group instead, as
``fedbandit.flower.internals.superexec_main`` (which reaps finished ServerApps and stops the
running ones when it stops), then runs Flower's own ``flower_superlink`` with the same arguments.

It also gives a launched ServerApp ``startup_window_seconds`` (``STARTUP_WINDOW_SECONDS``,
``FEDBANDIT_SERVERAPP_START_WINDOW``) to make its first report. Flower 1.42 gives it 30 s
(``claim_task``: ``HEARTBEAT_DEFAULT_INTERVAL``); a ServerApp needs about 1.5 s of CPU before it
reports, so near load 40 on 2 cores it reported late, was refused ("Runtime task-token
authentication failed") and the SuperExec launched another, without limit. Only the claim's window
is longer: a ServerApp that has reported keeps Flower's heartbeat (lost after 60 s of silence).
"""

from __future__ import annotations

import importlib
import os
import sys
from datetime import timedelta
from typing import Any

from fedbandit.flower.internals import require_flower, seconds_setting
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


#: Seconds a launched ServerApp has for its first report (Flower's: 30).
STARTUP_WINDOW_SECONDS = 300.0
STARTUP_WINDOW_ENV = "FEDBANDIT_SERVERAPP_START_WINDOW"


def startup_window_from_env() -> float:
    """``FEDBANDIT_SERVERAPP_START_WINDOW`` (default ``STARTUP_WINDOW_SECONDS``); a ``ConfigError``
    unless it is seconds in [30, 3600] (30 keeps Flower's window)."""
    text = os.environ.get(STARTUP_WINDOW_ENV, f"{STARTUP_WINDOW_SECONDS:g}")
    return seconds_setting(STARTUP_WINDOW_ENV, text, 30.0, 3600.0)


def lengthen_startup_window(seconds: float) -> None:
    """Make the SuperLink's state (SQLite and in-memory) give a claimed run ``seconds`` before its
    claim expires unreported, instead of Flower's 30 (fails loudly if Flower changed them)."""
    from flwr.supercore.corestate import in_memory_corestate as flower_memory
    from flwr.supercore.corestate import sql_corestate as flower_sql

    InMemoryCoreState, SqlCoreState = flower_memory.InMemoryCoreState, flower_sql.SqlCoreState
    needed = {
        flower_sql: ("TaskModel", "uint64_to_int64", "now", "update"),
        flower_memory: ("now",),
    }
    if any(not hasattr(module, name) for module, names in needed.items() for name in names):
        raise RuntimeError(
            "Flower's task state is not as fedbandit expects (Flower upgraded?): run plain "
            "flower-superlink instead"
        )
    sql_claim, memory_claim = SqlCoreState.claim_task, InMemoryCoreState.claim_task

    def claim_sql(self: Any, task_id: int) -> str | None:
        token = sql_claim(self, task_id)
        if token is not None:
            model = flower_sql.TaskModel
            with self.session() as session:
                session.execute(
                    flower_sql.update(model)
                    .where(
                        model.task_id == flower_sql.uint64_to_int64(task_id),
                        model.token == token,
                        model.running_at.is_(None),
                    )
                    .values(active_until=flower_sql.now() + timedelta(seconds=seconds))
                )
        return token

    def claim_memory(self: Any, task_id: int) -> str | None:
        token = memory_claim(self, task_id)
        if token is not None:
            with self.lock_task_store:
                record = self.task_token_store.get(task_id)
                if record is not None and record.token == token:
                    record.active_until = flower_memory.now() + timedelta(seconds=seconds)
        return token

    SqlCoreState.claim_task = claim_sql  # type: ignore[method-assign]
    InMemoryCoreState.claim_task = claim_memory  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    try:  # the setting first: a wrong one is one line, before any process starts
        window = startup_window_from_env()
    except ValueError as err:
        print(f"fedbandit: {err}", file=sys.stderr)
        return 2
    install()
    lengthen_startup_window(window)
    sys.argv = ["flower-superlink", *(sys.argv[1:] if argv is None else argv)]
    importlib.import_module(FLOWER_MODULE).flower_superlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
