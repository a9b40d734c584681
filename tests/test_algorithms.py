"""Every algorithm on every instance; grouping invariance; hand-checked communication."""

import numpy as np
import pytest
from algorithm_params import params_for

from fedbandit.api import get_algorithm
from fedbandit.contextual.instances import (
    ContextualParams,
    GLMContextualParams,
    contextual_instance,
    glm_contextual_instance,
)
from fedbandit.federation.runtime import InProcessRuntime, run_federation
from fedbandit.instances import (
    PaperSyntheticParams,
    SyntheticParams,
    paper_synthetic,
    synthetic,
)
from fedbandit.registry import algorithms
from fedbandit.simulation import build_federation, simulate

INSTANCES = {
    "paper": paper_synthetic(PaperSyntheticParams(num_clients=8, num_arms=4, dim=3, seed=2)),
    "disjoint": synthetic(SyntheticParams(num_clients=6, num_arms=5, dim=4, seed=3)),
    "shared": synthetic(
        SyntheticParams(
            num_clients=7, num_arms=3, dim=2, seed=4, shared_parameter=True, noise_sigma=0.5
        )
    ),
    "contextual_disjoint": contextual_instance(ContextualParams(num_clients=5, margin=0.1)),
    "contextual_shared": contextual_instance(
        ContextualParams(
            setting="shared", num_clients=4, num_arms=3, dim=2, participation=0.7, seed=1
        )
    ),
    "contextual_points": contextual_instance(ContextualParams(contexts="points", num_clients=3)),
    "contextual_heterogeneous": contextual_instance(
        ContextualParams(
            setting="shared", num_clients=4, num_arms=3, dim=2, heterogeneity=0.6, seed=2
        )
    ),
    "contextual_round_robin": contextual_instance(
        ContextualParams(num_clients=3, arrival="round_robin", heterogeneity=0.3, seed=5)
    ),
    "glm_logistic_shared": glm_contextual_instance(
        GLMContextualParams(setting="shared", num_clients=4, num_arms=3, dim=2, theta_norm=2.0)
    ),
    "glm_probit_round_robin": glm_contextual_instance(
        GLMContextualParams(
            setting="shared", num_clients=3, link="probit", arrival="round_robin", seed=4
        )
    ),
    "glm_probit_sequential": glm_contextual_instance(
        GLMContextualParams(num_clients=3, link="probit", arrival="sequential", seed=6)
    ),
}


def _pairs():
    for algorithm in algorithms():
        spec = algorithms().get(algorithm)
        for name, instance in INSTANCES.items():
            if spec.needs_shared_parameter and not instance.shared_parameter:
                continue
            if spec.contextual != instance.contextual:
                continue
            if spec.needs_reward_link and getattr(instance, "link", None) is None:
                continue
            yield algorithm, name


@pytest.mark.parametrize(("algorithm", "instance_name"), list(_pairs()))
def test_every_algorithm_runs_on_every_instance(algorithm, instance_name):
    instance = INSTANCES[instance_name]
    result = simulate(
        instance, algorithm, horizon=300, entropy=[0, 0], params=params_for(algorithm)
    )
    if instance.contextual and instance.params.participation < 1:
        assert 0 < result.regret.client_pulls.min() < 300
    elif instance.contextual and instance.params.arrival == "round_robin":
        np.testing.assert_array_equal(result.regret.client_pulls, 300 // instance.num_clients)
    elif instance.contextual and instance.params.arrival == "sequential":
        assert result.regret.client_pulls.sum() == 300  # one random client per global step
    else:
        np.testing.assert_array_equal(result.regret.client_pulls, 300)
    curve = result.regret.mean_cumulative_regret()
    assert curve.shape == (300,)
    assert np.all(np.diff(curve) >= -1e-12) and curve[-1] >= 0
    # The recorded regret equals the regret implied by the per-client totals.
    assert curve[-1] == pytest.approx(result.regret.client_regret.mean())


def test_shared_algorithm_refuses_a_disjoint_instance():
    with pytest.raises(ValueError, match="shared"):
        simulate(INSTANCES["disjoint"], "fedpe_shared", horizon=50, entropy=[0, 0])


def test_a_generalised_linear_algorithm_refuses_linear_rewards():
    with pytest.raises(ValueError, match="glm_contextual"):
        simulate(INSTANCES["contextual_shared"], "fedglb_ucb", horizon=20, entropy=[0, 0])


def test_unknown_algorithm_names_the_known_ones():
    with pytest.raises(ValueError, match=r"known algorithms: .*fedpe"):
        get_algorithm("fedpee")


def test_invalid_hyperparameters_are_rejected():
    with pytest.raises(ValueError, match="design_tolerance"):
        simulate(INSTANCES["paper"], "fedpe", 50, [0, 0], params={"design_tolerance": -1})
    with pytest.raises(ValueError, match="unknown key 'alpah'"):
        simulate(INSTANCES["paper"], "fedpe", 50, [0, 0], params={"alpah": 1.0})


@pytest.mark.parametrize("algorithm", list(algorithms()))
def test_results_do_not_depend_on_client_grouping(algorithm):
    """Every registered algorithm, plugins included."""
    spec = algorithms().get(algorithm)
    name = "contextual_shared" if spec.contextual else "shared"
    instance = INSTANCES["glm_logistic_shared" if spec.needs_reward_link else name]
    params = params_for(algorithm)
    runs = [
        simulate(instance, algorithm, 700, [5, 1], params=params, group_size=g)
        for g in (None, 3, 1)
    ]
    for other in runs[1:]:
        np.testing.assert_array_equal(other.regret.increment_diff, runs[0].regret.increment_diff)
        np.testing.assert_array_equal(other.regret.client_regret, runs[0].regret.client_regret)
        assert other.totals == runs[0].totals


def test_fedpe_communication_counted_by_hand():
    """M=2, K=2, d=2: the first three rounds' scalars per client, from the protocol."""
    instance = synthetic(SyntheticParams(num_clients=2, num_arms=2, dim=2, seed=0))
    result = simulate(instance, "fedpe", 40, [0, 0])
    frame = result.communication
    down = frame[frame.direction == "downlink"]["scalars"].to_numpy()
    up = frame[frame.direction == "uplink"]["scalars"].to_numpy()
    # Round 0 explore: 2 weights + phase = 3; report: 2 counts + 2x2 estimate + l_i = 7.
    # Round 1 eliminate: theta 2x2 + W 2x2x2 + l = 13; reply: 2 booleans.
    assert (down[0], up[0]) == (2 * 3, 2 * 7)
    assert (down[1], up[1]) == (2 * 13, 2 * 2)
    # Later eliminates drop l: at most 12 per client; rounds: explore phases 0..P + eliminates.
    assert down[3] <= 2 * 12 and up[2] <= 2 * (2 + 4)
    assert result.totals["rounds"] == len(frame) // 2


def test_local_ucb_sends_nothing():
    result = simulate(INSTANCES["paper"], "local_ucb", 100, [0, 0])
    assert result.totals["uplink_scalars"] == result.totals["downlink_scalars"] == 0
    assert result.totals["rounds"] == 0


def test_fedpe_keeps_the_optimal_arm_on_the_paper_instance():
    """Over many seeds, no client of the paper's instance ever loses its best arm."""
    instance = paper_synthetic(PaperSyntheticParams())
    best = instance.mean_rewards().argmax(axis=1)
    for seed in range(12):
        server, groups = build_federation(instance, "fedpe", 2**13, [7, seed])
        run_federation(server, InProcessRuntime(groups))
        active = np.concatenate([g.active for g in groups])
        assert active[np.arange(100), best].all(), f"seed {seed} eliminated an optimal arm"
        assert active.sum() < active.size  # and it does eliminate something


def test_local_ucb_exact_values_at_a_fixed_seed():
    instance = INSTANCES["paper"]
    result = simulate(instance, "local_ucb", 200, [11, 0])
    again = simulate(instance, "local_ucb", 200, [11, 0])
    np.testing.assert_array_equal(result.regret.client_regret, again.regret.client_regret)
    # First K steps pull each arm once: regret is the sum of each client's gaps.
    curve = result.regret.mean_cumulative_regret()
    assert curve[3] == pytest.approx(instance.gaps().sum(axis=1).mean())


def test_in_process_runtime_refuses_clients_no_group_serves():
    from fedbandit.federation.messages import Message

    _, groups = build_federation(INSTANCES["paper"], "fedpe", 50, [0, 0], group_size=3)
    runtime = InProcessRuntime(groups)
    for ids in ([0, 8], [0, 99]):  # 8 clients: ids 0..7
        with pytest.raises(ValueError, match="addresses clients no group serves"):
            runtime.exchange(Message("start", 4, np.array(ids), {}))
    without_first = InProcessRuntime(groups[1:])  # clients 0..2 served by nobody
    with pytest.raises(ValueError, match="addresses clients no group serves"):
        without_first.exchange(Message("start", 4, np.array([1, 5]), {}))
