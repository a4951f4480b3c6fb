"""Requests the fuzz tests (tests/fuzz) found mishandled: each is refused as malformed (the
connection closes, as Kafka closes it on an InvalidRequestException), without a traceback and
without reaching a handler."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.frontend.dispatcher import Dispatcher, UnanswerableRequestError

from ..log_records import own
from .fake_handler import FakeHandler
from .kafka_wire import KafkaWire, frame
from .sample_requests import metadata_v12
from .test_service import frontend

MALFORMED = {
    # DeleteRecords v0 whose non-nullable partitions array has length -1 (null): kio reads it
    # as None, which the conversion to the handler's request could not iterate.
    "null non-nullable array": b"\x00\x15\x00\x00\x00\x00\x00\x07\x00\x04fuzz\x00\x00\x00\x01"
                               b"\x00\x01t\xff\xff\xff\xff\x00\x00\x00\x01\x00\x00\x00\x00\x00"
                               b"\x00\x00\x01\x00\x00\x00\x01",
    # Produce v9 whose partition_data compact array announces 2^32 - 2 elements (ff ff ff ff
    # 0f) in a 36-byte frame: kio's native reader asked for 32 GiB and aborted the process.
    "huge compact array length": bytes.fromhex(
        "0000000900000007000466757a7a000274000100000001ffffffff0f0000010278000000"),
    # The same in a legacy version: Metadata v1 announcing 2^31 - 1 topics.
    "huge array length": bytes.fromhex("0003000100000001ffff7fffffff"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_decoding_refuses_it(name: str) -> None:
    dispatcher = Dispatcher(None, {}, "test")  # type: ignore[arg-type]
    with pytest.raises(UnanswerableRequestError):
        dispatcher.decode(MALFORMED[name])


def test_a_collection_longer_than_the_frame_is_refused_before_decoding() -> None:
    dispatcher = Dispatcher(None, {}, "test")  # type: ignore[arg-type]
    for name in ("huge compact array length", "huge array length"):
        with pytest.raises(UnanswerableRequestError, match="collection of size"):
            dispatcher.decode(MALFORMED[name])


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_the_connection_closes_without_an_unexpected_error(
        name: str, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with frontend(FakeHandler()) as service:
            bad = await KafkaWire.connect(service.kafka_port)
            await bad.send(frame(MALFORMED[name]))
            assert await bad.closed_by_peer()
            await bad.close()
            good = await KafkaWire.connect(service.kafka_port)
            assert (await good.request(metadata_v12("b"), 3)).topics[0].name == "b"
            await good.close()

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    assert not [r for r in own(caplog.records) if r.levelno >= logging.ERROR], caplog.text
