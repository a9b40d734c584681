"""A foreseen error of the command line, as a user meets it: one line, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys


def one_line_error(*argv: str, status: int = 2) -> str:
    """Run ``fedbandit ARGV`` in a fresh process; assert exit ``status`` (2: a mistake caught
    before anything ran; 75: ask again) and a single line on standard error without a
    traceback; return that line."""
    done = subprocess.run(
        [sys.executable, "-m", "fedbandit.cli", *argv], capture_output=True, text=True
    )
    assert done.returncode == status, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]
