"""The ``fedbandit`` command line: ``main`` runs it, ``build_parser`` builds its parser."""

from fedbandit.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
