"""FedIGW: inverse gap weighting, epochs and the federated oracle by hand; the arms' law; the
runtimes' invariances; a seed-averaged check that would fail if the algorithm were wrong."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from fedbandit.algorithms.igw import (
    FedIGWParams,
    epoch_ends,
    igw_gamma,
    igw_probabilities,
    local_training,
    sample_arms,
)
from fedbandit.config import load_experiment
from fedbandit.contextual.instances import (
    ContextualParams,
    GLMContextualParams,
    contextual_instance,
    glm_contextual_instance,
)
from fedbandit.federation.run_ahead import RunAheadRuntime
from fedbandit.federation.runtime import InProcessRuntime, run_federation
from fedbandit.simulation import build_federation, simulate
from fedbandit.sweep import expand


def _instance(arrival: str = "synchronous", setting: str = "disjoint", seed: int = 1):
    return contextual_instance(
        ContextualParams(
            setting=setting,
            num_clients=4,
            num_arms=4,
            dim=3,
            noise_sigma=0.5,
            arrival=arrival,
            seed=seed,
        )
    )


# --- by hand ------------------------------------------------------------------------------------


def test_igw_probabilities_by_hand():
    """y = (0.5, 0.2, 0.4), gamma 10, K 3: p_1 = 1/(3 + 3) = 1/6, p_2 = 1/(3 + 1) = 1/4,
    p_0 = 1 - 1/6 - 1/4; gamma 0: uniform; ties go to the lowest index."""
    probs = igw_probabilities(np.array([[0.5, 0.2, 0.4], [1.0, 1.0, 0.0]]), 10.0)
    np.testing.assert_allclose(probs[0], [1 - 1 / 6 - 1 / 4, 1 / 6, 1 / 4])
    np.testing.assert_allclose(probs[1], [1 - 1 / 3 - 1 / 13, 1 / 3, 1 / 13])
    uniform = igw_probabilities(np.array([[0.5, 0.2, 0.4]]), 0.0)
    np.testing.assert_allclose(uniform, np.full((1, 3), 1 / 3))
    per_row = igw_probabilities(np.array([[0.5, 0.2, 0.4], [0.5, 0.2, 0.4]]), np.array([10.0, 0]))
    np.testing.assert_allclose(per_row, np.vstack([probs[:1], uniform]))


def test_sample_arms_inverts_the_cumulative_law():
    probs = np.array([[0.2, 0.5, 0.3]] * 5)
    uniforms = np.array([0.0, 0.19, 0.2, 0.69, 0.999999])
    np.testing.assert_array_equal(sample_arms(probs, uniforms), [0, 0, 1, 1, 2])
    # over many uniform draws each arm's share is its probability (a permuted inverse fails)
    law = np.array([0.05, 0.6, 0.1, 0.25])
    draws = sample_arms(np.tile(law, (40000, 1)), np.random.default_rng(0).random(40000))
    share = np.bincount(draws, minlength=4) / 40000
    assert np.all(np.abs(share - law) < 4 * np.sqrt(law * (1 - law) / 40000))


def test_the_steps_stay_stable_in_high_dimension():
    """d = 30 Gaussian contexts (||x||^2 about 30): the models stay bounded and the predictions
    finite, where fixed steps of 0.1 would diverge."""
    instance = contextual_instance(
        ContextualParams(num_clients=4, num_arms=4, dim=30, noise_sigma=0.5, seed=1)
    )
    server, groups = build_federation(instance, "fedigw", 300, [0, 0])
    run_federation(server, InProcessRuntime(groups))
    assert server.epochs_trained >= 7
    assert np.all(np.isfinite(server.theta)) and np.abs(server.theta).max() < 10


def test_epochs_double_up_to_the_cap_and_the_last_is_cut():
    np.testing.assert_array_equal(epoch_ends(30, 4096), [1, 3, 7, 15])  # 1, 2, 4, 8; 16 is cut
    np.testing.assert_array_equal(epoch_ends(20, 4), [1, 3, 7, 11, 15, 19])
    assert len(epoch_ends(1, 4096)) == 0


def test_gamma_fixed_or_grown_with_the_data():
    assert igw_gamma(FedIGWParams(gamma=7000.0), 5, 3, 100.0) == 7000.0
    grown = igw_gamma(FedIGWParams(gamma_scale=2.0), 5, 3, 60.0)
    assert grown == pytest.approx(2.0 * math.sqrt(5 * 60 / 3))
    named = igw_gamma(FedIGWParams(gamma="schedule", gamma_scale=2.0), 5, 3, 60.0)
    assert named == grown  # "schedule" names the default rule, for a sweep beside fixed values
    assert igw_gamma(FedIGWParams(gamma=0.0), 5, 3, 60.0) == 0.0
    with pytest.raises(ValidationError, match="gamma must be >= 0"):
        FedIGWParams(gamma=-1.0)
    with pytest.raises(ValidationError):
        FedIGWParams(gamma="fixed")


def test_the_gamma_study_holds_the_authors_fixed_gamma_next_to_the_default():
    """Issue 38: fed_igw_gamma runs the schedule's scales and the code's gamma = 7000, and a
    "schedule" run is the default run, bit for bit, while 7000 plays differently."""
    points = expand(load_experiment("fed_igw_gamma"))
    shown = [
        (p.values["params.fedigw.gamma"], p.values["params.fedigw.gamma_scale"]) for p in points
    ]
    assert shown[:5] == [("schedule", s) for s in (1.0, 4.0, 8.0, 16.0, 32.0)]
    assert shown[5][0] == 7000.0
    default = simulate(_instance(), "fedigw", 40, [0, 1], {})
    named = simulate(_instance(), "fedigw", 40, [0, 1], {"gamma": "schedule"})
    fixed = simulate(_instance(), "fedigw", 40, [0, 1], {"gamma": 7000.0})
    np.testing.assert_array_equal(named.regret.client_regret, default.regret.client_regret)
    assert not np.array_equal(fixed.regret.client_regret, default.regret.client_regret)


def test_local_training_is_gradient_descent_on_the_epochs_samples():
    """One client, one group, d = 1, two samples (x, r) = (1, 1), (2, 0), one padding row; two
    steps from theta = 0 with reg 0.5 on the squared loss, of size 0.1 / max(1, mean x^2) =
    0.1 / 2.5: grad(theta) = ((theta - 1) * 1 + (2 theta - 0) * 2) / 2 + 0.5 theta
    = 3 theta - 0.5."""
    params = FedIGWParams(local_steps=2, learning_rate=0.1, regularization=0.5)
    x = np.array([[[1.0], [2.0], [0.0]]])
    filled = np.array([[True, True, False]])
    out = local_training(
        np.zeros((1, 1, 1)), x, np.zeros((1, 3), dtype=np.int64), np.array([[1.0, 0.0, 9.0]]),
        filled, params,
    )  # fmt: skip
    theta = 0.0
    for _ in range(2):
        theta -= 0.04 * (3 * theta - 0.5)
    assert out[0, 0, 0] == pytest.approx(theta)
    # a client with no samples keeps its model
    empty = local_training(
        np.ones((1, 1, 1)), x, np.zeros((1, 3), dtype=np.int64), np.zeros((1, 3)),
        np.zeros((1, 3), dtype=bool), params,
    )  # fmt: skip
    assert empty[0, 0, 0] == 1.0


def test_logistic_training_uses_the_sigmoid_residual():
    """d = 1, one sample (x, r) = (1, 1), theta = 0, one step of 1, no reg:
    grad = sigma(0) - 1 = -0.5, so theta = 0.5."""
    params = FedIGWParams(oracle="logistic", local_steps=1, learning_rate=1.0, regularization=0)
    out = local_training(
        np.zeros((1, 1, 1)), np.ones((1, 1, 1)), np.zeros((1, 1), dtype=np.int64),
        np.ones((1, 1)), np.ones((1, 1), dtype=bool), params,
    )  # fmt: skip
    assert out[0, 0, 0] == pytest.approx(0.5)


# --- runs ---------------------------------------------------------------------------------------


def test_fedavg_rounds_and_communication_counted_by_hand():
    """T = 30 rounds: epochs close at rounds 1, 3, 7, 15 (then 16 rounds to the horizon); each
    is followed by fl_rounds = 2 exchanges of the model (G d down, G d + G up per client: the
    model and the sample count per group) and the next round brings the model and gamma (G d + 1
    per client)."""
    instance = _instance()
    result = simulate(instance, "fedigw", 30, [0, 1], {"fl_rounds": 2})
    assert result.report["epochs_trained"] == 4
    frame = result.communication
    scalars = frame.groupby(["kind", "direction"])["scalars"].sum()
    M, G, d = 4, 4, 3
    assert scalars["train", "downlink"] == 4 * 2 * M * G * d
    assert scalars["update", "uplink"] == 4 * 2 * M * (G * d + G)
    assert scalars["round", "downlink"] == 4 * M * (G * d + 1)
    assert scalars.get(("played", "uplink"), 0) == 0  # playing sends nothing


@pytest.mark.parametrize("arrival", ["synchronous", "round_robin", "sequential"])
@pytest.mark.parametrize("oracle", ["squared", "logistic"])
def test_results_do_not_depend_on_client_grouping(arrival, oracle):
    horizon = 80 if arrival == "synchronous" else 240
    params = {"oracle": oracle}
    runs = [
        simulate(_instance(arrival), "fedigw", horizon, [5, 1], params, group_size=g)
        for g in (None, 3, 1)
    ]
    for other in runs[1:]:
        np.testing.assert_array_equal(other.regret.increment_diff, runs[0].regret.increment_diff)
        np.testing.assert_array_equal(other.regret.client_regret, runs[0].regret.client_regret)
        assert other.totals == runs[0].totals
    assert runs[0].report["epochs_trained"] >= 3


@pytest.mark.parametrize("arrival", ["synchronous", "sequential"])
def test_run_ahead_gives_the_per_step_results(arrival):
    instance = _instance(arrival)
    horizon = 80 if arrival == "synchronous" else 240

    def run(runtime_of, group_size):
        server, groups = build_federation(
            instance, "fedigw", horizon, [0, 4], group_size=group_size
        )
        return run_federation(server, runtime_of(groups))

    plain = run(InProcessRuntime, None)
    for budget, group_size in ((7, 2), (1000, None), (50, 1)):
        ahead = run(lambda groups, b=budget: RunAheadRuntime(groups, b), group_size)
        np.testing.assert_array_equal(ahead.regret.increment_diff, plain.regret.increment_diff)
        assert ahead.ledger.totals() == plain.ledger.totals()


def test_a_client_draws_its_arms_by_the_igw_law_of_its_model_and_gamma():
    """A client given a model and gamma: over 600 rounds of 4 clients the times it plays the
    predicted best arm match the IGW probabilities summed over those rounds (within 4 standard
    deviations), and gamma matters (a tenth of it gives a clearly different count)."""
    from fedbandit.federation.messages import Message

    instance = _instance()
    _, groups = build_federation(instance, "fedigw", 600, [3, 0])
    client = groups[0]
    rng = np.random.default_rng(7)
    theta = rng.standard_normal((4, 4, 3))
    gamma = np.full(4, 6.0)
    ids = client.client_ids
    fields = {"model": theta, "gamma": gamma}
    client.handle(Message("round", 0, ids, fields))  # the model and gamma arrive
    played, expected, expected_low = 0, 0.0, 0.0
    env = client.env
    seen = {}
    observe = env.observe

    def observing():
        contexts, active = observe()
        seen["contexts"] = np.array(contexts)
        return contexts, active

    env.observe = observing
    for step in range(1, 600):
        reply = client.handle(Message("round", step, ids, {}))
        assert reply.kind == "played"
        arms = client.data_group[np.arange(4), client.data_count - 1]
        scores = np.einsum("nkd,nkd->nk", seen["contexts"], theta)
        best = scores.argmax(axis=1)
        expected += igw_probabilities(scores, 6.0)[np.arange(4), best].sum()
        expected_low += igw_probabilities(scores, 0.6)[np.arange(4), best].sum()
        played += int((arms == best).sum())
    spread = 4 * math.sqrt(expected * (1 - expected / 2396))
    assert abs(played - expected) < spread
    assert abs(played - expected_low) > spread


def test_the_first_epoch_plays_uniformly():
    """At the first round (oracle 0: every prediction ties) the arms are uniform: over 4 clients
    and 400 seeds each arm's share is within 4 standard errors of 1/4."""
    instance = _instance()
    counts = np.zeros(4)
    for seed in range(400):
        server, groups = build_federation(instance, "fedigw", 1, [seed, 0])
        seen = []
        env = groups[0].env
        pull = env.pull

        def recording(arms, pull=pull, seen=seen):
            seen.append(arms.copy())
            return pull(arms)

        env.pull = recording
        run_federation(server, InProcessRuntime(groups))
        counts += np.bincount(seen[0], minlength=4)
    share = counts / counts.sum()
    assert np.all(np.abs(share - 0.25) < 4 * math.sqrt(0.25 * 0.75 / counts.sum()))


def test_fedigw_learns_on_a_linear_and_a_logistic_instance():
    """Seed-averaged: FedIGW's regret over the second half of the run is well below uniform
    play's (which the first epoch is), on a linear instance with the squared oracle and on a
    logistic one with the logistic oracle; with gamma = 0 (uniform play throughout) it is not."""
    cases = [
        (
            contextual_instance(
                ContextualParams(num_clients=6, num_arms=4, dim=3, noise_sigma=0.5, seed=s)
            ),
            "squared",
        )
        for s in range(3)
    ] + [
        (
            glm_contextual_instance(
                GLMContextualParams(num_clients=6, num_arms=4, dim=3, theta_norm=4.0, seed=s)
            ),
            "logistic",
        )
        for s in range(3)
    ]
    for instance, oracle in cases:
        learned = simulate(instance, "fedigw", 600, [1, 2], {"oracle": oracle})
        uniform = simulate(instance, "fedigw", 600, [1, 2], {"oracle": oracle, "gamma": 0.0})
        late = np.diff(learned.regret.mean_cumulative_regret()[[299, 599]])[0]
        late_uniform = np.diff(uniform.regret.mean_cumulative_regret()[[299, 599]])[0]
        assert late < 0.5 * late_uniform
