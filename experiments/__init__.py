"""The experiments shipped with fedbandit, installed as the data package
``fedbandit.catalogue.experiments`` (``setup.cfg``); this file only makes the folder a package."""
