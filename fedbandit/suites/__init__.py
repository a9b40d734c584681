"""Benchmark suites (``fedbandit suite``): a suite names environments (experiments with their
sizes), the algorithms compared, seeds and the two reference ends of each environment; running
it scores every algorithm between those ends and aggregates the scores with rliable.

Modules: ``spec`` (suite files, validated; which algorithm applies where), ``score`` (the
normalised score, pure arithmetic), ``aggregates`` (rliable's IQM, intervals, profiles,
probability of improvement), ``running`` (the runs, resumable and cached), ``scorecard``
(``scorecard.json`` and the self-contained ``scorecard.html``), ``compare`` (two result sets).
"""
