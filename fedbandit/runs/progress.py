"""Progress of a command's runs: tqdm's bar on a terminal, a plain line every
``PLAIN_PROGRESS_SECONDS`` in a log file or a pipe."""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO

from tqdm import tqdm

#: Seconds between progress lines when standard error is not a terminal (a log file).
PLAIN_PROGRESS_SECONDS = 30.0


class Progress(Protocol):
    """What the runner asks of a progress display (tqdm's names)."""

    n: int

    def update(self, n: int = 1) -> object: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> object: ...

    def close(self) -> object: ...


class PlainProgress:
    """Progress for a log file or a pipe: a plain line "NAME: K/N runs done, S s" at most every
    ``every`` seconds and one when closed, instead of a terminal's carriage-return updates."""

    def __init__(
        self,
        total: int,
        desc: str,
        every: float = PLAIN_PROGRESS_SECONDS,
        file: TextIO | None = None,
    ) -> None:
        self.total, self.desc, self.every = total, desc, every
        self.file = file if file is not None else sys.stderr
        self.n = 0
        self.postfix = ""
        self._started = self._shown_at = time.monotonic()
        self._shown = 0

    def _line(self) -> None:
        elapsed = time.monotonic() - self._started
        last = f" (last: {self.postfix})" if self.postfix else ""
        print(
            f"{self.desc}: {self.n}/{self.total} runs done, {elapsed:.0f} s{last}",
            file=self.file,
            flush=True,
        )
        self._shown, self._shown_at = self.n, time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._shown_at >= self.every:
            self._line()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def close(self) -> None:
        if self.n != self._shown or self.n == 0:
            self._line()


def progress_bar(total: int, desc: str, enabled: bool) -> Progress:
    """tqdm's bar on a terminal; plain lines every ``PLAIN_PROGRESS_SECONDS`` otherwise (a log
    file would fill with carriage-return updates); nothing when not ``enabled``."""
    if not enabled:
        return tqdm(total=total, disable=True)
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit="run")
    return PlainProgress(total, desc)
