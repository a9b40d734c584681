"""fedbandit: simulate and run federated linear bandits (Fed-PE, LinUCB-d and their baselines)."""

__version__ = "0.1.0"
