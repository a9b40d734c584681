"""What the clients send: communication over time

Cumulative uplink (solid) and downlink (dashed) scalars per client against t for the same
`fedpe_tiny` run as the regret curves. Fed-PE's phases double in length, so its messages come in
log2(T) bursts; Local UCB sends nothing.
"""

import sys
from pathlib import Path

import matplotlib.pyplot as plt

import fedbandit

out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
results = fedbandit.run("fedpe_tiny", seeds=1, progress=False)
print(results.summary[["algorithm", "uplink_scalars", "downlink_scalars"]].to_string(index=False))

fig, ax = plt.subplots(figsize=(7, 4.2))
results.plot_communication(ax=ax)
fig.tight_layout()
fig.savefig(out / "communication.png", dpi=110)
