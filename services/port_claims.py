"""Ports handed out to local services, claimed across every launcher of this user on the machine.

A local service binds its port only once its process has started, a second or more after the
launcher chose the port. Two launchers starting clusters at once (two test workers, two
``kbroker up``) could otherwise both find the same port free and hand it out, and the second
service to bind it fails with "Address already in use". Each claim is kept, under an exclusive
lock, in one small file in the temporary directory with the process that made it; a claim lapses
when that process has exited or after ``CLAIM_SECONDS``, by which time its service has bound the
port (a bound port is not free to anyone else)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

CLAIM_SECONDS = 600.0


def claims_file() -> Path:
    return Path(tempfile.gettempdir()) / f"kbroker-ports-{os.getuid()}.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def claimed_ports(path: Path | None = None) -> Iterator[PortClaims]:
    """The live claims, held under the file's lock until the block ends, then written back."""
    try:
        file = open(path or claims_file(), "a+", encoding="utf-8")  # noqa: SIM115
    except OSError:
        # The file cannot be used: only the calling process's own ports are kept apart.
        yield PortClaims({})
        return
    with file:
        fcntl.flock(file, fcntl.LOCK_EX)
        file.seek(0)
        try:
            raw = json.loads(file.read() or "{}")
        except ValueError:
            raw = {}
        if not isinstance(raw, dict):
            raw = {}
        claims = PortClaims.live(raw, time.time())
        yield claims
        file.seek(0)
        file.truncate()
        file.write(json.dumps(claims.as_json()))
        file.flush()


class PortClaims:
    """Port → (claiming pid, claimed at) for the claims that have not lapsed."""

    def __init__(self, claims: dict[int, tuple[int, float]]) -> None:
        self._claims = claims

    @classmethod
    def live(cls, raw: dict[str, list[float]], now: float) -> PortClaims:
        claims: dict[int, tuple[int, float]] = {}
        for port, entry in raw.items():
            with contextlib.suppress(TypeError, ValueError, IndexError):
                pid, at = int(entry[0]), float(entry[1])
                if now - at < CLAIM_SECONDS and _alive(pid):
                    claims[int(port)] = (pid, at)
        return cls(claims)

    def free(self, ports: Iterable[int]) -> bool:
        return all(port not in self._claims for port in ports)

    def claim(self, ports: Iterable[int]) -> None:
        now = time.time()
        for port in ports:
            self._claims[port] = (os.getpid(), now)

    def as_json(self) -> dict[str, list[float]]:
        return {str(port): [pid, at] for port, (pid, at) in self._claims.items()}
