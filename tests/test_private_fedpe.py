"""Private Fed-PE: the noise scale and the accounting by hand, the single rewards drawn given
their sum against the law of independent pulls, the noise the server receives, noise-free equals
Fed-PE bit for bit, the same results on flower-sim, and the trade-off's direction."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from cli_errors import one_line_error
from scipy.stats import norm

from fedbandit.algorithms.private_elimination import effective_counts
from fedbandit.config import load_experiment
from fedbandit.federation.runtime import InProcessRuntime, run_federation
from fedbandit.instances import PaperSyntheticParams, paper_synthetic
from fedbandit.privacy import accounted_epsilon, noise_multiplier, phase_accounting
from fedbandit.rng import PRIVACY_DOMAIN, REWARD_DETAIL_DOMAIN, client_generators
from fedbandit.simulation import build_federation, simulate

INSTANCE = paper_synthetic(PaperSyntheticParams(num_clients=8, num_arms=4, dim=3, seed=0))
PRIVATE = {"epsilon": 1.0, "delta": 1e-3, "reward_bound": 4.0}


# --- the noise scale and the accounting, by hand --------------------------------------------------


def test_the_noise_of_a_released_mean_by_hand():
    """pull: tau = z 2R / n with z for one Gaussian; client: tau = z 2R sqrt(k) with z for one
    Gaussian per phase (P of them); 0 for an arm not pulled."""
    pull = phase_accounting("pull", 1.0, 1e-5, 6, 2.0, report=False)
    assert pull.compositions == 1
    assert pull.noise_multiplier == pytest.approx(3.7306, abs=1e-4)  # one Gaussian, (1, 1e-5)
    counts = np.array([[4, 0, 1], [2, 2, 2]])
    z = pull.noise_multiplier
    np.testing.assert_allclose(
        pull.mean_noise_std(counts), [[z * 4 / 4, 0.0, z * 4 / 1], [z * 2, z * 2, z * 2]],
        rtol=1e-8,
    )  # fmt: skip
    client = phase_accounting("client", 1.0, 1e-5, 4, 2.0, report=False)
    assert client.compositions == 4
    assert client.noise_multiplier == pytest.approx(2 * 3.7306, abs=2e-4)  # z_1 sqrt(4)
    z = client.noise_multiplier
    expected = [[z * 4 * math.sqrt(2), 0.0, z * 4 * math.sqrt(2)], [z * 4 * math.sqrt(3)] * 3]
    np.testing.assert_allclose(client.mean_noise_std(counts), expected, rtol=1e-8)


def test_effective_counts_by_hand():
    """n / (1 + n tau^2 / sigma^2): with tau = z 2R / n, n = 4, z 2R = 2, sigma = 1: 4 / 2 = 2."""
    accounting = phase_accounting("pull", 1.0, 1e-5, 6, 1.0, report=False)
    z2r = 2.0 * accounting.noise_multiplier
    counts = np.array([[4, 0]])
    sigma = z2r / 2.0  # n tau^2 / sigma^2 = 4 (z 2R / 4)^2 / (z 2R / 2)^2 = 1
    np.testing.assert_allclose(effective_counts(counts, accounting, sigma), [[2.0, 0.0]], rtol=1e-8)


def test_the_accountant_reports_the_target_for_both_units():
    for unit, compositions in (("pull", 1), ("client", 7)):
        accounting = phase_accounting(unit, 2.0, 1e-4, 7, 1.0)
        assert accounting.compositions == compositions
        assert accounting.epsilon == pytest.approx(2.0, abs=0.01)
        z = noise_multiplier(2.0, 1e-4, compositions)
        assert accounting.epsilon == accounted_epsilon(z, compositions, 1e-4)


# --- single rewards given their sum ---------------------------------------------------------------


def test_a_bound_no_reward_reaches_leaves_the_sums_bit_for_bit():
    env = INSTANCE.make_environment(np.arange(8), 1000, [0, 0])
    executed, sums = env.pull_counts(np.full((8, 4), 30))
    rngs = client_generators([0, 0], range(8), REWARD_DETAIL_DOMAIN)
    clipped_sums, clipped = env.clip_block_rewards(executed, sums, 1e6, rngs)
    np.testing.assert_array_equal(clipped_sums, sums)
    np.testing.assert_array_equal(clipped, 0)


def test_clipped_sums_have_the_law_of_clipped_independent_pulls():
    """Seed-averaged over 400 clients x 4 arms x 50 pulls: the number clipped and the clipped
    sums match those of 50 independent N(mu, 1) rewards clipped to [-1, 1] (means in [0.5, 0.8],
    so about a third are clipped): E[clip(Y)] = mu - E[(Y - 1)^+] + E[(-1 - Y)^+]."""
    instance = paper_synthetic(PaperSyntheticParams(num_clients=400, num_arms=4, dim=3, seed=1))
    env = instance.make_environment(np.arange(400), 1000, [5, 0])
    executed, sums = env.pull_counts(np.full((400, 4), 50))
    rngs = client_generators([5, 0], range(400), REWARD_DETAIL_DOMAIN)
    clipped_sums, clipped = env.clip_block_rewards(executed, sums, 1.0, rngs)
    mu = instance.mean_rewards()
    above, below = norm.sf(1.0 - mu), norm.cdf(-1.0 - mu)
    expected_count = 50 * (above + below).sum()
    count_sd = math.sqrt(50 * ((above + below) * (1 - above - below)).sum())
    assert abs(clipped.sum() - expected_count) < 4 * count_sd

    def excess(m):  # E[(Y - 1)^+] for Y ~ N(m, 1)
        return norm.pdf(1.0 - m) - (1.0 - m) * norm.sf(1.0 - m)

    clipped_mean = mu - excess(mu) + excess(-mu)
    assert abs(clipped_sums.sum() - 50 * clipped_mean.sum()) < 4 * math.sqrt(400 * 4 * 50)
    assert np.all(np.abs(clipped_sums) <= 50.0 + 1e-9)  # 50 rewards within [-1, 1]
    untouched = clipped == 0
    np.testing.assert_array_equal(clipped_sums[untouched], sums[untouched])


# --- what the server receives -------------------------------------------------------------------


def _recorded_reports(params, instance=INSTANCE, horizon=64):
    server, groups = build_federation(instance, "private_fedpe", horizon, [3, 0], params)
    received = []
    aggregate = server.aggregate

    def recording(reply):
        if reply.kind == "report":  # copied: a client reuses its estimates' buffer
            received.append({name: value.copy() for name, value in reply.fields.items()})
        aggregate(reply)

    server.aggregate = recording
    run_federation(server, InProcessRuntime(groups))
    return server, received


def test_the_server_receives_only_the_noisy_estimates():
    """Phase 0 (every arm once) acts alike with and without noise, so its estimates differ by
    exactly the noise of each client's own stream: tau xi x / ||x||^2, xi the client's first K
    draws; seed-averaged, xi has unit variance."""
    instance = paper_synthetic(PaperSyntheticParams(num_clients=300, num_arms=4, dim=3, seed=2))
    server, noisy = _recorded_reports(PRIVATE, instance)
    _, clean = _recorded_reports({**PRIVATE, "noise": False}, instance)
    difference = noisy[0]["estimate"] - clean[0]["estimate"]
    x = instance.features
    tau = server.accounting.mean_noise_std(np.ones((300, 4), dtype=np.int64))
    xi = (difference * x).sum(axis=-1) / tau  # tau xi x / ||x||^2, dotted with x
    assert xi.var() == pytest.approx(1.0, rel=0.1) and abs(xi.mean()) < 0.1
    rng = client_generators([3, 0], [7], PRIVACY_DOMAIN)[0]
    np.testing.assert_allclose(xi[7], rng.standard_normal(4), rtol=1e-9)
    assert np.all(np.abs(difference) > 0)


# --- Fed-PE without noise; runtimes; the trade-off ------------------------------------------------


def test_without_noise_and_clipping_private_fedpe_equals_fedpe_bit_for_bit():
    params = {**PRIVATE, "noise": False, "reward_bound": 1e6}
    private = simulate(INSTANCE, "private_fedpe", 2048, [1, 0], params)
    fedpe = simulate(INSTANCE, "fedpe", 2048, [1, 0])
    np.testing.assert_array_equal(private.regret.increment_diff, fedpe.regret.increment_diff)
    np.testing.assert_array_equal(private.regret.client_regret, fedpe.regret.client_regret)
    assert private.totals == fedpe.totals
    assert private.report["clipped"] == {"features": 0, "rewards": 0}
    assert private.report["privacy"]["noise"] is False


def test_clipping_is_counted_and_enters_the_uploads():
    """Phase 0 pulls every arm once: with R = 0.5 below most means, the upload of arm a is
    clip(y) x / ||x||^2, so the estimate's projection on x is the clipped reward itself."""
    params = {**PRIVATE, "noise": False, "reward_bound": 0.5}
    private = simulate(INSTANCE, "private_fedpe", 2048, [1, 0], params)
    assert 0 < private.report["clipped"]["rewards"] < 8 * 2048
    _, clipped = _recorded_reports(params)
    _, clean = _recorded_reports({**params, "reward_bound": 1e6})
    x = INSTANCE.features
    rewards = (clean[0]["estimate"] * x).sum(axis=-1)
    np.testing.assert_allclose(
        (clipped[0]["estimate"] * x).sum(axis=-1), np.clip(rewards, -0.5, 0.5), atol=1e-12
    )
    assert np.any(np.abs(rewards) > 0.5)


def test_private_fedpe_gives_the_same_results_on_flower_sim():
    from fedbandit.flower.simulation import simulate_flower_seeds
    from fedbandit.registry import build_instance
    from fedbandit.runspec import RunSpec, RuntimeOptions

    experiment = load_experiment("fed_private_pe", ["horizon=512", "seeds=1"])
    options = RuntimeOptions(runtime="flower-sim", nodes=3)
    spec = RunSpec(experiment=experiment, algorithm="private_fedpe", seed=0, options=options)
    results = []
    simulate_flower_seeds([spec], lambda _, result: results.append(result))
    local = simulate(
        build_instance(experiment.instance), "private_fedpe", 512, spec.entropy,
        experiment.hyperparameters("private_fedpe"),
    )  # fmt: skip
    np.testing.assert_array_equal(results[0].regret.increment_diff, local.regret.increment_diff)
    assert results[0].totals == local.totals and results[0].report == local.report


def test_grouping_does_not_change_the_noise():
    params = {**PRIVATE, "reward_bound": 2.0}
    whole = simulate(INSTANCE, "private_fedpe", 1024, [4, 0], params)
    split = simulate(INSTANCE, "private_fedpe", 1024, [4, 0], params, group_size=3)
    np.testing.assert_array_equal(whole.regret.increment_diff, split.regret.increment_diff)
    assert whole.report == split.report


def test_regret_falls_as_epsilon_grows():
    """Seed-averaged (4 seeds): epsilon 0.05 explores almost uniformly, epsilon 20 is close to
    Fed-PE; and protecting a whole client (user-level local DP) costs more than one pull."""
    instance = paper_synthetic(PaperSyntheticParams(num_clients=20, num_arms=5, dim=3, seed=0))

    def regret(params):
        finals = [
            simulate(instance, "private_fedpe", 8192, [0, s], params).regret.client_regret.mean()
            for s in range(4)
        ]
        return float(np.mean(finals))

    low = regret({**PRIVATE, "epsilon": 0.05})
    high = regret({**PRIVATE, "epsilon": 20.0})
    client = regret({**PRIVATE, "epsilon": 20.0, "unit": "client"})
    assert high < 0.9 * low
    assert client > high


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("params.private_fedpe.epsilon=-1", "epsilon"),
        ("params.private_fedpe.delta=0", "delta"),
        ("params.private_fedpe.unit='user'", "unit"),
    ],
)
def test_values_without_a_guarantee_are_one_line_errors(tmp_path, override, named):
    line = one_line_error("run", "fed_private_pe", "--set", override, "--out", str(tmp_path / "o"))
    assert named in line


def test_a_missing_reward_bound_is_a_one_line_error(tmp_path):
    config = tmp_path / "private.toml"
    config.write_text(
        'horizon = 100\nseeds = 1\nalgorithms = ["private_fedpe"]\n'
        '[instance]\nkind = "paper_synthetic"\nnum_clients = 4\nnum_arms = 3\ndim = 2\n'
        "[params.private_fedpe]\nepsilon = 1.0\ndelta = 0.01\n"
    )
    assert "reward_bound" in one_line_error("run", str(config), "--out", str(tmp_path / "o"))


def test_fed_private_pe_reports_epsilon_in_the_summary_manifest_and_table(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "fedbandit.cli", "run", "fed_private_pe", "--set", "horizon=512",
         "--set", "seeds=2", "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    private = summary["private_fedpe"]
    assert private["epsilon"] == pytest.approx(1.0, abs=0.01) and private["delta"] == 0.01
    assert private["privacy"]["unit"] == "pull" and private["privacy"]["compositions"] == 1
    assert "clipped_per_seed" in private and "epsilon" not in summary["fedpe"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["privacy"]["private_fedpe"]["neighbouring"].startswith("replace one pull")
    row = next(line for line in done.stdout.splitlines() if line.startswith("private_fedpe"))
    assert row.split()[-1] == "1"


def test_clip_block_rewards_equals_a_plain_loop_over_the_pulls():
    """The compiled pass against the construction written out pull by pull: y_j = S / n +
    sigma (w_j - wbar), each clipped, summed; the w_j are each client's draws in arm order."""
    env = INSTANCE.make_environment(np.arange(8), 1000, [6, 0])
    executed, sums = env.pull_counts(np.array([[3, 0, 5, 1]] * 8))
    clipped_sums, clipped = env.clip_block_rewards(
        executed, sums, 1.0, client_generators([6, 0], range(8), REWARD_DETAIL_DOMAIN)
    )
    rngs = client_generators([6, 0], range(8), REWARD_DETAIL_DOMAIN)
    for i in range(8):
        w = rngs[i].standard_normal(int(executed[i].sum()))
        start, count = 0, 0
        for a in range(4):
            n = int(executed[i, a])
            total = 0.0
            for j in range(start, start + n):
                y = sums[i, a] / n + 1.0 * (w[j] - w[start : start + n].mean())
                count += abs(y) > 1.0
                total += min(max(y, -1.0), 1.0)
            if n:
                assert clipped_sums[i, a] == pytest.approx(total, abs=1e-12)
            start += n
        assert clipped[i] == count


def test_noise_free_rewards_cannot_weigh_noisy_estimates():
    from fedbandit.errors import ConfigError

    instance = paper_synthetic(
        PaperSyntheticParams(num_clients=4, num_arms=3, dim=2, noise_sigma=0.0, seed=0)
    )
    with pytest.raises(ConfigError, match="noise_sigma > 0"):
        simulate(instance, "private_fedpe", 64, [0, 0], PRIVATE)
    simulate(instance, "private_fedpe", 64, [0, 0], {**PRIVATE, "noise_sigma": 0.5})
