"""Flower App shim: the components live in the installed ``fedbandit`` package."""
