"""Stochastic linear contextual bandits: instances with fresh contexts each round, their
environment, and the ridge-regression mathematics shared by the LinUCB family."""
