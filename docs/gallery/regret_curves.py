"""Regret curves of Fed-PE and its baselines

Per-client cumulative regret R(t)/M of the four algorithms of the Fed-PE paper's comparison on
`fedpe_tiny` (20 clients, 5 arms, d = 3, T = 4,096), mean of 3 seeds with a 95% band. The
federated algorithms stop paying regret once every client is down to its best arm; Local UCB,
which never communicates, keeps paying it like log t.
"""

import sys
from pathlib import Path

import matplotlib.pyplot as plt

import fedbandit

out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
results = fedbandit.run("fedpe_tiny", seeds=3, progress=False)
print(results.summary[["algorithm", "final_regret_mean", "rounds"]].to_string(index=False))

fig, ax = plt.subplots(figsize=(7, 4.2))
results.plot_regret(ax=ax, log_x=True)
fig.tight_layout()
fig.savefig(out / "regret_curves.png", dpi=110)
