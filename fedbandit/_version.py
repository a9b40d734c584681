"""The version of fedbandit: its one source (``setup.cfg`` reads it at build time, the
command line's ``--version`` and every run's manifest report it)."""

__version__ = "0.1.0"
