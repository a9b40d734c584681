"""Differential privacy: the tree mechanism's arithmetic by hand, the accountant against the
Gaussian mechanism's exact curve, the noise the silos inject, and private FedLinUCB against a
plain-loop transcription of its authors' code (``Alphasxd/DPLCB``, ``Agents.py``)."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from cli_errors import one_line_error
from scipy.optimize import brentq
from scipy.stats import norm

from fedbandit.config import load_experiment
from fedbandit.contextual.instances import ContextualParams, contextual_instance
from fedbandit.federation.runtime import InProcessRuntime, run_federation
from fedbandit.privacy import (
    accounted_epsilon,
    clip_norms,
    clip_values,
    noise_multiplier,
    prefix_levels,
    regularization_shift,
    sensitivity,
    symmetric_noise,
    tree_accounting,
    tree_depth,
    tree_level,
)
from fedbandit.rng import PRIVACY_DOMAIN, client_generators
from fedbandit.simulation import build_federation, simulate

INSTANCE = contextual_instance(
    ContextualParams(
        setting="shared", contexts="sphere", num_clients=4, num_arms=5, dim=3, noise_sigma=0.5
    )
)
PRIVATE = {
    "epsilon": 1.0,
    "delta": 1e-3,
    "feature_bound": 1.0,
    "reward_bound": 100.0,  # nothing is clipped: rewards are within 100 here
    "batch_size": 10,
}


def gaussian_epsilon(multiplier: float, delta: float) -> float:
    """The exact epsilon of one Gaussian mechanism with noise multiplier z (Balle & Wang 2018,
    Theorem 8): delta(eps) = Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z), solved for eps."""

    def excess(eps: float) -> float:
        a, b = 0.5 / multiplier, eps * multiplier
        return norm.cdf(a - b) - math.exp(eps) * norm.cdf(-a - b) - delta

    return brentq(excess, 0.0, 500.0)


# --- the tree's arithmetic, by hand --------------------------------------------------------------


def test_tree_depth_level_and_prefix_by_hand():
    assert [tree_depth(k) for k in (1, 2, 3, 4, 7, 8, 80, 400)] == [1, 2, 2, 3, 3, 4, 7, 9]
    assert [tree_level(k) for k in (1, 2, 3, 4, 6, 8, 12, 80)] == [0, 1, 0, 2, 1, 3, 2, 4]
    np.testing.assert_array_equal(prefix_levels(6, 3), [False, True, True])
    np.testing.assert_array_equal(prefix_levels(5, 4), [True, False, True, False])
    with pytest.raises(ValueError):
        tree_level(0)


def test_a_round_enters_at_most_depth_released_nodes():
    """Node (level l, batch k) covers batches k - 2^l + 1 .. k: each batch lies in at most N of
    the K released nodes (the composition count of the accounting), and the prefix levels of k
    tile batches 1..k exactly once."""
    for batches in (1, 5, 8, 13, 80):
        depth = tree_depth(batches)
        cover = np.zeros(batches + 1, dtype=int)
        for k in range(1, batches + 1):
            level = tree_level(k)
            cover[k - 2**level + 1 : k + 1] += 1
            tiled = np.zeros(batches + 1, dtype=int)
            end = k
            for level in reversed(np.flatnonzero(prefix_levels(k, depth))):
                tiled[end - 2**level + 1 : end + 1] += 1
                end -= 2**level
            np.testing.assert_array_equal(tiled[1 : k + 1], 1)
        assert cover[1:].max() <= depth


def test_sensitivity_shift_and_noise_scale_by_hand():
    assert sensitivity(1.0, 2.0) == pytest.approx(math.sqrt(5.0), rel=1e-8)
    assert sensitivity(0.5, 1.0) == pytest.approx(math.sqrt(0.0625 + 0.25), rel=1e-8)
    # sqrt(M N) sigma (sqrt(N + ln(1/alpha)) + sqrt(d)); M = 4, N = 3, sigma = 2, alpha = 0.01,
    # d = 3
    expected = math.sqrt(12) * 2 * (math.sqrt(3 + math.log(100)) + math.sqrt(3))
    assert regularization_shift(2.0, 4, 3, 3, 0.01) == pytest.approx(expected, rel=1e-12)
    # One Gaussian for (1, 1e-5): z = 3.7306 (the exact curve); N Gaussians: z sqrt(N).
    assert noise_multiplier(1.0, 1e-5, 1) == pytest.approx(3.7306, abs=1e-4)
    assert noise_multiplier(1.0, 1e-5, 4) == pytest.approx(2 * 3.7306, abs=2e-4)
    silo = tree_accounting("silo_ldp", 1.0, 1e-5, 8, 16, 1.0, 1.0, report=False)
    assert silo.compositions == 4
    assert silo.silo_sigma == pytest.approx(2 * 3.7306 * math.sqrt(2), rel=1e-4)
    shuffle = tree_accounting("shuffle", 1.0, 1e-5, 8, 16, 1.0, 1.0, report=False)
    assert shuffle.silo_sigma == pytest.approx(silo.silo_sigma / 4, rel=1e-12)


def test_clipping_counts_and_limits():
    x = np.array([[3.0, 4.0], [0.6, 0.8], [0.0, 0.1]])
    clipped, which = clip_norms(x, 1.0)
    np.testing.assert_array_equal(which, [True, False, False])
    np.testing.assert_allclose(clipped[0], [0.6, 0.8])
    np.testing.assert_array_equal(clipped[1:], x[1:])
    values, which = clip_values(np.array([-3.0, 0.5, 2.0 + 1e-15, 2.5]), 2.0)
    np.testing.assert_array_equal(which, [True, False, False, True])
    np.testing.assert_array_equal(values, [-2.0, 0.5, 2.0 + 1e-15, 2.0])


# --- the accountant ------------------------------------------------------------------------------


@pytest.mark.parametrize(("multiplier", "delta"), [(1.0, 1e-5), (2.0, 1e-3), (0.8, 0.1)])
def test_the_accountant_matches_the_gaussian_mechanism_closed_form(multiplier, delta):
    exact = gaussian_epsilon(multiplier, delta)
    if multiplier == 1.0:
        assert exact == pytest.approx(4.3772, abs=1e-4)
    spent = accounted_epsilon(multiplier, 1, delta)
    assert exact - 1e-9 <= spent <= exact + 0.01  # the PLD grid only rounds up


def test_the_accountant_matches_the_closed_form_for_a_small_tree():
    """K = 5 batches: N = 3 levels, so each round is in at most 3 Gaussian releases of
    multiplier z; 3 Gaussians of multiplier z are one of multiplier z / sqrt(3) exactly."""
    accounting = tree_accounting("silo_ldp", 2.0, 1e-4, 5, 4, 1.0, 1.0)
    assert accounting.compositions == 3
    exact = gaussian_epsilon(accounting.noise_multiplier / math.sqrt(3), 1e-4)
    assert exact == pytest.approx(2.0, abs=1e-6)
    assert exact - 1e-9 <= accounting.epsilon <= exact + 0.01
    shuffle = tree_accounting("shuffle", 2.0, 1e-4, 5, 4, 1.0, 1.0)
    assert shuffle.epsilon == pytest.approx(accounting.epsilon)
    local = gaussian_epsilon(shuffle.noise_multiplier / 2 / math.sqrt(3), 1e-4)
    assert local - 1e-9 <= shuffle.epsilon_local <= local + 0.01 and local > 2.5


# --- the noise -----------------------------------------------------------------------------------


def test_symmetric_noise_has_the_stated_variances():
    """Seed-averaged: diagonal variance sigma^2, off-diagonal sigma^2 / 2, symmetric."""
    rng = np.random.default_rng(7)
    noise = symmetric_noise(rng, 3.0, (20000, 3, 3))
    np.testing.assert_array_equal(noise, np.swapaxes(noise, 1, 2))
    diagonal = noise[:, np.arange(3), np.arange(3)]
    assert diagonal.var() == pytest.approx(9.0, rel=0.03)
    assert noise[:, 0, 1].var() == pytest.approx(4.5, rel=0.04)


def _recorded_uploads(algorithm, params, horizon=10, instance=INSTANCE):
    """The upload replies the server's ``aggregate`` receives, in order."""
    server, groups = build_federation(instance, algorithm, horizon, [3, 0], params)
    received = []
    aggregate = server.aggregate

    def recording(reply):
        if reply.kind == "upload":
            received.append(reply)
        aggregate(reply)

    server.aggregate = recording
    run_federation(server, InProcessRuntime(groups))
    return server, received


def test_the_server_receives_only_the_noisy_statistics():
    """Up to the first sync the noisy and the clean run act alike, so the first upload differs
    from the clean node by exactly the injected noise: symmetric, of the stated scale (seed-
    averaged over 400 silos), and drawn from each silo's own stream."""
    instance = contextual_instance(
        ContextualParams(setting="shared", contexts="sphere", num_clients=400, num_arms=3, dim=4)
    )
    params = {**PRIVATE, "epsilon": 2.0, "regularization": 1.0}
    server, noisy = _recorded_uploads("private_fedlinucb", params, instance=instance)
    _, clean = _recorded_uploads("private_fedlinucb", {**params, "noise": False}, instance=instance)
    gram = noisy[0].fields["gram_node"] - clean[0].fields["gram_node"]
    target = noisy[0].fields["target_node"] - clean[0].fields["target_node"]
    sigma = server.accounting.silo_sigma
    assert np.all(np.abs(gram) > 0) and np.all(np.abs(target) > 0)
    np.testing.assert_allclose(gram, np.swapaxes(gram, -1, -2), rtol=0, atol=1e-9)
    diagonal = gram[:, 0, np.arange(4), np.arange(4)]
    assert diagonal.var() == pytest.approx(sigma**2, rel=0.15)
    assert gram[:, 0, 0, 1].var() == pytest.approx(sigma**2 / 2, rel=0.25)
    assert target.var() == pytest.approx(sigma**2, rel=0.15)
    # The noise is silo 7's own first draws (PRIVACY_DOMAIN), whatever the grouping.
    rng = client_generators([3, 0], [7], PRIVACY_DOMAIN)[0]
    expected = symmetric_noise(rng, sigma, (1, 4, 4))
    np.testing.assert_allclose(gram[7], expected, rtol=0, atol=1e-9)


def test_the_server_announces_each_batch_upload_and_declares_its_noisy_contributors():
    """Batches of 10 over 45 rounds close at rounds 9, 19, 29 and 39 (the last 5 rounds close
    none): a secure exchange follows every round before 39 (``secure_follows``), and with noise
    every silo fills every block of both tree nodes (``secure_contributors``: one block in the
    shared model, one per arm in the disjoint one); without noise the server cannot tell, so
    None."""
    for algorithm, params, blocks in [
        ("private_fedlinucb", PRIVATE, 1),
        ("private_fedlinucb", {**PRIVATE, "model": "disjoint"}, 5),
        ("private_fedlinucb", {**PRIVATE, "noise": False}, None),
        ("batched_fedlinucb", {"batch_size": 10}, None),
    ]:
        server, _ = build_federation(INSTANCE, algorithm, 45, [3, 0], params)
        follows, declared = [], {}
        while (message := server.configure()) is not None:
            follows.append(server.secure_follows(message))
            if server.secure_fields(message):
                declared[message.round] = server.secure_contributors(message)
        assert follows == [True] * 39 + [False] * 6
        assert sorted(declared) == [9, 19, 29, 39]
        for flags in declared.values():
            if blocks is None:
                assert flags is None
                continue
            assert set(flags) == {"gram_node", "target_node"}
            for value in flags.values():
                assert value.shape == (INSTANCE.num_clients, blocks) and value.all()


def test_without_noise_private_equals_the_batched_schedule_bit_for_bit():
    """With the authors' in-batch rule (the batched schedule's)."""
    params = {**PRIVATE, "noise": False, "regularization": 2.0, "decisions": "authors"}
    private = simulate(INSTANCE, "private_fedlinucb", 200, [1, 0], params)
    batched = simulate(
        INSTANCE, "batched_fedlinucb", 200, [1, 0], {"batch_size": 10, "regularization": 2.0}
    )
    np.testing.assert_array_equal(private.regret.increment_diff, batched.regret.increment_diff)
    np.testing.assert_array_equal(private.regret.client_regret, batched.regret.client_regret)
    assert private.totals == batched.totals
    assert private.report["clipped"] == {"features": 0, "rewards": 0}
    assert private.report["privacy"]["noise"] is False


def test_clipping_is_counted_in_the_report():
    params = {**PRIVATE, "reward_bound": 0.2, "feature_bound": 0.5}
    result = simulate(INSTANCE, "private_fedlinucb", 60, [1, 0], params)
    clipped = result.report["clipped"]
    assert clipped["features"] == 4 * 60  # every unit context is longer than 0.5
    assert 0 < clipped["rewards"] < 4 * 60
    assert result.report["privacy"]["epsilon"] == pytest.approx(1.0, abs=0.01)


# --- the authors' rule, transcribed --------------------------------------------------------------


def authors_ldp_fedlinucb(instance, horizon, entropy, params, mutate=False, own_batch=True):
    """``LDPFedLinUCB`` of ``Alphasxd/DPLCB`` (``Agents.py``: ``FedLinUCB.get_arm``,
    ``SDPFedLinUCBAmp.update``) in plain loops on our environment, its noise drawn from each
    silo's PRIVACY_DOMAIN stream (Z ~ N(0, sigma^2)^{d x d}, then the vector's d draws), sigma
    and lambda from our calibration. ``mutate``: sync the last node only (a wrong rule).
    ``own_batch=False``: decide on the synced noisy sums alone (``decisions = "noisy_only"``)."""
    M, d = instance.num_clients, instance.dim
    B = params["batch_size"]
    K = horizon // B
    N = tree_depth(K)
    accounting = tree_accounting(
        "silo_ldp", params["epsilon"], params["delta"], K, M,
        params["feature_bound"], params["reward_bound"], report=False,
    )  # fmt: skip
    sigma = accounting.silo_sigma
    Lambda = regularization_shift(sigma, M, N, d, 0.01)
    S, R, L = math.sqrt(d), instance.noise_sigma, 1.0
    rngs = client_generators(entropy, range(M), PRIVACY_DOMAIN)
    env = instance.make_environment(np.arange(M), horizon, entropy)
    Gram, Bias = np.zeros([M, d, d]), np.zeros([M, d])
    GramSync, BiasSync = np.zeros([d, d]), np.zeros(d)
    AlphaGramAll, AlphaBiasAll = np.zeros([M, N, d, d]), np.zeros([M, N, d])
    PrivGramSyncAll, PrivBiasSyncAll = np.zeros([N, d, d]), np.zeros([N, d])
    BatchNo = 1
    for t in range(1, horizon + 1):
        X, _ = env.observe()
        cew = math.sqrt(Lambda) * S + R * math.sqrt(
            d * math.log(1 + t * M * L**2 / (d * Lambda)) + math.log(1 / 0.01)
        )
        arm = np.zeros(M, dtype=int)
        for i in range(M):
            own = 1.0 if own_batch else 0.0
            Gram_inv_i = np.linalg.inv(own * Gram[i] + GramSync + Lambda * np.eye(d))
            theta_hat_i = Gram_inv_i.dot(own * Bias[i] + BiasSync)
            mu_i = X[i].dot(theta_hat_i) + cew * np.sqrt((X[i].dot(Gram_inv_i) * X[i]).sum(axis=1))
            arm[i] = np.argmax(mu_i)
        r = env.pull(arm)
        for i in range(M):
            xi = X[i][arm[i]]
            Gram[i] += np.outer(xi, xi)
            Bias[i] += xi * r[i]
        if t == BatchNo * B:
            idx = tree_level(BatchNo)
            PrivGram, PrivBias = np.zeros([d, d]), np.zeros(d)
            for i in range(M):
                AlphaGramAll[i, idx] = np.sum(AlphaGramAll[i, 0:idx], axis=0) + Gram[i]
                AlphaBiasAll[i, idx] = np.sum(AlphaBiasAll[i, 0:idx], axis=0) + Bias[i]
                NoiseGram_i = rngs[i].normal(0, sigma, [d, d])
                NoiseGram_i = (NoiseGram_i + np.transpose(NoiseGram_i)) / 2.0
                NoiseBias_i = rngs[i].normal(0, sigma, d)
                PrivGram += AlphaGramAll[i, idx] + NoiseGram_i
                PrivBias += AlphaBiasAll[i, idx] + NoiseBias_i
            PrivGramSyncAll[idx], PrivBiasSyncAll[idx] = PrivGram, PrivBias
            ones = prefix_levels(BatchNo, N)
            if mutate:
                ones = np.arange(N) == idx
            GramSync = np.sum(PrivGramSyncAll[ones], axis=0)
            BiasSync = np.sum(PrivBiasSyncAll[ones], axis=0)
            Gram, Bias = np.zeros([M, d, d]), np.zeros([M, d])
            BatchNo += 1
    return env.record()


@pytest.mark.parametrize("decisions", ["authors", "noisy_only"])
def test_private_fedlinucb_takes_the_authors_actions(decisions):
    """Both in-batch rules against the transcription: the authors' (own clean batch added) and
    ``noisy_only`` (the synced noisy sums alone)."""
    horizon = 300
    params = {**PRIVATE, "decisions": decisions}
    ours = simulate(INSTANCE, "private_fedlinucb", horizon, [2, 0], params)
    own_batch = decisions == "authors"
    theirs = authors_ldp_fedlinucb(INSTANCE, horizon, [2, 0], PRIVATE, own_batch=own_batch)
    np.testing.assert_array_equal(ours.regret.client_pulls, theirs.client_pulls)
    np.testing.assert_allclose(ours.regret.client_regret, theirs.client_regret, rtol=1e-12)
    wrong = authors_ldp_fedlinucb(INSTANCE, horizon, [2, 0], PRIVATE, own_batch=not own_batch)
    assert not np.allclose(ours.regret.client_regret, wrong.client_regret)
    wrong = authors_ldp_fedlinucb(
        INSTANCE, horizon, [2, 0], PRIVATE, mutate=True, own_batch=own_batch
    )
    assert not np.allclose(ours.regret.client_regret, wrong.client_regret)


# --- runtimes and the command line ---------------------------------------------------------------


def test_private_fedlinucb_gives_the_same_results_on_flower_sim():
    from fedbandit.flower.simulation import simulate_flower_seeds
    from fedbandit.registry import build_instance
    from fedbandit.runspec import RunSpec, RuntimeOptions

    experiment = load_experiment("fed_private", ["horizon=100", "seeds=1"])
    options = RuntimeOptions(runtime="flower-sim", nodes=3)
    specs = [
        RunSpec(experiment=experiment, algorithm=name, seed=0, options=options)
        for name in ("private_fedlinucb", "batched_fedlinucb")
    ]
    results = {}
    simulate_flower_seeds(specs, lambda spec, result: results.setdefault(spec.algorithm, result))
    for spec in specs:
        local = simulate(
            build_instance(experiment.instance), spec.algorithm, 100, spec.entropy,
            experiment.hyperparameters(spec.algorithm),
        )  # fmt: skip
        flower = results[spec.algorithm]
        np.testing.assert_array_equal(flower.regret.increment_diff, local.regret.increment_diff)
        assert flower.totals == local.totals and local.totals["uplink_scalars"] > 0
        assert flower.report == local.report


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("params.private_fedlinucb.epsilon=0", "epsilon"),
        ("params.private_fedlinucb.delta=1.0", "delta"),
        ("params.private_fedlinucb.privacy_model='central'", "privacy_model"),
    ],
)
def test_values_without_a_guarantee_are_one_line_errors(tmp_path, override, named):
    line = one_line_error("run", "fed_private", "--set", override, "--out", str(tmp_path / "o"))
    assert named in line


def test_missing_bounds_are_a_one_line_error(tmp_path):
    config = tmp_path / "private.toml"
    config.write_text(
        'horizon = 100\nseeds = 1\nalgorithms = ["private_fedlinucb"]\n'
        '[instance]\nkind = "contextual"\nsetting = "shared"\n'
        "[params.private_fedlinucb]\nepsilon = 1.0\ndelta = 0.01\n"
    )
    line = one_line_error("run", str(config), "--out", str(tmp_path / "o"))
    assert "feature_bound" in line and "reward_bound" in line


def test_fed_private_reports_epsilon_in_the_summary_manifest_and_table(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "fedbandit.cli", "run", "fed_private", "--set", "horizon=200",
         "--set", "seeds=2", "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    private = summary["private_fedlinucb"]
    assert private["epsilon"] == pytest.approx(5.0, abs=0.01) and private["delta"] == 0.01
    assert private["privacy"]["compositions"] == tree_depth(200 // 25)
    assert "epsilon" not in summary["batched_fedlinucb"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["privacy"]["private_fedlinucb"]["accountant"].startswith("dp_accounting")
    row = next(line for line in done.stdout.splitlines() if line.startswith("private_fedlinucb"))
    assert row.split()[-1] == "5"
