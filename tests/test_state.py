"""Client groups survive being rebuilt from their saved state after every message, as in a
Flower deployment where each message is handled by a fresh process."""

import io

import numpy as np
import pytest
from algorithm_params import params_for

from fedbandit.contextual.instances import (
    ContextualParams,
    GLMContextualParams,
    contextual_instance,
    glm_contextual_instance,
)
from fedbandit.federation.runtime import InProcessRuntime, run_federation
from fedbandit.instances import SyntheticParams, synthetic
from fedbandit.registry import algorithms
from fedbandit.simulation import build_federation, simulate
from fedbandit.state import generators_from_arrays, generators_to_arrays

FIXED = synthetic(
    SyntheticParams(num_clients=7, num_arms=4, dim=3, min_gap=0.5, noise_sigma=0.3, seed=1)
)
SHARED = synthetic(SyntheticParams(num_clients=5, num_arms=3, dim=2, shared_parameter=True))
CONTEXTUAL = contextual_instance(
    ContextualParams(setting="shared", num_clients=5, num_arms=3, dim=2, participation=0.8, seed=2)
)


def through_npz(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What a node can store: arrays only, read back without pickles."""
    for key, value in state.items():
        assert value.dtype.kind in "biuf", f"{key} has dtype {value.dtype}"
    buffer = io.BytesIO()
    np.savez(buffer, **state)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


class RestartingRuntime(InProcessRuntime):
    """After every exchange, replaces each client group by a fresh one loaded from its state."""

    def __init__(self, groups, rebuild):
        super().__init__(groups)
        self.rebuild = rebuild
        self.restarts = 0

    def exchange(self, message):
        reply = super().exchange(message)
        fresh = self.rebuild()
        for old, new in zip(self.groups, fresh, strict=True):
            new.load_state_dict(through_npz(old.state_dict()))
        self.groups = fresh
        self.restarts += 1
        return reply


#: For the algorithms that model Bernoulli rewards (one shared parameter, in the order where a
#: global update can fall between two clients' steps).
GLM = glm_contextual_instance(
    GLMContextualParams(setting="shared", num_clients=5, num_arms=4, dim=3, arrival="round_robin")
)


def instance_for(algorithm):
    spec = algorithms().get(algorithm)
    if spec.needs_reward_link:
        return GLM
    if spec.contextual:
        return CONTEXTUAL
    return SHARED if spec.needs_shared_parameter else FIXED


#: Fed-PE's variants eliminate arms: their active sets are state a rebuilt group must restore.
PHASED = {"fedpe", "fedpe_shared", "fedpe_enhanced", "collaborative"}


@pytest.mark.parametrize("algorithm", list(algorithms()))
def test_rebuilding_every_group_after_every_message_changes_nothing(algorithm):
    """Every registered algorithm, plugins included."""
    instance = instance_for(algorithm)
    phased = algorithm in PHASED
    horizon = 4000 if not algorithms().get(algorithm).contextual else 300
    params = params_for(algorithm)
    expected = simulate(instance, algorithm, horizon, [4, 2], params=params, group_size=2)

    def rebuild():
        return build_federation(instance, algorithm, horizon, [4, 2], params, group_size=2)[1]

    server, groups = build_federation(instance, algorithm, horizon, [4, 2], params, group_size=2)
    runtime = RestartingRuntime(groups, rebuild)
    outcome = run_federation(server, runtime)
    assert runtime.restarts >= 1
    np.testing.assert_array_equal(outcome.regret.increment_diff, expected.regret.increment_diff)
    np.testing.assert_array_equal(outcome.regret.client_regret, expected.regret.client_regret)
    assert outcome.ledger.totals() == expected.totals
    if phased:  # the restored active sets mattered: arms were eliminated along the way
        assert sum(int(g.active.sum()) for g in runtime.groups) < instance.num_clients * 4


@pytest.mark.parametrize("stop", [1, 2500, 4096, 5000])
def test_step_environment_resumes_mid_noise_buffer(stop):
    from fedbandit.environment import BanditEnvironment

    def env():
        return BanditEnvironment(FIXED, [0, 3, 5], horizon=9000, entropy=[1, 1])

    arms = np.random.default_rng(0).integers(0, 4, size=(9000, 3))
    straight, interrupted = env(), env()
    expected = [straight.pull_arms(a) for a in arms]
    got = [interrupted.pull_arms(a) for a in arms[:stop]]
    resumed = env()
    resumed.load_state_dict(through_npz(interrupted.state_dict()))
    got += [resumed.pull_arms(a) for a in arms[stop:]]
    np.testing.assert_array_equal(np.array(got), np.array(expected))
    np.testing.assert_array_equal(resumed.record().increment_diff, straight.record().increment_diff)


def test_generator_states_round_trip_exactly():
    rngs = [np.random.default_rng(seed) for seed in (0, 1, 2**40)]
    for rng in rngs:
        rng.standard_normal(3)
        rng.integers(0, 10, dtype=np.uint32)  # leaves a buffered 32-bit half
    copies = generators_from_arrays(generators_to_arrays(rngs))
    for rng, copy in zip(rngs, copies, strict=True):
        assert rng.bit_generator.state == copy.bit_generator.state
        np.testing.assert_array_equal(rng.random(5), copy.random(5))


def test_missing_state_entries_are_named():
    _, groups = build_federation(FIXED, "fedpe", 50, [0, 0])
    state = groups[0].state_dict()
    del state["logic.active"]
    with pytest.raises(KeyError, match="active"):
        groups[0].load_state_dict(state)
