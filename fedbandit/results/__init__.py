"""The results folder: what a run leaves, and reading it back.

- ``files``: atomic writes, one seed's files, where a seed's files are and whether it finished;
- ``provenance``: the versions, commit, plugins and machine a manifest records;
- ``summary``: the folder's status and ``summary.json``, from the seed files alone;
- ``replay``: what a replay of logged events adds (its reward, uniform random choice's);
- ``reader``: ``Results`` / ``load_results`` and the plots of a folder (``plot_run``).

Layout of ``results/NAME/<timestamp>/``::

    config.toml                  the resolved experiment (after --set overrides)
    manifest.json                versions, git commit, seeds, instance facts, status
    runs/ALGO/seed_K.regret.csv  t, regret: mean per-client cumulative regret R(t)/M (a replay
                                 of logged events adds reward: the cumulative reward, all clients)
    runs/ALGO/seed_K.comm.csv    round, kind, direction, t, messages, scalars, bytes,
                                 bookkeeping_scalars (and authors_comm_cost: the authors'
                                 totalCommCost so far, where their code counts one)
    runs/ALGO/seed_K.clients.csv client_id, regret, pulls (at the horizon)
    runs/ALGO/seed_K.json        totals and timing; written last: marks the seed done
    summary.json                 per algorithm: final regret, CI, communication, checkpoints,
                                 R(T)/R(T/2) averaged over seeds
    plots/regret.png, plots/communication.png (and plots/reward.png for a replay;
                                 plots/communication_authors.png when asked for)

Every file is written to a temporary name and renamed, so a file is whole or absent.

A replay of logged events (an instance kind whose parameters say ``REWARD_IS_HIT``, such as
``replay``: reward 1 if the pick is the logged choice, else 0) has no true parameter; its
``regret`` is the number of *misses* (events whose pick was not the logged choice), so the
cumulative reward is t - misses(t), written as the ``reward`` column of the curve file. The
summary adds the final reward, the expected reward of uniform random choice (t / K, exact) and
their ratio; ``plots/reward.png`` draws both.
"""

from fedbandit.results.reader import Results, load_results, plot_regret, plot_run

__all__ = ["Results", "load_results", "plot_regret", "plot_run"]
