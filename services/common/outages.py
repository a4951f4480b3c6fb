"""Logging a collaborator's outage once, not once per failed call.

While a service another one depends on is down (restarting, killed, stopped), every request
that needs it fails; a line per failure buries the log (a busy handler wrote hundreds a
second). :class:`OutageLog` writes one warning when calls start failing, counts the failures
while they go on, and writes one line when a call succeeds again, saying how long the outage
lasted and how many calls failed in it. Not thread-safe: one event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class OutageLog:
    """The outages of one collaborator (``what``, e.g. "purgatory at 127.0.0.1:19300"),
    logged on ``logger``."""

    def __init__(self, logger: logging.Logger, what: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._what = what
        self._clock = clock
        self._since: float | None = None
        self._failures = 0

    @property
    def down(self) -> bool:
        """Whether the last call failed."""
        return self._since is not None

    def failed(self, reason: object) -> None:
        """A call failed because of ``reason``: a warning if it is the first since the last
        success, else counted (and logged at debug level)."""
        self._failures += 1
        if self._since is None:
            self._since = self._clock()
            self._log.warning("%s is unavailable: %s (further failures are counted until it "
                              "answers again)", self._what, reason)
        else:
            self._log.debug("%s still unavailable: %s", self._what, reason)

    def succeeded(self) -> None:
        """A call succeeded: the end of an outage, if there was one, is logged."""
        if self._since is None:
            return
        lasted = self._clock() - self._since
        self._log.warning("%s is available again after %.1f s; %d call(s) failed meanwhile",
                          self._what, lasted, self._failures)
        self._since = None
        self._failures = 0
