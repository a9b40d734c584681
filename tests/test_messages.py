"""Communication is counted from the messages themselves; hand-checked counts."""

import numpy as np
import pytest

from fedbandit.federation.messages import Message, broadcast


def test_dense_sparse_and_known_fields_are_counted_by_hand():
    active = np.array([[True, False, True], [False, False, True]])
    message = Message(
        "eliminate",
        3,
        np.array([4, 7]),
        {
            "theta": broadcast(np.ones((3, 2)), 2),
            "cov": broadcast(np.ones((3, 2, 2)), 2),
            "active": active,
            "l": np.full(2, 0.5),
        },
        sparse={"theta": "active", "cov": "active"},
        known=frozenset({"active"}),
    )
    # Client 4 holds 2 arms: 2 * (2 + 4) + 1 = 13 scalars; client 7 holds 1: 6 + 1 = 7.
    np.testing.assert_array_equal(message.scalars_per_client(), [13, 7])
    np.testing.assert_array_equal(message.bytes_per_client(), [13 * 8, 7 * 8])
    scalars, num_bytes, flagged = message.tally(frozenset({"l", "active"}))
    np.testing.assert_array_equal(scalars, [13, 7])
    assert (num_bytes, flagged) == (20 * 8, 2)  # "active" is known: never counted


def test_dtype_sets_bytes():
    message = Message(
        "report",
        0,
        np.arange(3),
        {"counts": np.zeros((3, 4), np.int32), "flags": np.zeros((3, 4), bool)},
    )
    np.testing.assert_array_equal(message.scalars_per_client(), [8, 8, 8])
    np.testing.assert_array_equal(message.bytes_per_client(), [16 + 4, 20, 20])
    scalars, num_bytes, flagged = message.tally(frozenset({"flags"}))
    np.testing.assert_array_equal(scalars, [8, 8, 8])
    assert (num_bytes, flagged) == (60, 12)


def test_select_and_concatenate_round_trip():
    message = Message(
        "m",
        1,
        np.array([0, 1, 2, 3]),
        {"x": np.arange(8.0).reshape(4, 2)},
        meta={"pulls": np.arange(4)},
    )
    parts = [
        message.select(np.array([2, 0])),
        message.select(slice(1, 2)),
        message.select(np.array([3])),
    ]
    joined = Message.concatenate(parts)
    np.testing.assert_array_equal(joined.client_ids, [0, 1, 2, 3])
    np.testing.assert_array_equal(joined.fields["x"], message.fields["x"])
    np.testing.assert_array_equal(joined.meta["pulls"], [0, 1, 2, 3])


def test_mismatched_messages_are_refused():
    with pytest.raises(ValueError, match="leading axis"):
        Message("m", 0, np.arange(3), {"x": np.zeros((2, 1))})
    a = Message("m", 0, np.arange(1), {"x": np.zeros((1, 1))})
    b = Message("m", 1, np.arange(1) + 1, {"x": np.zeros((1, 1))})
    with pytest.raises(ValueError, match="round"):
        Message.concatenate([a, b])
