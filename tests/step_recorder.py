"""Record what every client saw and did at each global step of an in-process contextual run: the
tests that compare our runs with the authors' rules transcribed in plain loops read the actor,
its contexts, its arm and reward from here."""

from __future__ import annotations

import numpy as np


def record_steps(groups) -> dict[int, dict]:
    """Wrap each group's environment so that every pull is recorded, by global step: ``actor``,
    ``contexts`` (its K x d block), ``arm`` and ``reward``. Returns the dict that fills as the
    run goes."""
    steps: dict[int, dict] = {}
    for group in groups:
        env = group.env
        observe, pull = env.observe, env.pull

        def observing(env=env, observe=observe):
            contexts, active = observe()
            env._seen = (np.array(contexts), active.copy())
            return contexts, active

        def pulling(arms, env=env, pull=pull):
            contexts, active = env._seen
            step = env.round
            rewards = pull(arms)
            for row in np.flatnonzero(active):
                steps[step] = {
                    "actor": int(env.client_ids[row]),
                    "contexts": contexts[row],
                    "arm": int(arms[row]),
                    "reward": float(rewards[row]),
                }
            return rewards

        env.observe, env.pull = observing, pulling
    return steps
