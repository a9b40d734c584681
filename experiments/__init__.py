"""The experiments shipped with fedbandit, installed as the data package
``fedbandit.catalogue.experiments`` (``pyproject.toml``); this file only makes the folder a
package."""
