"""A manual clock timer for deterministic tests of the purgatory's domain modules: the real
timing wheel, reaped only when the test advances its clock."""

from __future__ import annotations

from services.purgatory.timer import SystemTimer


class ManualTimer(SystemTimer):
    """A :class:`SystemTimer` on a clock that moves only when the test says so."""

    def __init__(self, tick_ms: int = 1, wheel_size: int = 20) -> None:
        self.now_ms = 0.0
        super().__init__(clock_ms=lambda: self.now_ms, tick_ms=tick_ms, wheel_size=wheel_size)

    def advance(self, ms: float) -> int:
        self.now_ms += ms
        return self.advance_clock()
