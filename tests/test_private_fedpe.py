"""Private Fed-PE: the noise scale and the accounting by hand, the clipped sums and counts drawn
given their sum against a pull-by-pull loop (same law, seed-averaged), the noise the server
receives, noise-free equals Fed-PE bit for bit, the same results on flower-sim, and the
trade-off's direction."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from cli_errors import one_line_error
from scipy.stats import ks_2samp, norm

from fedbandit.algorithms.private_elimination import effective_counts
from fedbandit.config import load_experiment
from fedbandit.federation.runtime import InProcessRuntime, run_federation
from fedbandit.instances import LinearBanditInstance, PaperSyntheticParams, paper_synthetic
from fedbandit.privacy import accounted_epsilon, clip_values, noise_multiplier, phase_accounting
from fedbandit.rng import PRIVACY_DOMAIN, REWARD_DETAIL_DOMAIN, client_generators
from fedbandit.simulation import build_federation, simulate
from fedbandit.streams import ClientStreams

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
    streams = ClientStreams.seeded([0, 0], range(8), REWARD_DETAIL_DOMAIN)
    clipped_sums, clipped = env.clip_block_rewards(executed, sums, 1e6, streams)
    np.testing.assert_array_equal(clipped_sums, sums)
    np.testing.assert_array_equal(clipped, 0)


def test_clipped_sums_have_the_law_of_clipped_independent_pulls():
    """Seed-averaged over 400 clients x 4 arms x 50 pulls: the number clipped and the clipped
    sums match those of 50 independent N(mu, 1) rewards clipped to [-1, 1] (means in [0.5, 0.8],
    so about a third are clipped): E[clip(Y)] = mu - E[(Y - 1)^+] + E[(-1 - Y)^+]."""
    instance = paper_synthetic(PaperSyntheticParams(num_clients=400, num_arms=4, dim=3, seed=1))
    env = instance.make_environment(np.arange(400), 1000, [5, 0])
    executed, sums = env.pull_counts(np.full((400, 4), 50))
    streams = ClientStreams.seeded([5, 0], range(400), REWARD_DETAIL_DOMAIN)
    clipped_sums, clipped = env.clip_block_rewards(executed, sums, 1.0, streams)
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


def _clip_pull_by_pull(
    means: np.ndarray, counts: np.ndarray, sigma: float, bound: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reference: every one of the n_a pulls of arm a drawn as its own N(mu_a, sigma^2)
    reward, clipped to [-bound, bound] as ``clip_values`` does, summed. Per client (rows) and arm:
    (unclipped sums, clipped sums, clipped counts)."""
    clients = means.shape[0]
    raw, clipped_sums = np.zeros(means.shape), np.zeros(means.shape)
    clipped = np.zeros(means.shape, dtype=np.int64)
    for a, n in enumerate(counts):
        for i in range(clients):
            y = means[i, a] + sigma * rng.standard_normal(n)
            clip, outside = clip_values(y, bound)
            raw[i, a], clipped_sums[i, a], clipped[i, a] = y.sum(), clip.sum(), outside.sum()
    return raw, clipped_sums, clipped


#: (mu_a, n_a) per arm, clipped to [-R, R] with R below, sigma = 1: rare clipping in short blocks
#: on either side (thinning) and in a long one (splitting along the bridge), a mean near and a
#: mean beyond the bound (many clipped: every reward drawn given the sum).
_CLIP_CASES = {
    4.0: ([0.75, 0.75, 3.0, -0.75], [40, 3000, 200, 40]),
    1.0: ([0.75, 2.5, -0.2], [50, 7, 300]),
}


@pytest.mark.parametrize("bound", sorted(_CLIP_CASES))
def test_clipped_sums_and_counts_have_the_law_of_a_pull_by_pull_loop(bound):
    """``clip_block_rewards`` (the rewards beyond the bound drawn given each block's sum, without
    the other pulls) against the plain loop that draws and clips every pull, over 1500 clients
    (independent replications): per arm, the clipped counts and the clipping corrections
    (clipped sum - unclipped sum, where the law given the sum shows) have the same distribution
    (two-sample Kolmogorov-Smirnov, p > 0.001 each) and the exact means of independently
    clipped pulls (within 4 standard errors). A wrong law fails: the loop with sigma = 1.1
    instead of 1 is rejected by the same test on the counts."""
    means, counts = (np.array(v) for v in _CLIP_CASES[bound])
    clients, arms = 1500, len(means)
    instance = LinearBanditInstance(
        np.broadcast_to(means[None, :, None], (clients, arms, 1)).copy(),
        np.ones((arms, 1)),
        1.0,
        True,
    )
    env = instance.make_environment(np.arange(clients), int(counts.sum()), [7, 0])
    executed, sums = env.pull_counts(np.broadcast_to(counts, (clients, arms)).copy())
    clipped_sums, clipped = np.empty_like(sums), np.empty_like(executed)
    for a in range(arms):  # one arm at a time, so that the counts are per arm
        only = np.where(np.arange(arms) == a, executed, 0)
        streams = ClientStreams.seeded([7, a], range(clients), REWARD_DETAIL_DOMAIN)
        arm_sums, clipped[:, a] = env.clip_block_rewards(only, sums, bound, streams)
        clipped_sums[:, a] = arm_sums[:, a]
    raw, loop_sums, loop_clipped = _clip_pull_by_pull(
        means[None, :].repeat(clients, 0), counts, 1.0, bound, np.random.default_rng(11)
    )
    _, _, wider = _clip_pull_by_pull(
        means[None, :].repeat(clients, 0), counts, 1.1, bound, np.random.default_rng(12)
    )
    above, below = norm.sf(bound - means), norm.cdf(-bound - means)

    def excess(m):  # E[(Y - R)^+] for Y ~ N(m, 1)
        return norm.pdf(bound - m) - (bound - m) * norm.sf(bound - m)

    correction_mean = counts * (excess(-means) - excess(means))  # E[clip(Y) - Y] per block
    for a in range(arms):
        ours = clipped_sums[:, a] - sums[:, a]
        theirs = loop_sums[:, a] - raw[:, a]
        assert ks_2samp(clipped[:, a], loop_clipped[:, a], method="asymp").pvalue > 1e-3
        assert ks_2samp(ours, theirs, method="asymp").pvalue > 1e-3
        expected = counts[a] * (above[a] + below[a])
        se = math.sqrt(max(counts[a] * (above[a] + below[a]), 1e-12) / clients)
        assert abs(clipped[:, a].mean() - expected) < 4 * se + 1e-9
        assert abs(ours.mean() - correction_mean[a]) < 4 * max(ours.std(), 1e-12) / math.sqrt(
            clients
        )
    # The test can fail: a wider reward law clips more often, and the counts show it.
    assert ks_2samp(clipped.sum(axis=1), wider.sum(axis=1), method="asymp").pvalue < 1e-3


def test_noise_free_rewards_cannot_weigh_noisy_estimates():
    from fedbandit.errors import ConfigError

    instance = paper_synthetic(
        PaperSyntheticParams(num_clients=4, num_arms=3, dim=2, noise_sigma=0.0, seed=0)
    )
    with pytest.raises(ConfigError, match="noise_sigma > 0"):
        simulate(instance, "private_fedpe", 64, [0, 0], PRIVATE)
    simulate(instance, "private_fedpe", 64, [0, 0], {**PRIVATE, "noise_sigma": 0.5})
