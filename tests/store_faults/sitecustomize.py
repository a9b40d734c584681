"""Test-only fault injection for a SuperLink's SQLite store, loaded by Python at start-up when
this folder is on ``PYTHONPATH`` and ``FEDBANDIT_TEST_STORE_FAULTS`` is set.

``FEDBANDIT_TEST_STORE_FAULTS="METHOD:N,N;METHOD:N"`` makes the N-th call (from 1, counted over the
whole process) of each named ``SqlLinkState`` method raise SQLite's "database is locked" before the
store is touched, as a lock held past the busy timeout does (``get_message_ins@fleet`` counts only
the nodes' pulls, which ask for one message; ``METHOD@fleet`` in general, the calls of the
SuperNodes' Fleet API; ``METHOD@runtime``, the calls of the ServerApp's runtime API): the SuperLink
answers that request with HTTP 500 and nothing is written. ``store_object!lost`` instead makes the
call claim the object's pending row and then store nothing (``stored=False``), as a lock on the
store's second transaction does: the object is lost and its push session no longer expects it. Every
injected fault is printed to standard error with its method and call number.
"""

import os
import sys
import threading

_SPEC = os.environ.get("FEDBANDIT_TEST_STORE_FAULTS", "")


def _from_fleet(name: str, kwargs: dict) -> bool:
    """True for a call on behalf of a SuperNode: a pull for one message, or a call from the
    Fleet API's handlers (not the ServerApp's)."""
    if name == "get_message_ins":
        return kwargs.get("limit") == 1
    return "fleet" in sys._getframe(2).f_code.co_filename


def _from_runtime() -> bool:
    """True for a call from the runtime API's handlers (the ServerApp's requests)."""
    return "runtime" in sys._getframe(2).f_code.co_filename


def _install(spec: str) -> None:
    import sqlite3

    from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState

    lock = threading.Lock()
    for item in filter(None, spec.split(";")):
        name, numbers = item.split(":")
        name, _, only = name.partition("@")
        name, _, mode = name.partition("!")
        failing = {int(number) for number in numbers.split(",")}
        original = getattr(SqlLinkState, name)
        calls = [0]

        def faulty(
            self, *args, _original=original, _name=name, _failing=failing, _calls=calls,
            _only=only, _mode=mode, **kwargs,
        ):  # fmt: skip
            if _only == "fleet" and not _from_fleet(_name, kwargs):
                return _original(self, *args, **kwargs)
            if _only == "runtime" and not _from_runtime():
                return _original(self, *args, **kwargs)
            with lock:
                _calls[0] += 1
                call = _calls[0]
            if call in _failing:
                print(f"store fault: {_name} call {call}", file=sys.stderr, flush=True)
                if _mode == "lost":  # store_object(run_id, session_id, object_id, content)
                    self._claim_pending_object(*args[:3])
                    return False
                raise sqlite3.OperationalError("database is locked")
            return _original(self, *args, **kwargs)

        setattr(SqlLinkState, name, faulty)


if _SPEC:
    _install(_SPEC)
