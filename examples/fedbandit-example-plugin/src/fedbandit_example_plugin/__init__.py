"""An example third-party fedbandit plugin.

- ``FED_UCB``: the ``fed_ucb`` algorithm (``fedbandit.algorithms`` entry point), a phased
  federated UCB for fixed-feature instances (``algorithm.py``).
- ``TWO_GROUPS``: the ``two_groups`` instance kind (``fedbandit.instances`` entry point), two
  client populations whose best arms differ (``instance.py``).

fedbandit finds both through the entry points declared in ``pyproject.toml`` once this package is
installed; nothing in fedbandit is changed.
"""

from fedbandit_example_plugin.algorithm import FED_UCB, FedUCBParams
from fedbandit_example_plugin.instance import TWO_GROUPS, TwoGroupsParams, two_groups

__version__ = "0.1.0"

__all__ = ["FED_UCB", "TWO_GROUPS", "FedUCBParams", "TwoGroupsParams", "two_groups"]
