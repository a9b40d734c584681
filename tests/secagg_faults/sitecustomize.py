"""Test-only fault injection for a SuperNode's SecAgg+ stages, loaded by Python at start-up when
this folder is on ``PYTHONPATH`` and ``FEDBANDIT_TEST_SECAGG_FAULT`` is set.

``FEDBANDIT_TEST_SECAGG_FAULT="MODE:STAGE:N:COUNTER"`` acts on the node's N-th message (from 1) of
the SecAgg+ stage STAGE (``setup``, ``share_keys``, ``collect_masked_vectors``, ``unmask``):

- ``kill``: the node dies before it answers: its whole process group (the SuperNode and its
  ClientApp processes) gets SIGKILL, as a machine that fails would;
- ``error``: that message and every later one of the stage are answered with an error (the
  ClientApp raises), while the node answers every other message as usual.

COUNTER is a file that counts the stage's messages across the node's processes (a ClientApp
process may serve one message only). Each fault is printed to standard error first.
"""

import os
import signal
import sys

_SPEC = os.environ.get("FEDBANDIT_TEST_SECAGG_FAULT", "")


def _install(spec: str) -> None:
    import flwr.client.mod

    mode, stage, number, counter = spec.split(":", 3)
    original = flwr.client.mod.secaggplus_mod

    def faulty_secaggplus_mod(msg, ctxt, call_next):
        configs = msg.content.config_records.get("secaggplus_configs")
        if configs is not None and str(configs.get("stage")) == stage:
            with open(counter, "a+") as file:
                file.write("x")
                file.seek(0)
                seen = len(file.read())
            if mode == "kill" and seen == int(number):
                print(
                    f"secagg fault: killed at {stage} message {seen}", file=sys.stderr, flush=True
                )
                os.killpg(os.getpgrp(), signal.SIGKILL)
            if mode == "error" and seen >= int(number):
                print(f"secagg fault: error at {stage} message {seen}", file=sys.stderr, flush=True)
                raise RuntimeError(f"injected SecAgg+ fault at {stage} message {seen}")
        return original(msg, ctxt, call_next)

    flwr.client.mod.secaggplus_mod = faulty_secaggplus_mod


if _SPEC:
    _install(_SPEC)
