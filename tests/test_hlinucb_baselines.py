"""The H-LinUCB authors' baselines (issue 38): ``radius = "hlinucb_code"`` of ``oful`` and
``dislinucb`` against their Ind-OFUL and DisLinUCB.

The transcriptions below are written from ``anhddo/hlinUCB``, ``algo.py`` (``oful``, :42-69;
``dis_lin_ucb``, :87-127; both with ``sqrt_beta``, :28-29) in plain loops with full matrices and
``np.linalg.inv`` (no code shared with the package), replayed on our streams in the round-robin
order, which is the code's (``for t ...: for m in range(M)``): the actor's contexts are ours and
the arm it picks gets its mean under the client's parameter plus our noise draw."""

from __future__ import annotations

import math

import numpy as np
import pytest
from step_recorder import run_recording_syncs

from fedbandit.contextual.instances import ContextualParams, contextual_instance
from fedbandit.simulation import build_federation

M, K, D_DIM, ROUNDS = 4, 5, 3, 100
HORIZON = M * ROUNDS  # global steps of the round-robin order


def _instance():
    """Gaussian contexts, not the code's unit vectors: on a sphere every arm ties at a client's
    first pull (theta_hat = 0, equal widths), and rounding would pick the arm."""
    return contextual_instance(
        ContextualParams(
            setting="shared",
            contexts="gaussian",
            num_clients=M,
            num_arms=K,
            dim=D_DIM,
            noise_sigma=1.0,
            arrival="round_robin",
            heterogeneity=0.15,
            seed=5,
        )
    )


def _run_ours(algorithm: str, params: dict):
    """Per global step the actor, contexts, arm and reward; the steps after which a sync began."""
    instance = _instance()
    server, groups = build_federation(instance, algorithm, HORIZON, [7, 0], params)
    steps, syncs = run_recording_syncs(server, groups, HORIZON)
    return instance, steps, syncs


def _sqrt_beta(lambda_, m2, delta, d, n, L):
    """``sqrt_beta`` of ``algo.py``:28-29."""
    return math.sqrt(lambda_) * m2 + math.sqrt(
        2 * math.log(1 / delta) + d * math.log(1 + n * L**2 / d / lambda_)
    )


def _step(instance, steps, s, m, inv_cov, theta_hat, beta):
    """One pull of ``algo.py``'s loops on our step ``s``: (arm, x, reward)."""
    assert steps[s]["actor"] == m
    action_set = steps[s]["contexts"]
    weighted_norm = np.sqrt(np.diag(action_set @ inv_cov @ action_set.T))
    arm = int(np.argmax(action_set @ theta_hat + beta * weighted_norm))
    theta_m = instance.client_thetas[m, 0]
    noise = steps[s]["reward"] - float(action_set[steps[s]["arm"]] @ theta_m)
    x = action_set[arm]
    return arm, x, float(x @ theta_m) + noise


def _authors_oful(instance, steps):
    """``independence_run`` of ``algo.py``: ``oful`` per client, T rounds, delta = 1/T."""
    lambda_, d, T = 1.0, D_DIM, ROUNDS
    delta = 1.0 / T
    arms = {}
    for m in range(M):
        cov, b = np.identity(d) * lambda_, np.zeros(d)
        for t in range(T):
            inv_cov = np.linalg.inv(cov)
            beta = _sqrt_beta(lambda_, 1, delta, d, t, 1)
            s = t * M + m
            arms[s], x, reward = _step(instance, steps, s, m, inv_cov, inv_cov @ b, beta)
            cov += np.outer(x, x)
            b += reward * x
    return [arms[s] for s in range(HORIZON)]


def _authors_dis_lin_ucb(instance, steps, D):
    """``dis_lin_ucb`` of ``algo.py`` with sync threshold ``D`` (the code's
    sqrt(T log(M T) / (d M)), or inf: no sync), delta = 1 / (M T); rounds 1..T-1 (ours 1..T).
    Returns the arms by global step and the steps whose pull triggered a sync."""
    lambda_, d, T = 1.0, D_DIM, ROUNDS
    delta = 1.0 / (M * T)
    cov = [np.zeros((d, d)) for _ in range(M)]
    b = [np.zeros(d) for _ in range(M)]
    cov_sync, b_sync = lambda_ * np.identity(d), np.zeros(d)
    t_last = 0
    arms, syncs = [], []
    for t in range(1, T):
        for m in range(M):
            s = (t - 1) * M + m
            cov_m, b_m = cov_sync + cov[m], b_sync + b[m]
            inv_cov = np.linalg.inv(cov_m)
            beta = _sqrt_beta(lambda_, 1, delta, d, t, 1)
            arm, x, reward = _step(instance, steps, s, m, inv_cov, inv_cov @ b_m, beta)
            arms.append(arm)
            grown = np.linalg.det(cov_m + np.outer(x, x)) / np.linalg.det(cov_sync)
            if math.log(grown) * (t - t_last) > D:
                cov_sync, b_sync = cov_sync + sum(cov), b_sync + sum(b)
                t_last = t
                cov = [np.zeros((d, d)) for _ in range(M)]
                b = [np.zeros(d) for _ in range(M)]
                syncs.append(s)
            cov[m] = cov[m] + np.outer(x, x)
            b[m] = b[m] + reward * x
    return arms, syncs


def _arms(steps, last=HORIZON):
    return [steps[s]["arm"] for s in range(last)]


@pytest.mark.parametrize("radius", ["hlinucb_code", "self_normalized"])
def test_oful_radius_is_the_authors_ind_oful(radius):
    """Same arms at every step with the option; without it the picks part."""
    instance, steps, _ = _run_ours("oful", {"delta": 1.0 / ROUNDS, "radius": radius})
    same = _arms(steps) == _authors_oful(instance, steps)
    assert same == (radius == "hlinucb_code")


@pytest.mark.parametrize("radius", ["hlinucb_code", "self_normalized"])
def test_dislinucb_radius_is_the_authors_without_syncs(radius):
    """The radius alone (no sync on either side): the code's rounds 1..T-1, all the same arms
    with the option (t counts one client's rounds, delta = 1 / (M T)); without it they part."""
    params = {"delta": 1.0 / (M * ROUNDS), "threshold": math.inf, "radius": radius}
    instance, steps, syncs = _run_ours("dislinucb", params)
    arms, ref_syncs = _authors_dis_lin_ucb(instance, steps, math.inf)
    assert syncs == ref_syncs == []
    same = _arms(steps, (ROUNDS - 1) * M) == arms
    assert same == (radius == "hlinucb_code")


def test_dislinucb_with_the_authors_threshold_agrees_up_to_the_first_sync():
    """With the code's D the first sync is triggered at the same step and the arms agree up to
    it; then the sync rules part (the code keeps the triggering sample out of the sync, checks
    the later clients of the round with t - t_last = 0; ours syncs after the step with it).
    The first sync comes early (step 5 here): this checks the trigger before it, not the radius
    (the test without syncs does)."""
    D = math.sqrt(ROUNDS * math.log(M * ROUNDS) / D_DIM / M)
    params = {"delta": 1.0 / (M * ROUNDS), "threshold": D, "radius": "hlinucb_code"}
    instance, steps, syncs = _run_ours("dislinucb", params)
    arms, ref_syncs = _authors_dis_lin_ucb(instance, steps, D)
    assert syncs and ref_syncs and syncs[0] == ref_syncs[0]
    first = ref_syncs[0] + 1
    assert _arms(steps, first) == arms[:first]


def test_hlinucb_code_radius_with_cyrillis_code_is_one_line():
    """Two authors' codes at once is a user mistake: one line naming both keys."""
    from fedbandit.config import load_experiment
    from fedbandit.errors import ConfigError

    overrides = ["params.dislinucb.fidelity=authors_code", "params.dislinucb.radius=hlinucb_code"]
    with pytest.raises(ConfigError) as err:
        load_experiment("fed_heterogeneous_published", overrides)
    message = str(err.value)
    assert "\n" not in message
    assert "params.dislinucb" in message and "hlinucb_code" in message
    assert "authors_code" in message
