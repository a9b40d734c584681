"""Local UCB's compiled kernel against the step-by-step NumPy loop it replaced, and its memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from fedbandit.algorithms.base import ProblemSpec
from fedbandit.algorithms.local_ucb import LocalUCBClient, LocalUCBParams, ucb_bonuses
from fedbandit.bench.reference import local_ucb_numpy_loop
from fedbandit.environment import NOISE_CHUNK, STEP_BLOCK, BanditEnvironment
from fedbandit.federation.messages import Message
from fedbandit.instances import PaperSyntheticParams, SyntheticParams, paper_synthetic, synthetic
from fedbandit.simulation import problem_spec


def _start(env: BanditEnvironment) -> Message:
    return Message("start", 0, env.client_ids, {})


def _compiled(
    instance, spec: ProblemSpec, ids, horizon, entropy, sigma=None, block=512, threads=None
):
    env = instance.make_environment(ids, horizon, entropy)
    client = LocalUCBClient(spec, LocalUCBParams(noise_sigma=sigma), env)
    original = env.play_steps
    env.play_steps = lambda kernel: original(  # type: ignore[method-assign]
        kernel, block=block, threads=threads
    )
    client.handle(_start(env))
    return env


CASES = [
    # instance, horizon, entropy, sigma override, client ids, block of clients
    ("paper", 3000, [0, 0], None, slice(None), 512),
    ("fedpe_synthetic", NOISE_CHUNK + 904, [0, 0], None, slice(None), 512),  # M = 100, K = 10
    ("paper", 2 * NOISE_CHUNK + 17, [3, 1], None, slice(None), 7),
    ("synthetic", NOISE_CHUNK, [5, 2], 2.0, slice(None), 512),
    ("synthetic", 9, [1, 4], 0.3, slice(3, 11), 3),  # horizon < K: only forced pulls
    ("synthetic", 700, [2, 9], None, slice(0, 1), 512),
]


def _instance(name: str):
    if name == "fedpe_synthetic":  # the instance of experiments/fedpe_synthetic.toml
        return paper_synthetic(PaperSyntheticParams())
    if name == "paper":
        return paper_synthetic(PaperSyntheticParams(num_clients=23, num_arms=6, dim=3))
    return synthetic(SyntheticParams(num_clients=17, num_arms=10, dim=4, noise_sigma=0.7, seed=3))


@pytest.mark.parametrize(("name", "horizon", "entropy", "sigma", "rows", "block"), CASES)
def test_compiled_kernel_equals_the_numpy_loop(name, horizon, entropy, sigma, rows, block):
    instance = _instance(name)
    spec = problem_spec(instance, horizon)
    ids = np.arange(instance.num_clients)[rows]
    env = _compiled(instance, spec, ids, horizon, entropy, sigma, block)
    ref = instance.make_environment(ids, horizon, entropy)
    local_ucb_numpy_loop(ref, sigma if sigma is not None else spec.noise_sigma)
    got, want = env.record(), ref.record()
    np.testing.assert_array_equal(got.increment_diff, want.increment_diff)
    np.testing.assert_array_equal(got.client_regret, want.client_regret)
    np.testing.assert_array_equal(got.client_pulls, want.client_pulls)
    assert np.array_equal(got.mean_cumulative_regret(), want.mean_cumulative_regret())
    # The environment ends in the state the step-by-step loop leaves (noise streams included).
    got_state, want_state = env.state_dict(), ref.state_dict()
    assert got_state.keys() == want_state.keys()
    for key in want_state:
        np.testing.assert_array_equal(got_state[key], want_state[key], err_msg=key)


def test_regret_does_not_depend_on_the_number_of_threads():
    """Blocks of clients on 1, 2 or 3 threads (blocks handed out as threads become free): the
    same regret, byte for byte, and the same final environment state."""
    instance = synthetic(SyntheticParams(num_clients=40, num_arms=10, dim=4, seed=3))
    horizon = NOISE_CHUNK + 500
    spec = problem_spec(instance, horizon)
    ids = np.arange(instance.num_clients)
    envs = [
        _compiled(instance, spec, ids, horizon, [4, 2], block=6, threads=threads)
        for threads in (1, 2, 3)
    ]
    records, states = [env.record() for env in envs], [env.state_dict() for env in envs]
    for record, state in zip(records[1:], states[1:], strict=True):
        for field in ("increment_diff", "client_regret", "client_pulls"):
            assert getattr(record, field).tobytes() == getattr(records[0], field).tobytes()
        for key, value in states[0].items():
            assert state[key].tobytes() == value.tobytes(), key


def test_kernel_threads_policy(monkeypatch):
    from fedbandit.threads import available_cpus, kernel_threads, set_kernel_threads

    monkeypatch.delenv("FEDBANDIT_THREADS", raising=False)
    assert 1 <= kernel_threads() <= available_cpus()
    set_kernel_threads(1)
    try:
        assert kernel_threads() == 1
        monkeypatch.setenv("FEDBANDIT_THREADS", "3")  # the environment variable wins
        assert kernel_threads() == 3
        monkeypatch.setenv("FEDBANDIT_THREADS", "0")
        with pytest.raises(ValueError, match="FEDBANDIT_THREADS"):
            kernel_threads()
    finally:
        set_kernel_threads(None)


def test_a_wrong_thread_count_is_one_line_before_any_work(monkeypatch, tmp_path, capsys):
    from fedbandit.cli import main

    monkeypatch.setenv("FEDBANDIT_THREADS", "two")
    code = main(["run", "fedpe_tiny", "--seeds", "1", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        "fedbandit: error: FEDBANDIT_THREADS must be a positive integer, got 'two'"
    ]
    assert not (tmp_path / "out").exists()


def test_bonuses_equal_the_scalar_expression():
    """NumPy's scalar ``x ** 2`` is C ``pow``, which differs from ``x * x`` in the last bit for
    some x: the vectorised bonus must reproduce the scalar one exactly."""
    for sigma in (1.0, 0.7):
        steps = list(range(1, 2001)) + list(range(131072 - 2000, 131073))
        want = [sigma * np.sqrt(2.0 * np.log(1.0 + t * np.log(t) ** 2)) for t in steps]
        got = np.concatenate([ucb_bonuses(sigma, 1, 2000), ucb_bonuses(sigma, 129072, 2001)])
        assert np.array_equal(got, np.array(want))


def _peak_bytes(instance, horizon: int) -> int:
    """Peak of the arrays and objects allocated while Local UCB plays (tracemalloc: NumPy reports
    its buffers), not counting the environment built before."""
    spec = problem_spec(instance, horizon)
    env = instance.make_environment(np.arange(instance.num_clients), horizon, [0, 0])
    client = LocalUCBClient(spec, LocalUCBParams(), env)
    tracemalloc.start()
    try:
        client.handle(_start(env))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def test_memory_does_not_grow_with_the_horizon(monkeypatch):
    monkeypatch.setenv("FEDBANDIT_THREADS", "1")
    instance = paper_synthetic(PaperSyntheticParams(num_clients=40, num_arms=10, dim=3))
    _peak_bytes(instance, 64)  # compile / load the kernel outside the measurement
    short, long = _peak_bytes(instance, NOISE_CHUNK), _peak_bytes(instance, 16 * NOISE_CHUNK)
    # 16 times the horizon: the same peak (one chunk of noise, bonuses and step totals).
    assert abs(long - short) < 64 * 1024, (short, long)
    # ... far below one float per client and step (the horizon's 40 x 65,536 x 8 = 21 MB).
    assert long < 40 * 16 * NOISE_CHUNK * 8 / 8


def test_memory_of_the_noise_is_one_block_of_clients_per_thread(monkeypatch):
    """The step-by-step environment drew M x 4,096 noise at once (and stacked a copy); the kernel
    draws it for ``STEP_BLOCK`` clients at a time, in one buffer per thread."""
    instance = paper_synthetic(PaperSyntheticParams(num_clients=2000, num_arms=10, dim=3))
    _peak_bytes(instance, 16)  # load the kernel outside the measurement
    per_client_state = 3 * 10 * 8
    buffer = STEP_BLOCK * NOISE_CHUNK * 8
    monkeypatch.setenv("FEDBANDIT_THREADS", "1")
    one = _peak_bytes(instance, 16)
    assert one < buffer + 2000 * (per_client_state + 400) + 2**20, one
    assert one < 2000 * NOISE_CHUNK * 8 / 3
    monkeypatch.setenv("FEDBANDIT_THREADS", "2")
    two = _peak_bytes(instance, 16)
    assert abs(two - one - buffer) < 2**20, (one, two)
