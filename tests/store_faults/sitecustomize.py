"""Test-only fault injection for a SuperLink's SQLite store, loaded by Python at start-up when
this folder is on ``PYTHONPATH`` and ``FEDBANDIT_TEST_STORE_FAULTS`` is set.

``FEDBANDIT_TEST_STORE_FAULTS="METHOD:N,N;METHOD:N"`` makes the N-th call (from 1, counted over
the whole process) of each named ``SqlLinkState`` method raise SQLite's "database is locked"
before the store is touched, as a lock held past the busy timeout does (``get_message_ins@fleet``
counts only the nodes' pulls, which ask for one message): the SuperLink answers
that request with HTTP 500 and nothing is written. Every injected fault is printed to standard
error with its method and call number.
"""

import os
import sys
import threading

_SPEC = os.environ.get("FEDBANDIT_TEST_STORE_FAULTS", "")


def _install(spec: str) -> None:
    import sqlite3

    from flwr.server.superlink.linkstate.sql_linkstate import SqlLinkState

    lock = threading.Lock()
    for item in filter(None, spec.split(";")):
        name, numbers = item.split(":")
        name, _, only = name.partition("@")
        failing = {int(number) for number in numbers.split(",")}
        original = getattr(SqlLinkState, name)
        calls = [0]

        def faulty(
            self, *args, _original=original, _name=name, _failing=failing, _calls=calls,
            _only=only, **kwargs,
        ):  # fmt: skip
            if _only == "fleet" and kwargs.get("limit") != 1:  # the ServerApp's pull
                return _original(self, *args, **kwargs)
            with lock:
                _calls[0] += 1
                call = _calls[0]
            if call in _failing:
                print(f"store fault: {_name} call {call}", file=sys.stderr, flush=True)
                raise sqlite3.OperationalError("database is locked")
            return _original(self, *args, **kwargs)

        setattr(SqlLinkState, name, faulty)


if _SPEC:
    _install(_SPEC)
