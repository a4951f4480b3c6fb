"""The last reported state of each operation key (position, error and the reporter's ISR), and
a report sequence.

Reports are stored as they come: a later report replaces the earlier one even if its position
is lower (a leader change may legitimately move a high watermark observation backwards), so the
reporter decides what a position means. Each report gets the next sequence number, which lets
an operation tell reports made after it was parked from older ones.

One exception: an epoch key (:func:`~services.common.progress_reports.is_epoch_key`) that was
reported with an error is *ended*: its leader epoch is over, so the error stays whatever is
reported later (an old leader that has not yet heard of its end may still report it), with the
highest position reported for it before or after the end, and :attr:`KeyState.ended` tells
waiters to honour it however late they were parked.

The table is bounded: past :data:`CAPACITY` keys the least recently reported key is forgotten, so
churning keys (members of groups that come and go) cannot grow it without limit. Forgetting a
key only means a later waiter on it does not see its old position and waits for the next report.

Not thread-safe (one event loop).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from services.common.progress_reports import UNKNOWN_POSITION, is_epoch_key

CAPACITY = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyState:
    """One report: ``position`` of ``key`` (e.g. a high watermark), ``error_code`` a Kafka
    error (0 if none), ``isr`` the reporting leader's ISR at that position (an epoch key's;
    empty if not said), ``sequence`` the report's number (0: never reported)."""

    key: str
    position: int
    error_code: int = 0
    isr: tuple[int, ...] = ()
    sequence: int = 0
    # An epoch key whose epoch is over: its error concerns every waiter.
    ended: bool = False


class KeyStates:
    """Last report per key, least recently reported first."""

    def __init__(self) -> None:
        self._states: OrderedDict[str, KeyState] = OrderedDict()
        self._sequence = 0

    @property
    def sequence(self) -> int:
        """The number of the latest report (0 before any)."""
        return self._sequence

    def report(self, key: str, position: int, error_code: int = 0,
               isr: tuple[int, ...] = ()) -> None:
        self._sequence += 1
        states = self._states
        ended = False
        if is_epoch_key(key):
            previous = states.get(key)
            if previous is not None and previous.ended:
                error_code = previous.error_code
            ended = error_code != 0
            if ended and previous is not None and previous.position > position:
                # One leader's high watermark at one epoch only grows: an end reported where
                # it is not known (UNKNOWN_POSITION) keeps what the leader reported.
                position, isr = previous.position, previous.isr
        states[key] = KeyState(key=key, position=position, error_code=error_code, isr=isr,
                               sequence=self._sequence, ended=ended)
        states.move_to_end(key)
        if len(states) > CAPACITY:
            states.popitem(last=False)

    def get(self, key: str) -> KeyState | None:
        return self._states.get(key)

    def current(self, key: str) -> KeyState:
        """The last report of ``key``, or an unknown position if there is none."""
        state = self._states.get(key)
        return state if state is not None else KeyState(key=key, position=UNKNOWN_POSITION)

    def __len__(self) -> int:
        return len(self._states)
