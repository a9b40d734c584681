"""Seeded random streams.

Seed index k of an experiment whose base seed is b has entropy ``[b, k]`` (``run_entropy``); the
Python API's ``fedbandit.simulate(..., seed=k, base_seed=b)`` uses the same mapping. Within a run,
each logical client owns an independent stream per domain, derived from the entropy, the domain
and the client id alone: ``SeedSequence(entropy, spawn_key=(domain, client_id))``. Results
therefore do not depend on how clients are grouped into processes, on the number of workers, or on
the runtime. The instance is drawn from its own domain (``INSTANCE_DOMAIN``) with the instance's
``seed``, so the rewards' seeds never change the instance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Spawn-key domains, so the instance, the reward noise and any algorithm randomness never share
#: a stream even when they use the same seed.
INSTANCE_DOMAIN = 0
REWARD_DOMAIN = 1
#: (2 is the sequential order's arrival stream, ``fedbandit.contextual.environment``.)
#: The noise a private algorithm's client adds to what it releases (``fedbandit.privacy``).
PRIVACY_DOMAIN = 3
#: The single rewards of a block of pulls given their sum, for a learner that clips each reward
#: (``BanditEnvironment.clip_block_rewards``).
REWARD_DETAIL_DOMAIN = 4
#: The draws of a randomised policy's arms (FedIGW's inverse gap weighting).
EXPLORATION_DOMAIN = 5


def run_entropy(base_seed: int, seed_index: int) -> list[int]:
    """Entropy of run ``seed_index`` of an experiment whose base seed is ``base_seed``."""
    if base_seed < 0 or seed_index < 0:
        raise ValueError(f"seeds must be non-negative, got base={base_seed}, index={seed_index}")
    return [int(base_seed), int(seed_index)]


def client_generators(
    entropy: int | Sequence[int], client_ids: Sequence[int] | np.ndarray, domain: int
) -> list[np.random.Generator]:
    """One independent generator per logical client id, within a domain."""
    return [
        np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(entropy, spawn_key=(domain, int(cid))))
        )
        for cid in client_ids
    ]


def domain_generator(entropy: int | Sequence[int], domain: int) -> np.random.Generator:
    """A generator for a whole domain (for example, drawing an instance)."""
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(entropy, spawn_key=(domain,)))
    )
