"""The Kafka request decoder as a fuzz target: the frontend's decoding of one frame (header,
body, unknown tagged fields) and the conversion of what it decoded into the handler's protobuf
request, i.e. everything a connection does with a frame before a handler is called.

A frame that cannot be decoded must raise :class:`UnanswerableRequestError` (the connection
closes); anything else escaping is a crash (the connection logs a traceback). Memory is
bounded too: while tracemalloc runs, no frame may make the decoder hold more Python memory
than a small multiple of its size. tracemalloc does not see kio's native allocations; a huge
length prefix there aborts the process, which fails the test run as surely."""

from __future__ import annotations

import functools
import io
import tracemalloc
from typing import Any

from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_writer
from kio.static.constants import EntityType

from services.frontend import converter, dispatcher
from services.frontend.api_versions import SUPPORTED_APIS
from services.frontend.dispatcher import Dispatcher, UnanswerableRequestError

from ..frontend.test_tagged_fields import encode, sample

# Bytes the decoder may hold beyond a fixed allowance, per byte of frame.
_ALLOWANCE_BYTES = 4 << 20
_BYTES_PER_FRAME_BYTE = 64


@functools.cache
def decoder() -> Dispatcher:
    """A dispatcher (decode() needs neither a handler pool nor listeners) that has decoded
    every valid frame once, so what it compiles and caches on first use is not counted as a
    frame's memory."""
    dispatcher = Dispatcher(None, {}, "fuzz")  # type: ignore[arg-type]
    for frame in valid_frames():
        request = dispatcher.decode(frame)
        if request.message is not None:
            converter.normalise_request(request.api.key, request.version, request.message)
    return dispatcher


@functools.cache
def valid_frames() -> tuple[bytes, ...]:
    """One frame (size prefix excluded) of every supported API and version, every field set,
    plus the newest flexible version of each API with unknown tagged fields everywhere."""
    frames = []
    for api in SUPPORTED_APIS.values():
        for version in range(api.min_version, api.max_version + 1):
            cls = converter.load_schema(api.schema_name, version, EntityType.request)
            frames.append(_header(cls, version) + _written(sample(cls)))
        if cls.__flexible__:
            header = RequestHeaderV2(request_api_key=api.key, request_api_version=version,
                                     correlation_id=7, client_id="fuzz")
            frames.append(encode(header, unknown_tags=True, request_header=True)
                          + encode(sample(cls), unknown_tags=True))
    return tuple(frames)


def _header(cls: Any, version: int) -> bytes:
    fields = {"request_api_key": cls.__api_key__, "request_api_version": version,
              "correlation_id": 7, "client_id": "fuzz"}
    if cls.__flexible__:
        return _written(RequestHeaderV2(**fields))
    return _written(RequestHeaderV1(**fields))


def _written(entity: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def check_request_frame(frame: bytes) -> None:
    """Decode ``frame`` as a connection would; fail on anything but a clean refusal."""
    tracing = tracemalloc.is_tracing()
    if tracing:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
    try:
        request = decoder().decode(frame)
    except UnanswerableRequestError:
        return
    finally:
        if tracing:
            _, peak = tracemalloc.get_traced_memory()
            held = peak - before
            assert held < _ALLOWANCE_BYTES + _BYTES_PER_FRAME_BYTE * len(frame), (
                f"decoding a {len(frame)}-byte frame held {held} bytes")
    if request.schema is None:  # an ApiVersions of a version too new: answered locally
        return
    message = request.message
    assert message is not None
    converter.normalise_request(request.api.key, request.version, message)
    dispatcher._deadline_seconds(request.api.key, message)
