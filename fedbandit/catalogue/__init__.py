"""The data fedbandit ships, as three data packages declared in ``setup.cfg``:
``fedbandit.catalogue.experiments`` (the named experiments, ``*.toml``),
``fedbandit.catalogue.datasets`` (the data cards, ``*.md``) and ``fedbandit.catalogue.docs`` (the
documentation pages, ``**/*.md``, read by ``fedbandit docs``). Their source is the top-level
``experiments/``, ``datasets/`` and ``docs/`` folders of the source tree, mapped here by
``package_dir``; an editable install reads those folders in place, a wheel carries copies.
``fedbandit.config.shipped_folder`` finds either through ``importlib.resources``.
"""
