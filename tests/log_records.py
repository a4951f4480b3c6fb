"""Log records a test may hold against the code it runs.

gRPC's asyncio engine logs two kinds of records that belong to no test's code:

- It is one per process. A call that an earlier test's event loop left in flight when that loop
  closed can complete while a later test's loop polls the engine: the engine then hands the
  event to the closed loop, which refuses it, and the running loop logs ``Exception in
  callback PollerCompletionQueue._handle_events`` with ``RuntimeError('Event loop is
  closed')``. That record belongs to the earlier test.
- A server stopping while a call's coroutine is still scheduled has that coroutine cancelled,
  and logs ``Exception not handled by _handle_exceptions in servicer method [...]`` with the
  ``CancelledError``: the teardown's, whatever the servicer does.

A test checking for errors leaves both out."""

from __future__ import annotations

import asyncio
import logging


def for_an_earlier_loop(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return (record.name == "asyncio" and isinstance(error, RuntimeError)
            and str(error) == "Event loop is closed"
            and "PollerCompletionQueue._handle_events" in record.getMessage())


def for_a_cancelled_call(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return (record.name == "grpc._cython.cygrpc" and isinstance(error, asyncio.CancelledError)
            and record.getMessage().startswith(
                "Exception not handled by _handle_exceptions in servicer method"))


def own(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """The records of ``records`` that the running test's code logged."""
    return [r for r in records if not (for_an_earlier_loop(r) or for_a_cancelled_call(r))]
