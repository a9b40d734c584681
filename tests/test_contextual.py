"""The contextual family: ridge math, diversity, LinUCB index values, federated equivalences,
communication counted by hand, and the flattening of LinUCB-d on diverse contexts."""

import dataclasses
import math

import numpy as np
import pytest

from fedbandit.config import load_experiment
from fedbandit.contextual.environment import ContextualEnvironment
from fedbandit.contextual.instances import ContextualParams, contextual_instance, top_two_gap
from fedbandit.contextual.ridge import RidgeLearners, self_normalized_radius, sherman_morrison
from fedbandit.federation.messages import Message
from fedbandit.federation.runtime import CommunicationLedger
from fedbandit.simulation import simulate


def test_sherman_morrison_matches_direct_inverse():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 3, 5, 5))
    gram = a @ np.swapaxes(a, -1, -2) + np.eye(5)
    x = rng.standard_normal((4, 3, 5))
    inverse, quad, gain = sherman_morrison(np.linalg.inv(gram), x)
    updated = gram + x[..., :, None] * x[..., None, :]
    np.testing.assert_allclose(inverse, np.linalg.inv(updated), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(
        np.log1p(quad), np.linalg.slogdet(updated)[1] - np.linalg.slogdet(gram)[1]
    )
    np.testing.assert_allclose(gain, np.linalg.solve(updated, x[..., None])[..., 0], atol=1e-12)


def test_ridge_learner_tracks_direct_least_squares_over_many_updates():
    rng = np.random.default_rng(1)
    learners = RidgeLearners(3, 2, 4, regularization=0.5, refresh_every=10_000)
    xs, rs, gs = [], [], []
    for _ in range(500):
        x = rng.standard_normal((3, 4))
        r = rng.standard_normal(3)
        g = rng.integers(0, 2, size=3)
        learners.update(np.arange(3), g, x, r)
        xs.append(x), rs.append(r), gs.append(g)
    xs, rs, gs = np.array(xs), np.array(rs), np.array(gs)
    for client in range(3):
        for group in range(2):
            sel = gs[:, client] == group
            x, r = xs[sel, client], rs[sel, client]
            gram = 0.5 * np.eye(4) + x.T @ x
            np.testing.assert_allclose(
                learners.inverse[client, group], np.linalg.inv(gram), atol=1e-10
            )
            np.testing.assert_allclose(
                learners.theta[client, group], np.linalg.solve(gram, x.T @ r), atol=1e-10
            )
            assert learners.logdet[client, group] == pytest.approx(np.linalg.slogdet(gram)[1])


def test_linucb_index_by_hand():
    learners = RidgeLearners(1, 2, 2, regularization=1.0)
    # Arm 0 saw x = (1, 0) with reward 2: V = diag(2, 1), b = (2, 0), theta = (1, 0).
    learners.update(np.array([0]), np.array([0]), np.array([[1.0, 0.0]]), np.array([2.0]))
    contexts = np.broadcast_to(np.array([0.6, 0.8]), (1, 2, 2))
    index = learners.indices(contexts, np.arange(2), np.array([[0.5, 0.5]]))
    # arm 0: 0.6 + 0.5 sqrt(0.36/2 + 0.64) ; arm 1: 0 + 0.5 sqrt(1)
    np.testing.assert_allclose(index[0], [0.6 + 0.5 * math.sqrt(0.18 + 0.64), 0.5])
    # The general path (per-arm contexts, non-trivial groups) gives the same values.
    general = learners.indices(
        np.ascontiguousarray(contexts), np.array([0, 1]), np.array([[0.5, 0.5]])
    )
    np.testing.assert_allclose(general, index)


def test_compiled_kernels_match_the_numpy_mathematics():
    from fedbandit.contextual.kernels import context_means

    rng = np.random.default_rng(7)
    learners = RidgeLearners(20, 4, 3, regularization=1.0)
    for _ in range(30):
        learners.update(
            np.arange(20),
            rng.integers(0, 4, 20),
            rng.standard_normal((20, 3)),
            rng.standard_normal(20),
        )
    contexts = rng.standard_normal((20, 4, 3))
    radius = rng.uniform(0, 2, size=(20, 4))
    group = np.arange(4)
    np.testing.assert_array_equal(
        learners.select(contexts, group, radius),
        learners.indices(contexts, group, radius).argmax(axis=1),
    )
    shared = np.zeros(4, dtype=np.int64)
    np.testing.assert_array_equal(
        learners.select(contexts, shared, radius),
        learners.indices(contexts, shared, radius).argmax(axis=1),
    )
    thetas = rng.standard_normal((4, 3))
    np.testing.assert_allclose(
        context_means(contexts, thetas), np.einsum("ckd,kd->ck", contexts, thetas), atol=1e-12
    )
    compact = contexts[:, :1]
    np.testing.assert_allclose(
        context_means(np.ascontiguousarray(compact), thetas), compact[:, 0] @ thetas.T, atol=1e-12
    )


def test_self_normalized_radius_by_hand():
    # sigma sqrt(2 log(1/delta) + log det V - d log lambda) + sqrt(lambda) S
    value = self_normalized_radius(np.array([[math.log(8.0)]]), 2, 2.0, 0.5, 3.0, 0.1)
    inner = 2 * math.log(10) + math.log(8) - 2 * math.log(2)
    assert value[0, 0] == pytest.approx(0.5 * math.sqrt(inner) + math.sqrt(2) * 3)


def test_top_two_gap():
    np.testing.assert_allclose(top_two_gap(np.array([[1.0, 3, 2], [5, 5, 1]])), [1.0, 0.0])


def test_diversity_closed_form_gaussian_two_arms():
    """theta = +-e1, x ~ N(0, I_3): arm 1 wins on x1 > 0 and E[x x^T 1{x1 > 0}] = I/2."""
    instance = contextual_instance(ContextualParams(num_arms=2, dim=3))
    instance = dataclasses.replace(instance, thetas=np.array([[1.0, 0, 0], [-1.0, 0, 0]]))
    assert instance.diversity(samples=100_000)["lambda_0"] == pytest.approx(0.5, abs=0.02)


def test_diversity_is_zero_on_a_subspace_and_on_few_points():
    for contexts in ("subspace", "points"):
        instance = contextual_instance(
            ContextualParams(contexts=contexts, subspace_dim=2, num_points=3, dim=5)
        )
        assert instance.diversity()["lambda_0"] == pytest.approx(0.0, abs=1e-10)
    gaussian = contextual_instance(ContextualParams(dim=5, margin=0.1))
    assert gaussian.diversity()["lambda_0"] > 0.01


def test_margin_is_respected_and_impossible_margins_fail_clearly():
    instance = contextual_instance(ContextualParams(margin=0.3))
    x = instance.expand(instance.sample_contexts(np.random.default_rng(0), 2000))
    assert top_two_gap(instance.means(x)).min() >= 0.3
    hopeless = contextual_instance(ContextualParams(margin=50.0))
    with pytest.raises(ValueError, match=r"lower instance\.margin"):
        hopeless.sample_contexts(np.random.default_rng(0), 10)


def test_contextual_streams_do_not_depend_on_grouping():
    instance = contextual_instance(ContextualParams(num_clients=3, participation=0.6))
    together = ContextualEnvironment(instance, [0, 1, 2], 1500, [0, 1])
    alone = [ContextualEnvironment(instance, [i], 1500, [0, 1]) for i in range(3)]
    for step in range(1500):
        contexts, active = together.observe()
        arms = np.array([step % 5, 1, (step // 7) % 5])
        joint = together.pull(arms)
        for i, env in enumerate(alone):
            c, a = env.observe()
            np.testing.assert_array_equal(c[0], contexts[i])
            assert a[0] == active[i]
            assert env.pull(arms[[i]])[0] == joint[i]


SHARED = contextual_instance(
    ContextualParams(setting="shared", num_clients=6, num_arms=4, dim=3, seed=2)
)


def run(algorithm, params=None, horizon=400, group_size=None, instance=SHARED):
    return simulate(instance, algorithm, horizon, [3, 0], params=params, group_size=group_size)


def test_dislinucb_with_threshold_zero_is_the_centralised_learner():
    central = run("central_linucb")
    synced = run("dislinucb", {"threshold": 0.0})
    np.testing.assert_array_equal(synced.regret.client_regret, central.regret.client_regret)
    np.testing.assert_array_equal(synced.regret.increment_diff, central.regret.increment_diff)


def test_dislinucb_with_infinite_threshold_is_local_learners():
    never = run("dislinucb", {"threshold": math.inf})
    local = run("oful", {"delta": 0.1})
    np.testing.assert_array_equal(never.regret.client_regret, local.regret.client_regret)
    assert never.totals["uplink_scalars"] == never.totals["downlink_scalars"] == 0


@pytest.mark.parametrize(
    "algorithm", ["dislinucb", "async_linucb", "fedlinucb", "central_linucb", "linucb_d", "greedy"]
)
def test_contextual_results_do_not_depend_on_grouping(algorithm):
    runs = [run(algorithm, horizon=300, group_size=g) for g in (None, 4, 1)]
    for other in runs[1:]:
        np.testing.assert_array_equal(other.regret.increment_diff, runs[0].regret.increment_diff)
        assert other.totals == runs[0].totals


def test_communication_counted_by_hand():
    """M = 6, d = 3, one shared model: d^2 + d = 12 scalars per statistics message."""
    central = run("central_linucb", horizon=5)
    frame = central.communication
    up = frame[frame.direction == "uplink"]["scalars"].to_numpy()
    down = frame[frame.direction == "downlink"]["scalars"].to_numpy()
    # Every round every client uploads x (3) + reward + arm = 5; from round 2 on everybody
    # downloads V and b (12).
    np.testing.assert_array_equal(up, [6 * 5] * 5)
    np.testing.assert_array_equal(down, [0] + [6 * 12] * 4)
    assert central.totals["rounds"] == 5
    synced = run("dislinucb", {"threshold": 0.0}, horizon=3)
    frame = synced.communication
    kinds = list(frame[frame.direction == "uplink"]["kind"])
    # Round 1: nothing down, 6 one-scalar triggers up; collect: a 1-scalar request down to each,
    # 6 uploads of 12 up; round 2: the new global statistics (12) down to each, 6 triggers up.
    assert kinds[:3] == ["trigger", "upload", "trigger"]
    assert frame[frame.direction == "uplink"]["scalars"].tolist()[:3] == [6, 6 * 12, 6]
    assert frame[frame.direction == "downlink"]["scalars"].tolist()[:3] == [0, 6, 6 * 12]


def test_asynchronous_protocols_communicate_less_than_full_sharing():
    central = run("central_linucb", horizon=600)
    for algorithm in ("async_linucb", "fedlinucb", "dislinucb"):
        result = run(algorithm, horizon=600)
        assert 0 < result.totals["uplink_scalars"] < 0.2 * central.totals["uplink_scalars"] * 12
        assert result.totals["downlink_scalars"] < central.totals["downlink_scalars"]


def test_contextual_algorithms_refuse_fixed_instances_and_vice_versa():
    from fedbandit.instances import PaperSyntheticParams, paper_synthetic

    fixed = paper_synthetic(PaperSyntheticParams(num_clients=3, num_arms=3))
    with pytest.raises(ValueError, match="contextual instance"):
        simulate(fixed, "linucb_d", 10, [0, 0])
    with pytest.raises(ValueError, match="fixed-feature instance"):
        simulate(SHARED, "fedpe", 10, [0, 0])


def test_linucb_d_flattens_on_diverse_contexts_but_not_on_few_points():
    """Small, fast version of the LinUCB-d headline (Wu et al. 2020): R(T) / R(T/2) averaged
    over two seeds (each seed its own instance draw and reward noise)."""

    def growth(contexts, margin):
        ratios = []
        for seed in (5, 6):
            instance = contextual_instance(
                ContextualParams(
                    contexts=contexts,
                    margin=margin,
                    num_clients=4,
                    num_arms=3,
                    dim=3,
                    noise_sigma=0.5,
                    num_points=3,
                    seed=seed,
                    balance_draws=32,
                )
            )
            result = simulate(instance, "linucb_d", 2**14, [0, seed])
            curve = result.regret.mean_cumulative_regret()
            ratios.append(curve[-1] / curve[2**13 - 1])
        return np.mean(ratios)

    diverse = growth("gaussian", 0.1)
    few_points = growth("points", 0.0)
    assert diverse < 1.01
    assert few_points > 1.05


def test_balanced_draw_raises_the_diversity_constant():
    plain = contextual_instance(ContextualParams(num_arms=4, dim=3, seed=6))
    balanced = contextual_instance(ContextualParams(num_arms=4, dim=3, seed=6, balance_draws=32))
    assert balanced.diversity()["lambda_0"] > 10 * plain.diversity()["lambda_0"]


def test_the_ledger_tells_statistics_from_bookkeeping_by_hand():
    """Issue 38: 1-scalar flags (a trigger, a collect request, the joined flag) are counted as
    communication, but an exchange that carries only flags is a bookkeeping round, not a
    statistics round. Two clients, exchanges 0-4: 0 a trigger up (flags only), 1 a collect
    (requests down, 4 statistics each up), 2 a download (4 each down) with a joined flag up,
    3 a joined flag alone up, 4 nothing (not recorded)."""
    ids = np.array([0, 1])
    ledger = CommunicationLedger(bookkeeping_fields=frozenset({"trigger", "request", "joined"}))
    empty = Message("round", 0, ids, {})
    flags = np.array([True, False])
    trigger = Message("trigger", 0, ids, {"trigger": flags}, sparse={"trigger": "trigger"})
    ledger.record_exchange(empty, trigger)
    request = Message("collect", 1, ids, {"request": np.ones(2, dtype=bool)})
    ledger.record_exchange(request, Message("upload", 1, ids, {"gram_delta": np.ones((2, 4))}))
    joined = Message("trigger", 2, ids, {"joined": ~flags}, sparse={"joined": "joined"})
    ledger.record_exchange(Message("round", 2, ids, {"gram": np.ones((2, 4))}), joined)
    alone = Message("trigger", 3, ids, {"joined": flags}, sparse={"joined": "joined"})
    ledger.record_exchange(Message("round", 3, ids, {}), alone)
    quiet = Message(
        "trigger", 4, ids, {"trigger": ~np.ones(2, dtype=bool)}, sparse={"trigger": "trigger"}
    )
    ledger.record_exchange(Message("round", 4, ids, {}), quiet)
    totals = ledger.totals()
    assert (totals["rounds"], totals["statistics_rounds"], totals["bookkeeping_rounds"]) == (
        4,
        2,
        2,
    )
    assert totals["uplink_scalars"] == 1 + 8 + 1 + 1
    assert totals["uplink_bookkeeping_scalars"] == 3
    assert totals["downlink_scalars"] == 2 + 8
    assert totals["downlink_bookkeeping_scalars"] == 2
    assert ledger.frame()["bookkeeping_scalars"].tolist() == [0, 1, 2, 0, 0, 1, 0, 1]


def test_dislinucb_authors_code_flags_are_bookkeeping_not_syncs():
    """Issue 38: with a threshold never reached, DisLinUCB sends no statistics in either mode;
    ``authors_code`` still sends each client's joined flag once (3 clients, one per step in the
    sequential order: 3 rounds), which are bookkeeping rounds, not statistics rounds. With
    syncs, every sync is two statistics rounds (the collect's uploads, the download), the
    trigger rounds bookkeeping, in both modes (fixed seed: 9 and 12 syncs)."""
    instance = contextual_instance(
        ContextualParams(
            setting="shared", num_clients=3, num_arms=4, dim=3, arrival="sequential", seed=1
        )
    )
    for fidelity, rounds in (("paper", 0), ("authors_code", 3)):
        silent = simulate(
            instance, "dislinucb", 60, [0, 1], {"fidelity": fidelity, "threshold": 1e12}
        )
        assert silent.totals["rounds"] == rounds
        assert silent.totals["bookkeeping_rounds"] == rounds
        assert silent.totals["statistics_rounds"] == 0
        assert silent.totals["uplink_bookkeeping_scalars"] == silent.totals["uplink_scalars"]
    for fidelity, syncs, rounds in (("paper", 9, 27), ("authors_code", 12, 33)):
        result = simulate(instance, "dislinucb", 60, [0, 1], {"fidelity": fidelity})
        frame = result.communication
        assert frame[frame.kind == "collect"]["round"].nunique() == syncs
        assert result.totals["statistics_rounds"] == 2 * syncs
        assert result.totals["rounds"] == rounds
        assert result.totals["bookkeeping_rounds"] == rounds - 2 * syncs


def test_cube_normalized_contexts_are_the_h_linucb_authors_actions():
    """Issue 38: ``cube_normalized`` draws each action uniform in [-1, 1]^d and normalises it,
    as ``create_action_set`` in anhddo/hlinUCB (``normalize(np.random.rand(K, d) - 0.5)``) does:
    the same unit vectors from the same uniforms, exact values at a fixed seed, and a law that
    is not the sphere's (in d = 2, |x_1| > 0.9 has chance tan(acos 0.9) / 2 = 0.242 in the
    cube's law, (2 / pi) acos 0.9 = 0.287 on the circle)."""
    params = ContextualParams(
        setting="shared", contexts="cube_normalized", num_arms=3, dim=2, seed=0
    )
    instance = contextual_instance(params)
    x = instance._raw(np.random.default_rng(7), 2)
    np.testing.assert_allclose(
        x[0],
        [[0.30038785, 0.95381714], [0.70825278, -0.70595892], [-0.47170008, 0.88175906]],
        atol=1e-8,
    )
    uniforms = np.random.default_rng(7).random((2, 3, 2))  # the authors' rand, then - 0.5
    authors = (uniforms - 0.5) / np.linalg.norm(uniforms - 0.5, axis=2, keepdims=True)
    np.testing.assert_allclose(x, authors, rtol=0, atol=1e-15)
    many = instance._raw(np.random.default_rng(1), 20000)
    np.testing.assert_allclose(np.linalg.norm(many, axis=2), 1.0, atol=1e-12)
    near_axis = float(np.mean(np.abs(many[..., 0]) > 0.9))
    assert abs(near_axis - math.tan(math.acos(0.9)) / 2) < 0.01
    sphere = contextual_instance(params.model_copy(update={"contexts": "sphere"}))
    on_circle = float(np.mean(np.abs(sphere._raw(np.random.default_rng(1), 20000)[..., 0]) > 0.9))
    assert abs(on_circle - 2 / math.pi * math.acos(0.9)) < 0.01
    for name in ("fed_heterogeneous", "fed_heterogeneous_published"):  # the authors' figure
        assert load_experiment(name).instance.contexts == "cube_normalized"
