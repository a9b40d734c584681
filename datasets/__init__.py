"""The data cards shipped with fedbandit, installed as the data package
``fedbandit.catalogue.datasets`` (``pyproject.toml``); this file only makes the folder a package."""
