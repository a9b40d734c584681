"""A finished seed's files carried through the Flower run's log, from the ServerApp to the driver.

Flower 1.42's open-source SuperLink cannot serve run artifacts (``flwr pull`` needs Flower
Enterprise's artifact provider), but it keeps every run's log and serves it to any ``flwr log``
client that reaches its Control API: the ServerApp's standard output is uploaded to the SuperLink
in batches, and ``flwr log RUN --show`` returns a finished run's whole log (payloads of tens of
megabytes came back byte-exact; the log outlives the run and a restart of a SuperLink with a
state directory). So the ServerApp prints each file as lines of this form::

    ##fedbandit-file <seq> <index>/<count> <sha256> <path> <base64 chunk>
    ##fedbandit-end <seq> <files> <sha256 of the file list>

and the driver reads them back from the log, checks every file's SHA-256 and the list, and writes
the files into its own ``--out``: no shared file system and no port beyond the SuperLink's.
``seq`` is a random tag of one emission: lines of an earlier, interrupted emission in the same
log are ignored.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import sys
from collections.abc import Iterator

from fedbandit.errors import DeploymentError

FILE_MARK = "##fedbandit-file"
END_MARK = "##fedbandit-end"
#: A detached run's progress: ``##fedbandit-seed ALGORITHM SEED start|round N|stopped``.
SEED_MARK = "##fedbandit-seed"
#: Characters of base64 per log line (the log keeps lines whole; short lines keep any single
#: write small).
CHUNK = 60_000


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _listing(files: dict[str, str]) -> str:
    """The file list's checksum: each path with its file's SHA-256, in order."""
    lines = [f"{path} {_digest(text.encode())}" for path, text in files.items()]
    return _digest("\n".join(lines).encode())


def encode_files(files: dict[str, str]) -> Iterator[str]:
    """The log lines that carry ``files`` (relative path -> text), in order, then the end line."""
    seq = secrets.token_hex(6)
    for path, text in files.items():
        if any(c.isspace() for c in path):
            raise ValueError(f"a result path holds white space: {path!r}")
        data = text.encode()
        payload = base64.b64encode(data).decode("ascii")
        chunks = [payload[i : i + CHUNK] for i in range(0, len(payload), CHUNK)] or [""]
        for index, chunk in enumerate(chunks):
            yield f"{FILE_MARK} {seq} {index}/{len(chunks)} {_digest(data)} {path} {chunk}"
    yield f"{END_MARK} {seq} {len(files)} {_listing(files)}"


def decode_files(log: str, what: str) -> dict[str, str] | None:
    """The files of the last complete emission in ``log``, checked; None when no emission has
    ended yet (the log may still be arriving). Raises ``DeploymentError`` naming ``what`` (for
    example the Flower run) when a file is incomplete or its checksum does not match."""
    emissions = decode_all(log, what)
    return emissions[-1] if emissions else None


def decode_all(log: str, what: str, broken: list[str] | None = None) -> list[dict[str, str]]:
    """The files of every complete emission in ``log``, in order, each checked (see
    ``decode_files``): a detached run emits one per seed. With ``broken`` given, an emission
    that fails its checks is left out and its reason appended there, instead of raising."""
    ends: list[list[str]] = []
    lines_of: dict[str, list[str]] = {}  # one pass: each emission's file lines, by its tag
    for line in log.splitlines():
        if line.startswith(FILE_MARK + " "):
            lines_of.setdefault(line.split(" ", 2)[1], []).append(line)
        elif line.startswith(END_MARK + " "):
            ends.append(line.split())
    emissions = []
    for end in ends:
        try:
            tag = end[1] if len(end) > 1 else ""
            emissions.append(_decode_emission(lines_of.get(tag, []), end, what))
        except DeploymentError as err:
            if broken is None:
                raise
            broken.append(str(err))
    return emissions


def write_line(line: str) -> None:
    """Put ``line`` on standard output (the run's log) in one write, on a line of its own: a
    write another thread made before it without a final newline cannot hide its mark."""
    sys.stdout.write(f"\n{line}\n")
    sys.stdout.flush()


def progress_line(algorithm: str, seed: int, event: str) -> str:
    """A detached run's progress line for the run's log (``read_progress`` reads it back)."""
    return f"{SEED_MARK} {algorithm} {seed} {event}"


def read_progress(log: str) -> dict[tuple[str, int], str]:
    """The last progress event of each (algorithm, seed) in ``log``: "start", "round N" or
    "stopped"."""
    events: dict[tuple[str, int], str] = {}
    for line in log.splitlines():
        if line.startswith(SEED_MARK + " "):
            parts = line.split(" ", 3)
            if len(parts) == 4 and parts[2].isdigit():
                events[(parts[1], int(parts[2]))] = parts[3].strip()
    return events


def _decode_emission(lines: list[str], end: list[str], what: str) -> dict[str, str]:
    """One emission's files from its file ``lines`` and ``end`` line; ``DeploymentError`` for
    anything malformed or corrupted."""
    try:
        return _checked_emission(lines, end, what)
    except (ValueError, KeyError, UnicodeDecodeError) as err:  # binascii.Error is a ValueError
        raise DeploymentError(
            f"{what}: a result file line in the run's log is malformed ({err})"
        ) from None


def _checked_emission(lines: list[str], end: list[str], what: str) -> dict[str, str]:
    if len(end) != 4:
        raise DeploymentError(f"{what}: a malformed end line in the run's log: {' '.join(end)!r}")
    count, listing = int(end[2]), end[3]
    chunks: dict[str, dict[int, str]] = {}
    expected: dict[str, tuple[int, str]] = {}
    for line in lines:
        parts = line.split(" ", 5)
        if len(parts) == 5:  # an empty file: nothing after the path
            parts.append("")
        _, _, position, digest, path, chunk = parts
        index, total = (int(n) for n in position.split("/"))
        expected[path] = (total, digest)
        chunks.setdefault(path, {})[index] = chunk
    files: dict[str, str] = {}
    for path, (total, digest) in expected.items():
        got = chunks[path]
        if sorted(got) != list(range(total)):
            raise DeploymentError(
                f"{what}: {path} arrived in {len(got)} of {total} parts through the run's log"
            )
        data = base64.b64decode("".join(got[i] for i in range(total)))
        if _digest(data) != digest:
            raise DeploymentError(f"{what}: {path} arrived corrupted (SHA-256 mismatch)")
        files[path] = data.decode()
    if len(files) != count or _listing(files) != listing:
        raise DeploymentError(
            f"{what}: the run's log holds {len(files)} result files, not the {count} announced"
        )
    return files
