import os
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
# The suite compiles kernels in many processes; the line that says so is tested where it matters
# (tests/test_install_core.py, the wheel in tests/test_packaging.py), silent elsewhere.
os.environ.setdefault("FEDBANDIT_COMPILE_NOTICE", "off")

#: The tiny experiments the tests run by name: fixtures, not part of the shipped catalogue.
#: Set for the whole session (the commands the tests start inherit it); a test that sets
#: ``FEDBANDIT_EXPERIMENTS`` itself replaces it.
TEST_EXPERIMENTS = Path(__file__).resolve().parent / "experiments"
os.environ["FEDBANDIT_EXPERIMENTS"] = str(TEST_EXPERIMENTS)


@pytest.fixture
def listening():
    """An address on loopback where something listens (the SuperLink's port is open)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"
