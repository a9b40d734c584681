"""Test-only: a ServerApp that starts slowly, loaded by Python at start-up when this folder is on
``PYTHONPATH`` and ``FEDBANDIT_TEST_SERVERAPP_DELAY`` is set.

``FEDBANDIT_TEST_SERVERAPP_DELAY=S`` makes every ``flwr-serverapp`` process (the SuperLink's
SuperExec launches one per run, a child that inherits the SuperLink's environment) sleep S
seconds before Flower runs, as Python's start-up and Flower's imports take on an overloaded host;
the SuperLink gives a ServerApp 30 s from its launch to report. Each sleep is printed to
standard error.
"""

import os
import sys
import time

_DELAY = os.environ.get("FEDBANDIT_TEST_SERVERAPP_DELAY", "")

if _DELAY and os.path.basename(sys.argv[0]) == "flwr-serverapp":
    print(f"serverapp delay: sleeping {_DELAY} s", file=sys.stderr, flush=True)
    time.sleep(float(_DELAY))
