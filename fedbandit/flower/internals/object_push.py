"""Tell a push whose objects the SuperLink lost from every other failure (Flower 1.42).

A ServerApp's ``Grid.push_messages`` registers its messages with the SuperLink, then uploads their
objects (records, arrays) in a push session. Flower 1.42's SQLite store claims an object's pending
row in one transaction and stores the object in the next (``SqlCoreState.store_object``); a
"database is locked" in the second is swallowed, the object is lost, and the session no longer
expects it. The grid then raises ``ObjectPushError`` ("The push session may have expired or been
replaced"): at 32 SuperNodes on 2 cores this ended a ServerApp mid-run (Flower exit 201).

Nothing has consumed such a message: its objects never all arrived. ``is_lost_push`` lets
``fedbandit.flower.grid_runtime`` send it again as a new message, in a new session that uploads the
lost object again (objects are named by their content, so the others are not uploaded twice).
It uses a Flower internal, so it applies to Flower 1.42 only.
"""

from __future__ import annotations

from fedbandit.flower.internals import FLOWER_SERIES, installed_flower


def is_lost_push(error: BaseException) -> bool:
    """True when ``error`` is Flower 1.42's ``ObjectPushError``: the SuperLink registered the
    message but did not store one of its objects, so no node can have received it whole. Under
    another Flower series always False (the error then ends the push as Flower has it)."""
    if not installed_flower().startswith(FLOWER_SERIES):
        return False
    from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

    return isinstance(error, ObjectPushError)
