"""Flower runtimes: the same server and client logic over Flower's Message API (flwr 1.42).

Only this subpackage imports Flower; algorithm code never does. Its ``internals`` subpackage alone
uses Flower's private modules (pinned to one Flower series); the rest uses Flower's public API.
"""
