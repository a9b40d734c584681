"""The documentation pages shipped with fedbandit, installed as the data package
``fedbandit.catalogue.docs`` (``pyproject.toml``) and read by ``fedbandit docs``; this file only
makes the folder a package."""
