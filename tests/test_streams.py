"""The clients' reward streams as arrays (fedbandit.streams) against NumPy's own generators.

Oracle: ``np.random.Generator(PCG64(SeedSequence(entropy, spawn_key=(domain, id))))``, the stream
each client owned before; every state word and every draw must be equal, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fedbandit.rng import REWARD_DOMAIN, client_generators
from fedbandit.state import generators_to_arrays
from fedbandit.streams import STATE_KEYS, ClientStreams

IDS = np.array([0, 1, 2, 7, 1000, 123456, 2**32 - 1])


@pytest.mark.parametrize("entropy", [[0, 0], [3, 17], [2**40, 5], 12, [0]])
def test_seeding_and_draws_equal_numpy_generators(entropy):
    streams = ClientStreams.seeded(entropy, IDS, REWARD_DOMAIN)
    generators = client_generators(entropy, IDS, REWARD_DOMAIN)
    expected = generators_to_arrays(generators)
    for key in STATE_KEYS:
        np.testing.assert_array_equal(streams.to_arrays()[key], expected[key])
    # 20,000 draws a client reach the ziggurat's wedges and its tail (about 1 draw in 1,000)
    draws = streams.standard_normal(20_000)
    np.testing.assert_array_equal(draws, np.stack([g.standard_normal(20_000) for g in generators]))
    after = generators_to_arrays(generators)
    for key in STATE_KEYS:
        np.testing.assert_array_equal(streams.to_arrays()[key], after[key])


def test_rows_advance_only_their_streams_and_state_round_trips():
    streams = ClientStreams.seeded([1, 2], IDS, REWARD_DOMAIN)
    generators = client_generators([1, 2], IDS, REWARD_DOMAIN)
    rows = np.array([4, 1])
    np.testing.assert_array_equal(
        streams.standard_normal(5, rows), np.stack([generators[r].standard_normal(5) for r in rows])
    )
    copy = ClientStreams(streams.to_arrays())
    np.testing.assert_array_equal(copy.standard_normal(9), streams.standard_normal(9))
    np.testing.assert_array_equal(
        copy.standard_normal(3), np.stack([g.standard_normal(12)[-3:] for g in generators])
    )


def test_draws_are_standard_normal_and_independent_across_clients():
    draws = ClientStreams.seeded([0, 0], np.arange(200), REWARD_DOMAIN).standard_normal(500)
    assert stats.kstest(draws.ravel(), "norm").pvalue > 1e-3
    assert abs(draws.mean()) < 4 / np.sqrt(draws.size)
    assert abs(draws.var() - 1.0) < 4 * np.sqrt(2 / draws.size)
    corr = np.corrcoef(draws)[np.triu_indices(200, 1)]
    assert np.abs(corr).max() < 5 / np.sqrt(500)  # neighbouring ids are not correlated


def test_ids_beyond_32_bits_are_refused():
    with pytest.raises(ValueError, match="2\\^32"):
        ClientStreams.seeded([0, 0], [2**32], REWARD_DOMAIN)
