"""The data fedbandit ships, as two data packages declared in ``pyproject.toml``:
``fedbandit.catalogue.experiments`` (the named experiments, ``*.toml``) and
``fedbandit.catalogue.datasets`` (the data cards, ``*.md``). Their source is the repository's
top-level ``experiments/`` and ``datasets/`` folders, mapped here by ``package_dir``; an editable
install reads those folders in place, a wheel carries copies. ``fedbandit.config.shipped_folder``
finds either through ``importlib.resources``.
"""
