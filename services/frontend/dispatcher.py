"""One Kafka request's journey through the frontend (Kafka's RequestChannel + the dispatch part
of KafkaApis): decode the frame with kio, answer ApiVersions locally, convert anything else to
its version-free protobuf request, call the handler RPC, and encode the handler's answer in the
client's version.

A request that cannot be decoded raises :class:`UnanswerableRequestError`, and so does one that
has no safe answer (see :mod:`.error_responses`); the connection then closes. Nothing else
escapes :meth:`Dispatcher.handle`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from google.protobuf.message import Message
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.static.constants import EntityType

from kbroker.kafka.v1 import kafka_pb2
from services.common.error_answers import error_codes
from services.common.features import FEATURES, FINALIZED_FEATURES_EPOCH
from services.common.file_records import METADATA_KEY as FILE_RECORDS_METADATA_KEY
from services.common.file_records import local_host_key
from services.common.payloads import Detached, PayloadPath
from services.common.runtime import freeze_heap

from . import converter, headers
from .api_versions import API_VERSIONS_KEY, SUPPORTED_APIS, SupportedApi, supported_versions
from .collection_sizes import size_checker
from .coordinator_affinity import CoordinatorAffinity
from .entity_writers import entity_writer, message_writer
from .error_responses import UNAVAILABLE_CODES, error_response
from .fetch_sessions import DEFAULT_FETCH_SESSION_SLOTS, FetchSessions
from .framing import FrameWriter
from .handler_pool import HandlerCallError, HandlerPool, Metadata
from .metrics import (
    HANDLER_FAILURES,
    METRICS_ENABLED,
    PRODUCE_RESENDS,
    QUOTA_BYTES,
    QUOTA_THROTTLE_SECONDS,
    ApiMetrics,
    count_fetched_bytes,
    produce_outcome,
)
from .produce_resend import ProduceResend
from .quotas import Charge, ClientQuotas, ClientSensors
from .session import ClientSession
from .tagged_fields import tolerant_reader

log = logging.getLogger(__name__)

PRODUCE_KEY = 0
FETCH_KEY = 1
JOIN_GROUP_KEY = 11
SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
# Extra time a handler gets beyond the wait the client asked for, before the frontend gives up.
PRODUCE_GRACE_SECONDS = 5.0
FETCH_GRACE_SECONDS = 10.0
DEFAULT_DEADLINE_SECONDS = 30.0
# A JoinGroup may wait out the group's rebalance timeout (clients allow it that plus 5 s).
JOIN_GROUP_GRACE_SECONDS = 10.0

# KIP-511: client software name and version must look like this (Kafka's own pattern).
_SOFTWARE_PATTERN = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
# ApiVersions v3+: the cluster's features, as Kafka's broker lists them (a finalized level is
# both its min and max version level).
_SUPPORTED_FEATURES = [{"name": f.name, "min_version": f.min_level, "max_version": f.max_level}
                       for f in FEATURES]
_FINALIZED_FEATURES = [{"name": f.name, "min_version_level": f.finalized_level,
                        "max_version_level": f.finalized_level} for f in FEATURES]
# Record batches of produce requests go to the handler beside the message, as kio read them
# from the frame (services.common.payloads): protobuf never copies them.
PRODUCE_BATCHES = PayloadPath(kafka_pb2.ProduceRequest.DESCRIPTOR,
                              "topic_data.partition_data.records")
# And those of fetch answers come back beside the message, as views of the handler's answer,
# and go to the socket as they are.
FETCH_BATCHES = PayloadPath(kafka_pb2.FetchResponse.DESCRIPTOR, "responses.partitions.records")
# gRPC metadata values are printable ASCII; anything else in a client id or principal is
# percent-encoded.
_METADATA_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


class UnanswerableRequestError(Exception):
    """The connection must close: the request is malformed or has no safe answer."""

    def __init__(self, reason: str, *, kind: str = "malformed") -> None:
        super().__init__(reason)
        self.kind = kind


@dataclasses.dataclass(frozen=True, slots=True)
class _Schema:
    """The compiled pieces of one (API, version)."""

    flexible_request: bool
    check_sizes: Callable[[bytes, int], None]
    read_request: Callable[[bytes, int], tuple[Any, int]]
    request_to_proto: Callable[[Any], Message]
    # Where the request's record batches travel beside the message (None: in it).
    request_batches: PayloadPath | None
    flexible_response: bool
    # Answers other than Fetch's: written straight from the handler's message.
    write_response_message: Callable[[FrameWriter, Message], None] | None = None
    # Fetch answers (whose record batches may come beside the message, and whose fetched
    # bytes are counted on the entity): converted to kio's entity, then written.
    response_from_proto: Callable[[Message], Any] | None = None
    write_response: Callable[[FrameWriter, Any], None] | None = None
    # Where answers may come with their record batches beside them, and their conversion
    # taking them from there (None: always in the message).
    response_batches: PayloadPath | None = None
    response_from_proto_with_batches: Callable[[Message, Any], Any] | None = None


def _compile_schema(api: SupportedApi, version: int) -> _Schema:
    request_cls = converter.load_schema(api.schema_name, version, EntityType.request)
    response_cls = converter.load_schema(api.schema_name, version, EntityType.response)
    flexible = request_cls.__flexible__  # type: ignore[attr-defined]
    batches = PRODUCE_BATCHES if api.key == PRODUCE_KEY else None
    fetch = api.key == FETCH_KEY
    return _Schema(
        flexible_request=flexible,
        check_sizes=size_checker(request_cls),
        # Only flexible versions carry tagged fields.
        read_request=(tolerant_reader(request_cls) if flexible
                      else entity_reader(request_cls)),
        request_to_proto=converter.to_proto_fn(request_cls, without_batches=batches is not None),
        request_batches=batches,
        flexible_response=response_cls.__flexible__,  # type: ignore[attr-defined]
        write_response_message=None if fetch else message_writer(response_cls),
        response_from_proto=converter.from_proto_fn(response_cls) if fetch else None,
        write_response=entity_writer(response_cls) if fetch else None,
        response_batches=FETCH_BATCHES if fetch else None,
        response_from_proto_with_batches=converter.from_proto_with_batches_fn(response_cls)
        if fetch else None,
    )


class _Schemas:
    """Every supported (API key, version) with its codec functions, compiled on first use.

    Compiling all of them takes seconds (hundreds of kio modules), which a frontend that
    restarts would keep its clients waiting for; :meth:`compile_all` compiles them in the
    background once the frontend serves, so few requests pay for a first compilation (a few
    milliseconds each). Not thread-safe: one event loop."""

    def __init__(self) -> None:
        self._supported = {(api.key, version): api for api in SUPPORTED_APIS.values()
                           for version in range(api.min_version, api.max_version + 1)}
        self._compiled: dict[tuple[int, int], _Schema] = {}

    def get(self, key: tuple[int, int]) -> _Schema | None:
        """The codec of (API key, version); None for an unsupported one."""
        schema = self._compiled.get(key)
        if schema is None:
            api = self._supported.get(key)
            if api is None:
                return None
            schema = self._compiled[key] = _compile_schema(api, key[1])
        return schema

    def __getitem__(self, key: tuple[int, int]) -> _Schema:
        schema = self.get(key)
        if schema is None:
            raise KeyError(key)
        return schema

    async def compile_all(self) -> None:
        """Compile every schema not compiled yet, one at a time between other work."""
        for key in self._supported:
            self.get(key)
            await asyncio.sleep(0)


@dataclasses.dataclass(slots=True)
class Request:
    """A decoded request: its API, version and header fields, and the kio body (``body`` and
    ``schema`` None for an ApiVersions request of a version too new to decode)."""

    api: SupportedApi
    version: int
    correlation_id: int
    client_id: str | None
    body: Any
    schema: _Schema | None
    metrics: ApiMetrics
    # Time parked in the purgatory, as the handler reported it (Kafka's RemoteTime).
    remote_seconds: float = 0.0
    # The frame's size and when its decoding started (what client quotas count).
    size: int = 0
    started: float = 0.0
    # Set when client quotas apply: the connection mutes itself after the answer for it.
    charge: Charge | None = None
    # The body as the handler's protobuf request (None without a schema).
    message: Message | None = None

    @property
    def expects_response(self) -> bool:
        # Produce with acks=0 is processed but never answered.
        return not (self.api.key == PRODUCE_KEY and self.body.acks == 0)


def _deadline_seconds(api_key: int, request: Message) -> float:
    if api_key == PRODUCE_KEY:
        return max(request.timeout_ms, 0) / 1000 + PRODUCE_GRACE_SECONDS  # type: ignore[attr-defined]
    if api_key == FETCH_KEY:
        return max(request.max_wait_ms, 0) / 1000 + FETCH_GRACE_SECONDS  # type: ignore[attr-defined]
    if api_key == JOIN_GROUP_KEY:
        wait_ms = max(request.rebalance_timeout_ms, request.session_timeout_ms, 0)  # type: ignore[attr-defined]
        return max(wait_ms / 1000 + JOIN_GROUP_GRACE_SECONDS, DEFAULT_DEADLINE_SECONDS)
    return DEFAULT_DEADLINE_SECONDS


@dataclasses.dataclass(frozen=True, slots=True)
class ListenerAddress:
    """Where one listener's broker 0 is advertised and listens (broker N: port + N)."""

    advertised: str
    first_port: int


class Dispatcher:
    """Decodes, routes and encodes requests for every connection of one frontend."""

    def __init__(self, pool: HandlerPool, listeners: Mapping[str, ListenerAddress],
                 instance: str, broker_ports: int = 1,
                 quotas: ClientQuotas | None = None,
                 fetch_sessions: FetchSessions | None = None,
                 affinity: CoordinatorAffinity | None = None,
                 local_files: bool = True) -> None:
        self._pool = pool
        # Fetch answers' batches from log nodes on this host are read from their segment
        # files here (services.common.file_records).
        key = local_host_key() if local_files else ""
        self._local_files: Metadata = ((FILE_RECORDS_METADATA_KEY, key),) if key else ()
        self.affinity = affinity if affinity is not None else CoordinatorAffinity()
        self.quotas = quotas if quotas is not None else ClientQuotas()
        self.fetch_sessions = fetch_sessions if fetch_sessions is not None \
            else FetchSessions(DEFAULT_FETCH_SESSION_SLOTS)
        self._listeners = dict(listeners)
        self._broker_ports = str(broker_ports)
        self._broker_count = broker_ports
        self._instance = instance
        self._schemas = _Schemas()
        self._api_keys = [{"api_key": key, "min_version": lo, "max_version": hi}
                          for key, lo, hi in supported_versions()]
        self._metrics = {key: ApiMetrics(api.name) for key, api in SUPPORTED_APIS.items()}
        self._grpc_metadata: dict[tuple[str | None, str, int, int, str, str], Metadata] = {}

    async def compile_schemas(self) -> None:
        """Compile the codec of every supported API version (see :class:`_Schemas`), then
        keep them out of the garbage collector's walks (:func:`freeze_heap`)."""
        await self._schemas.compile_all()
        freeze_heap()

    def decode(self, frame: bytes) -> Request:
        """The request in ``frame``; raises :class:`UnanswerableRequestError` if unreadable."""
        started = time.perf_counter()
        try:
            api_key, version, correlation_id = headers.peek(frame)
        except struct.error:
            raise UnanswerableRequestError(
                f"frame of {len(frame)} bytes is shorter than a header") from None
        api = SUPPORTED_APIS.get(api_key)
        if api is None:
            raise UnanswerableRequestError(f"unknown API key {api_key}")
        metrics = self._metrics[api_key]
        schema = self._schemas.get((api_key, version))
        if schema is None:
            if api_key == API_VERSIONS_KEY:
                return Request(api, version, correlation_id, None, None, None, metrics)
            raise UnanswerableRequestError(f"{api.name} v{version} is not supported "
                                           f"({api.min_version}..{api.max_version})")
        try:
            header, offset = headers.read_request_header(frame, schema.flexible_request)
            schema.check_sizes(frame, offset)  # before kio allocates what lengths announce
            body, _ = schema.read_request(frame, offset)
            # kio reads a null (length -1) array even where the schema forbids one; Kafka
            # refuses such a request as malformed, and so does the conversion.
            message = schema.request_to_proto(body)
        except Exception as e:  # noqa: BLE001 - any decode failure means a malformed request
            raise UnanswerableRequestError(f"cannot decode {api.name} v{version}: "
                                           f"{type(e).__name__}: {e}") from None
        return Request(api, version, correlation_id, header.client_id, body, schema, metrics,
                       size=len(frame), started=started, message=message)

    async def handle(self, request: Request, session: ClientSession) -> list[bytes] | None:
        """The response frame (as buffers) for ``request``, or None when none is due."""
        api, schema = request.api, request.schema
        if api.rpc is None or schema is None:
            return self._answer_locally(request)
        message = request.message
        assert message is not None  # decoded with a schema
        converter.normalise_request(api.key, request.version, message)
        quotas = self.quotas
        sensors = quotas.sensors(session.user, request.client_id) if quotas.enabled else None
        fetch_context = None
        resend: ProduceResend | None = None
        if api.key == FETCH_KEY:
            # The handler gets a full, sessionless fetch (or none, after a session error).
            fetch_context = self.fetch_sessions.open(request.version, message)  # type: ignore[arg-type]
            message = fetch_context.request  # type: ignore[assignment]
            if sensors is not None and message is not None:
                self.quotas.cap_fetch(sensors, message)
        if message is None:
            assert fetch_context is not None and fetch_context.answer is not None
            response: Message | Detached = fetch_context.answer
        else:
            called = time.perf_counter()
            outgoing: Message | Detached = message
            retry_safe: bool | ProduceResend = api.retry_safe
            if schema.request_batches is not None:
                outgoing = Detached(message, schema.request_batches, converter.batches_of(
                    request.body, schema.request_batches.names))
                if api.key == PRODUCE_KEY:
                    resend = retry_safe = ProduceResend(request.body,
                                                        schema.request_batches.names)
            # An answer's record batches may stay beside it unless something here reshapes
            # the answer around them (an incremental fetch session, quotas).
            apart = schema.response_batches if sensors is None and (
                fetch_context is None or fetch_context.keeps_answer) else None
            metadata = self._metadata(request.client_id, request.version, session)
            if api.key in (FETCH_KEY, PRODUCE_KEY):
                metadata = (*metadata, *self._local_files)
            try:
                response, remote = await self._pool.call(
                    api.rpc, outgoing, metadata=metadata,
                    time_limit=_deadline_seconds(api.key, message), retry_safe=retry_safe,
                    response_batches=apart, affinity=self.affinity.of(api.key, message))
                # Bounded by the call it is part of (the handler's clock is not ours).
                request.remote_seconds = min(remote, time.perf_counter() - called)
            except HandlerCallError as e:
                response = self._failure_response(request, message, e,
                                                  resent=resend is not None and resend.resent)
        commit = None
        if fetch_context is not None:
            if isinstance(response, Detached):
                # The contexts that keep the answer change only its message.
                answer, commit = fetch_context.respond(response.message)  # type: ignore[arg-type]
                if answer is not response.message:
                    response = answer
            else:
                response, commit = fetch_context.respond(response)  # type: ignore[arg-type]
        if sensors is not None:
            response = self._charge(request, sensors, response)  # type: ignore[arg-type]
        message_of = response.message if isinstance(response, Detached) else response
        if commit is not None and (request.charge is None or not request.charge.throttle_ms):
            # A throttled fetch is answered empty: the session stays as it was.
            commit(message_of)  # type: ignore[arg-type]
        if api.key == PRODUCE_KEY:
            codes = produce_outcome(request.body, message_of)  # acks=0 needs them too
            if resend is not None and resend.resent:
                PRODUCE_RESENDS.labels("closed" if codes else "answered").inc()
                if codes:  # where it failed, the first copy may still land later
                    raise UnanswerableRequestError(
                        f"Produce v{request.version} from {request.client_id}: resent after "
                        f"a handler failed mid-request, it failed on a partition "
                        f"({sorted(codes)}) whose first append may still land; closing the "
                        "connection", kind="produce_outcome_unknown")
        elif METRICS_ENABLED:
            codes = set(error_codes(message_of))
        else:
            codes = set()
        if not request.expects_response:
            if codes:
                # As Kafka does: an acks=0 producer learns of a failure only by the connection
                # closing, which makes it refresh metadata before sending again.
                raise UnanswerableRequestError(
                    "Produce with acks=0 failed on at least one partition", kind="acks0_failure")
            return None
        try:
            frame = self._encode(request, schema, response)
        except Exception:
            log.exception("%s v%d: cannot encode the handler's response", api.name,
                          request.version)
            fallback = error_response(api.key, message, ErrorCode.unknown_server_error)  # type: ignore[arg-type]
            if fallback is None:
                raise UnanswerableRequestError(f"{api.name}: unencodable response",
                                               kind="bad_response") from None
            codes = {int(ErrorCode.unknown_server_error)}
            frame = self._encode(request, schema, fallback)
        if codes:
            request.metrics.errors(codes)
        return frame

    def _charge(self, request: Request, sensors: ClientSensors, response: Message) -> Message:
        """Record ``request`` against its client's quotas; the answer to send instead of
        ``response`` (throttle_time_ms set, or an empty Fetch when throttled)."""
        seconds = time.perf_counter() - request.started - request.remote_seconds
        response, charge = self.quotas.charge(
            sensors, request.api.key, request.size, seconds, response,
            acks0=not request.expects_response)
        request.charge = charge
        if charge.counted_bytes:
            QUOTA_BYTES.labels("produce" if request.api.key == PRODUCE_KEY else "fetch").inc(
                charge.counted_bytes)
        if charge.quota_type is not None:
            QUOTA_THROTTLE_SECONDS.labels(charge.quota_type.label).observe(
                charge.throttle_ms / 1000)
        return response

    def _answer_locally(self, request: Request) -> list[bytes]:
        """ApiVersions, and the SASL requests of a client already authenticated (or on a
        listener without SASL): as Kafka's KafkaApis, ILLEGAL_SASL_STATE."""
        key = request.api.key
        if key == SASL_HANDSHAKE_KEY:
            return self.encode(request, kafka_pb2.SaslHandshakeResponse(
                error_code=int(ErrorCode.illegal_sasl_state)))
        if key == SASL_AUTHENTICATE_KEY:
            return self.encode(request, kafka_pb2.SaslAuthenticateResponse(
                error_code=int(ErrorCode.illegal_sasl_state),
                error_message="SaslAuthenticate request received after successful "
                              "authentication"))
        return self.answer_api_versions(request)

    def encode(self, request: Request, response: Message) -> list[bytes]:
        """``response`` as the answer frame to ``request`` (in its version)."""
        assert request.schema is not None
        return self._encode(request, request.schema, response)

    def error_answer(self, request: Request, code: ErrorCode) -> list[bytes] | None:
        """``request``'s answer carrying ``code`` everywhere, or None if it has none."""
        if request.schema is None:
            return None
        message = request.schema.request_to_proto(request.body)  # record batches not needed
        response = error_response(request.api.key, message, code)
        return None if response is None else self._encode(request, request.schema, response)

    def answer_api_versions(self, request: Request) -> list[bytes]:
        """The supported version ranges (KIP-511: INVALID_REQUEST for a malformed client
        software name or version; a client newer than the broker gets UNSUPPORTED_VERSION and
        the ranges in v0, the one body every client version can read, so it can pick a version
        both support)."""
        schema = request.schema
        if schema is None:
            schema = self._schemas[(API_VERSIONS_KEY, 0)]
            answer = kafka_pb2.ApiVersionsResponse(
                error_code=int(ErrorCode.unsupported_version), api_keys=self._api_keys)
        elif request.version < 3 or (
                _SOFTWARE_PATTERN.fullmatch(request.body.client_software_name)
                and _SOFTWARE_PATTERN.fullmatch(request.body.client_software_version)):
            answer = kafka_pb2.ApiVersionsResponse(
                error_code=0, api_keys=self._api_keys, throttle_time_ms=0,
                supported_features=_SUPPORTED_FEATURES,
                finalized_features_epoch=FINALIZED_FEATURES_EPOCH,
                finalized_features=_FINALIZED_FEATURES, zk_migration_ready=False)
        else:
            answer = kafka_pb2.ApiVersionsResponse(error_code=int(ErrorCode.invalid_request))
        return self._encode(request, schema, answer)

    def _encode(self, request: Request, schema: _Schema,
                response: Message | Detached) -> list[bytes]:
        """The answer frame, as buffers: record batches that came beside the answer are among
        them as they are (the socket takes them without a copy here)."""
        out = FrameWriter()
        out.write(headers.response_header(request.api.key, request.correlation_id,
                                          schema.flexible_response))
        message = response.message if isinstance(response, Detached) else response
        converter.normalise_response(request.api.key, request.version, message)
        if schema.write_response_message is not None:
            # Written straight from the message: no kio entity is built.
            schema.write_response_message(out, message)
            return out.finish()  # type: ignore[return-value]
        assert schema.response_from_proto is not None and schema.write_response is not None
        if isinstance(response, Detached):
            assert schema.response_from_proto_with_batches is not None
            entity = schema.response_from_proto_with_batches(message, response.payloads)
        else:
            entity = schema.response_from_proto(message)
        schema.write_response(out, entity)
        if METRICS_ENABLED:
            count_fetched_bytes(message, entity)
        return out.finish()  # type: ignore[return-value]

    def _failure_response(self, request: Request, message: Message, error: HandlerCallError,
                          resent: bool = False) -> Message:
        api = request.api
        HANDLER_FAILURES.labels(api.name, error.status.name).inc()
        if api.key == PRODUCE_KEY and error.reached and (error.availability or resent):
            # Its append may still arrive: no answer may let a later request overtake it
            # (an idempotent one was resent to the other handlers first, and a resend's
            # failure says nothing of the first copy: produce_resend).
            if resent:
                PRODUCE_RESENDS.labels("closed").inc()
            raise UnanswerableRequestError(
                f"Produce v{request.version} from {request.client_id}: the outcome is unknown "
                f"({error}); closing the connection", kind="produce_outcome_unknown")
        if not error.availability:
            code = ErrorCode.unknown_server_error
        elif api.retry_safe:
            code = UNAVAILABLE_CODES.get(api.key, ErrorCode.request_timed_out)
        else:
            code = ErrorCode.request_timed_out
        response = error_response(api.key, message, code)
        if response is None:
            raise UnanswerableRequestError(f"{api.name}: no handler answered ({error})",
                                           kind="no_handler_answer")
        log.warning("%s v%d from %s: %s; answering %s", api.name, request.version,
                    request.client_id, error, code.name.upper())
        return response

    def _metadata(self, client_id: str | None, version: int,
                  session: ClientSession) -> Metadata:
        key = (client_id, session.client_host, version, session.local_port, session.listener,
               session.principal)
        metadata = self._grpc_metadata.get(key)
        if metadata is None:
            listener = self._listeners[session.listener]
            pairs = [("kafka-client-host", session.client_host),
                     ("kafka-advertised", listener.advertised),
                     ("kafka-broker-ports", self._broker_ports),
                     ("kafka-frontend-id", self._instance),
                     ("kafka-api-version", str(version)),
                     ("kafka-listener", session.listener),
                     ("kafka-principal", quote(session.principal, safe=_METADATA_SAFE))]
            # The broker whose port the client connected to (group APIs answer
            # NOT_COORDINATOR at the wrong one).
            broker_id = session.local_port - listener.first_port
            if listener.first_port and 0 <= broker_id < self._broker_count:
                pairs.append(("kafka-broker-id", str(broker_id)))
            if client_id is not None:
                pairs.insert(0, ("kafka-client-id", quote(client_id, safe=_METADATA_SAFE)))
            metadata = tuple(pairs)
            if len(self._grpc_metadata) > 10_000:  # bounded: client ids come from clients
                self._grpc_metadata.clear()
            self._grpc_metadata[key] = metadata
        return metadata
