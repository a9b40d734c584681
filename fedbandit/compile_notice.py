"""One line on the terminal when numba compiles fedbandit's kernels, and how long it took.

Every kernel is ``numba.njit(cache=True)``: compiled once, then loaded from numba's on-disk cache
by later commands (the ``__pycache__`` folder beside the module, or numba's user-wide cache folder
when the installed package's folder is read-only; ``NUMBA_CACHE_DIR`` overrides both). A first run
(a fresh install, or a new numba) compiles them, which may take a minute on a slow machine; this
module says so on stderr, once per command, with the time taken:

    fedbandit: compiling kernels (first run only) ...
    fedbandit: kernels compiled in 41.2 s; later runs load them from numba's cache

It listens to numba's ``numba:compile`` event, which numba triggers only when it compiles (a
kernel loaded from the cache does not trigger it). The worker processes of a command compile
side by side: the first process of the command that compiles takes a marker file (named by
``FEDBANDIT_COMPILE_NOTICE``, set by the command's first process and inherited by its workers)
and alone prints both lines; the time is its own compilation's (the others', in parallel, are
similar). ``FEDBANDIT_COMPILE_NOTICE=off`` silences it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import tempfile
import time
import uuid
from multiprocessing import util as multiprocessing_util
from typing import Any

from numba.core import event as numba_event

#: The environment variable naming this command's marker (or ``off``).
NOTICE_VARIABLE = "FEDBANDIT_COMPILE_NOTICE"


def _marker_path(key: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"fedbandit-compile-notice-{key}")


def _take_marker(key: str) -> bool:
    """True for the first process of the command to ask (the marker file is created
    exclusively); False for the others, or when no marker can be written."""
    try:
        descriptor = os.open(_marker_path(key), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return False
    os.close(descriptor)
    return True


class CompileNotice(numba_event.Listener):
    """Announces the first compilation of the process (if it is the command's first) and
    adds up the seconds of its outermost compilations (nested ones are inside them)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.depth = 0
        self.started = 0.0
        self.seconds = 0.0
        self.announcing: bool | None = None  # decided at the process's first compilation

    def on_start(self, event: Any) -> None:
        if self.depth == 0:
            self.started = time.perf_counter()
            if self.announcing is None:
                self.announcing = _take_marker(self.key)
                if self.announcing:
                    _say("compiling kernels (first run only) ...")
                    # at the end of this process: a worker (multiprocessing's finalizers run
                    # when it ends) or the command's own process (they also run at exit)
                    multiprocessing_util.Finalize(None, self.report, exitpriority=10)
        self.depth += 1

    def on_end(self, event: Any) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.seconds += time.perf_counter() - self.started

    def report(self) -> None:
        if self.announcing and self.seconds > 0:
            _say(
                f"kernels compiled in {self.seconds:.1f} s; later runs load them from numba's cache"
            )
            self.seconds = 0.0


def _say(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # a closed stderr: say nothing
        print(f"fedbandit: {text}", file=sys.stderr, flush=True)


_installed: list[CompileNotice] = []


def install() -> CompileNotice | None:
    """Listen for kernel compilations in this process (once; the kernel modules call it at
    import). The first process of a command names the command's marker and removes it at
    exit; its workers inherit the name. None when silenced."""
    if _installed:
        return _installed[0]
    key = os.environ.get(NOTICE_VARIABLE)
    if key == "off":
        return None
    if not key:
        key = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        os.environ[NOTICE_VARIABLE] = key
        atexit.register(_remove_marker, key, os.getpid())
    notice = CompileNotice(key)
    numba_event.register("numba:compile", notice)
    _installed.append(notice)
    return notice


def _remove_marker(key: str, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked worker
        with contextlib.suppress(OSError):
            os.unlink(_marker_path(key))
