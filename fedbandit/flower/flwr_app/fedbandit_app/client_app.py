"""The ClientApp of a fedbandit deployment (the job comes from the run config)."""

from fedbandit.flower.apps import build_client_app

app = build_client_app()
