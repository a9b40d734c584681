"""A study: the regret/communication trade-off

`contextual_comm_tradeoff` varies the communication knob of DisLinUCB (sync threshold D),
Async-LinUCB (upload and download ratios) and FedLinUCB (alpha) from chatty to silent; here at a
reduced size (T = 600, 10 clients, 2 seeds, three of its five points). Each marker is one
point of the study: the further left, the less was sent; the lower, the less regret.
Centralised LinUCB (everything shared) and OFUL (nothing shared) are the two ends.
"""

import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

import fedbandit

out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
config = fedbandit.load_experiment(
    "contextual_comm_tradeoff", overrides=["horizon=600", "instance.num_clients=10"]
)
experiment = config.model_dump(mode="json", exclude_none=True, by_alias=True)
# Three of the study's five points along its zip: the chattiest, the middle one, the most silent.
experiment["sweep"]["zip"] = {
    key: values[::2] for key, values in experiment["sweep"]["zip"].items()
}

with tempfile.TemporaryDirectory() as folder:
    study = fedbandit.run_sweep(
        experiment, seeds=2, out=Path(folder) / "study", workers=1, progress=False
    )
    print(study.summary.to_string(index=False))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    study.plot_tradeoff(ax=ax)
    fig.tight_layout()
    fig.savefig(out / "tradeoff_front.png", dpi=110)
