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


def run_recording_syncs(server, groups, horizon: int) -> tuple[dict[int, dict], list[int]]:
    """Run ``server`` and ``groups`` in process, recording every step (``record_steps``) and the
    global steps after which a sync (a ``collect`` exchange) began; checks every step ran."""
    from fedbandit.federation.runtime import InProcessRuntime, run_federation

    steps = record_steps(groups)
    runtime = InProcessRuntime(groups)
    syncs: list[int] = []

    class Recording:
        def exchange(self, message):
            if message.kind == "collect":
                syncs.append(groups[0].env.round - 1)
            return runtime.exchange(message)

        def __getattr__(self, name):
            return getattr(runtime, name)

    run_federation(server, Recording())
    assert sorted(steps) == list(range(horizon))
    return steps, syncs
