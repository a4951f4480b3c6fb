"""Which log records a test holds against its own code (tests/log_records.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from .log_records import own


def _handle_events() -> None:
    raise RuntimeError("Event loop is closed")


def _handle_other() -> None:
    raise RuntimeError("Event loop is closed")


def test_a_late_grpc_event_for_a_closed_loop_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        # As the loop's default exception handler reports a callback that raised.
        for callback in (_handle_events, _handle_other):
            handle = asyncio.Handle(callback, (), loop)
            loop.call_exception_handler({
                "message": f"Exception in callback PollerCompletionQueue.{callback.__name__}()",
                "exception": RuntimeError("Event loop is closed"), "handle": handle})
        logging.getLogger("services.frontend").error("a frontend error")

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    assert len(caplog.records) == 3
    assert [r.getMessage().splitlines()[0] for r in own(caplog.records)] == [
        "Exception in callback PollerCompletionQueue._handle_other()", "a frontend error"]


def test_a_call_cancelled_by_its_server_stopping_is_left_out(
        caplog: pytest.LogCaptureFixture) -> None:
    grpc_log = logging.getLogger("grpc._cython.cygrpc")
    message = "Exception not handled by _handle_exceptions in servicer method [/s/Exchange]"
    with caplog.at_level(logging.ERROR):
        for error in (asyncio.CancelledError(), ValueError("a servicer bug")):
            try:
                raise error
            except BaseException:  # noqa: BLE001 - logged as gRPC logs it
                grpc_log.exception(message)
    assert len(caplog.records) == 2
    assert [type(r.exc_info[1]) for r in own(caplog.records)] == [ValueError]
