"""A collaborator's outage is logged once when it starts and once when it ends, with the
failures in between counted, not logged one by one."""

from __future__ import annotations

import logging

import pytest

from services.common.outages import OutageLog


def test_an_outage_is_one_line_down_and_one_line_back(caplog: pytest.LogCaptureFixture):
    now = [100.0]
    outages = OutageLog(logging.getLogger("test.outages"), "the purgatory at p:1",
                        clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.outages"):
        outages.succeeded()
        assert not caplog.records and not outages.down
        for _ in range(180):
            outages.failed("UNAVAILABLE: failed to connect")
            now[0] += 5 / 180
        assert outages.down
        outages.succeeded()
        outages.succeeded()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("the purgatory at p:1 is unavailable: UNAVAILABLE")
    assert lines[1] == ("the purgatory at p:1 is available again after 5.0 s; "
                        "180 call(s) failed meanwhile")
    assert not outages.down
