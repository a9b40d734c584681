"""fedbandit's own algorithms, one module per family; each module defines its registry entries
(``AlgorithmSpec`` constants) at its end, and ``pyproject.toml`` declares them under the
``fedbandit.algorithms`` entry-point group exactly as a plugin declares its own.

- ``phased_elimination``: Fed-PE (``fedpe``, ``fedpe_shared``), Enhanced Fed-PE, Collaborative;
- ``local_ucb``: UCB per client (``local_ucb``);
- ``linucb``: local ridge learners (``linucb_d``, ``linucb``, ``oful``, ``greedy``);
- ``federated_linucb``: ``dislinucb``, ``async_linucb``, ``fedlinucb``, ``central_linucb``.

Look names up through ``fedbandit.get_algorithm`` (``fedbandit.registry``), which adds plugins.
"""
