"""What a replay of logged events keeps in its results: its regret counts misses, its reward is
``t - misses(t)`` (exact), compared with uniform random choice's expected reward ``t / K``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fedbandit.config import ExperimentConfig, validate_experiment
from fedbandit.errors import ConfigError

if TYPE_CHECKING:
    from fedbandit.group_environment import RegretRecord


#: The y label of a replay's regret curve (its regret counts misses).
MISSES_LABEL = "misses per client, R(t)/M (pick != logged choice)"


#: What the summary says a replay's columns are.
REPLAY_UNITS = {
    "final_regret": "R(T)/M: misses per client (events whose pick was not the logged choice; "
    "regret against always picking the logged choice, reward 1 per event)",
    "final_reward": "cumulative reward at T, all clients: events whose pick was the logged "
    "choice (T - misses)",
    "random_reward": "expected cumulative reward of uniform random choice at T: sum over the T "
    "events of 1/|pool| = T / K (exact, not a random run)",
    "reward_ratio": "final_reward / random_reward (the papers' normalised reward)",
    "hit_rate": "final_reward / T",
}


def is_replay(config: ExperimentConfig | Any) -> bool:
    """Whether a run replays logged events: its instance's reward is the logged-choice indicator
    and its regret counts misses (the kind's parameters say ``REWARD_IS_HIT``)."""
    instance = getattr(config, "instance", config)
    return bool(getattr(instance, "REWARD_IS_HIT", False))


def is_replay_manifest(manifest: dict[str, Any]) -> bool:
    """Whether a results folder holds a replay of logged events (its experiment's instance)."""
    try:
        config = validate_experiment(manifest["config"])
    except (ConfigError, KeyError):
        return False
    return is_replay(config)


def hit_curve(record: RegretRecord, horizon: int) -> np.ndarray | None:
    """A replay's cumulative reward at steps 1..T over all clients: t - misses(t), exact (every
    step's regret is 0 or 1 miss); None when the record does not cover every step (clients lost
    before reporting: their steps' outcomes are unknown)."""
    if len(record.client_ids) == 0 or int(np.sum(record.client_pulls)) != horizon:
        return None
    per_step = np.rint(np.cumsum(record.increment_diff)[:-1] / record.scale)
    return np.arange(1, horizon + 1) - np.cumsum(per_step)


def random_reward_per_event(instance_facts: dict[str, Any]) -> float:
    """1/K from a replay instance's summary (the manifest's ``instance``)."""
    value = instance_facts.get("random_reward_per_event")
    if value is None:
        value = 1.0 / float(instance_facts["num_arms"])
    return float(value)
