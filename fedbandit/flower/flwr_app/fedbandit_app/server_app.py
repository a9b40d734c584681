"""The ServerApp of a fedbandit deployment (the job comes from the run config)."""

from fedbandit.flower.apps import build_server_app

app = build_server_app()
