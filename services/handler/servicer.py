"""gRPC glue for kbroker.handler.v1.KafkaHandler: every RPC goes to the API module registered
under its name, with the request context from gRPC metadata (the principal only from a caller
:mod:`.security.principal` trusts, and its access checked against the ACLs of the current
metadata snapshot, :mod:`.security.access`); per-request metrics (the time a
request parked in the purgatory goes back to the frontend as the trailing metadata
``kbroker-remote-ms``, see :mod:`.metrics`); and the guarantee that no request kills the
handler (an unexpected failure is logged and answered with UNKNOWN_SERVER_ERROR for every item
of the request, an API this handler does not serve with UNSUPPORTED_VERSION). A request that
has no safe answer (:class:`~.collaborators.RequestOutcomeUnknownError`) fails its call with
DEADLINE_EXCEEDED instead.

Requests and responses are the generated messages of ``kbroker.kafka.v1``: an unset request
field reads as Kafka's default (callers such as grpcurl may leave fields out), and unset
response fields are left for the frontend to fill with the client version's defaults. Where a
hand-made request means something else, the API module says so.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import unquote

import grpc

from kbroker.handler.v1 import kafka_handler_pb2, kafka_handler_pb2_grpc
from services.common.error_answers import error_codes, error_response
from services.common.errors import ErrorCode
from services.common.file_records import METADATA_KEY as FILE_RECORDS_METADATA_KEY
from services.common.payloads import Detached

from .collaborators import RequestOutcomeUnknownError
from .config import HandlerConfig
from .metadata_cache import MetadataCache, MetadataUnavailableError
from .metrics import record_request, remote_time
from .request_context import RequestContext, split_host_port
from .security.access import Authorization
from .security.principal import caller_of

log = logging.getLogger(__name__)

UNKNOWN_SERVER_ERROR = ErrorCode.unknown_server_error.value
UNSUPPORTED_VERSION = ErrorCode.unsupported_version.value
REQUEST_TIMED_OUT = ErrorCode.request_timed_out.value


class KafkaApi(Protocol):
    """One Kafka API: a request of ``kbroker.kafka.v1`` in, its response out."""

    async def handle(self, request: Any, context: RequestContext) -> Any: ...


def _int_or_none(value: object) -> int | None:
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        return None


SERVICE = kafka_handler_pb2.DESCRIPTOR.services_by_name["KafkaHandler"]


class KafkaHandlerServicer:
    """Every KafkaHandler RPC, as an attribute named after it, served by :meth:`serve`."""

    def __init__(self, config: HandlerConfig, apis: Mapping[str, KafkaApi],
                 cache: MetadataCache | None = None,
                 authorization: Authorization | None = None) -> None:
        """``cache``: whose snapshot's ACLs ``authorization`` checks requests against (no
        authorization: every request is allowed everything)."""
        self._default_advertised = split_host_port(config.advertised)
        self._default_broker_ports = config.broker_ports
        self._frontend_identities = frozenset(config.frontend_identities)
        self._apis = dict(apis)
        self._cache = cache
        self._authorization = authorization or Authorization(enabled=False)
        for method in SERVICE.methods:
            setattr(self, method.name, functools.partial(self.serve, method.name))

    async def request_context(self, context: grpc.aio.ServicerContext) -> RequestContext:
        """The request's context from its call: the frontend's metadata, and the principal
        and client host as :func:`~.security.principal.caller_of` trusts them."""
        values = {key: value for key, value in (context.invocation_metadata() or ())}
        principal, client_host = caller_of(context, self._frontend_identities
                                           ).principal_and_host(values)
        host, port = self._default_advertised
        advertised = values.get("kafka-advertised")
        if advertised:
            try:
                host, port = split_host_port(str(advertised))
            except ValueError:
                log.warning("ignoring malformed kafka-advertised %r", advertised)
        broker_ports = _int_or_none(values.get("kafka-broker-ports"))
        return RequestContext(
            advertised_host=host,
            advertised_port=port,
            broker_ports=self._default_broker_ports if broker_ports is None else broker_ports,
            # The frontend percent-encodes client ids (gRPC metadata is printable ASCII).
            client_id=unquote(str(values.get("kafka-client-id", ""))),
            client_host=client_host,
            frontend_id=str(values.get("kafka-frontend-id", "")),
            api_version=_int_or_none(values.get("kafka-api-version")),
            broker_id=_int_or_none(values.get("kafka-broker-id")),
            principal=principal,
            access=self._authorization.access(await self._acls(), principal, client_host),
            # Set by the stream of calls (.exchange.CallContext), not by a unary call.
            record_payloads=getattr(context, "record_payloads", None),
            detached_payloads=getattr(context, "detached_payloads", False),
            local_reader=str(values.get(FILE_RECORDS_METADATA_KEY, "")) if getattr(
                context, "detached_payloads", False) else "",
        )

    async def _acls(self) -> tuple[Any, ...] | None:
        """The ACLs of the current snapshot, loading the first one when none is yet (None
        when there is none to be had: no bindings, so only super users and
        allow.everyone.if.no.acl.found pass)."""
        if self._cache is None or not self._authorization.enabled:
            return None
        snapshot = self._cache.snapshot
        if snapshot is None:
            try:
                snapshot = await self._cache.current()
            except MetadataUnavailableError:
                return None
        return snapshot.acls

    async def serve(self, name: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Answer one Kafka request with the API registered as ``name``: a message, or for a
        caller that takes them (the stream of calls) a message with its record batches
        beside it (:class:`~services.common.payloads.Detached`)."""
        started = time.perf_counter()
        api = self._apis.get(name)
        with remote_time(context):
            if api is None:
                response = error_response(request, UNSUPPORTED_VERSION)
            else:
                try:
                    response = await api.handle(request, await self.request_context(context))
                except RequestOutcomeUnknownError as exc:
                    log.info("%s: %s; failing the call", name, exc)
                    record_request(name, REQUEST_TIMED_OUT, time.perf_counter() - started)
                    await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"{name}: {exc}")
                    raise  # abort raises; never reached
                except Exception:
                    log.exception("%s failed", name)
                    response = error_response(request, UNKNOWN_SERVER_ERROR)
        detached = isinstance(response, Detached)
        codes = error_codes(response.message if detached else response)
        record_request(name, codes[0] if codes else 0, time.perf_counter() - started)
        if detached and not getattr(context, "detached_payloads", False):
            return response.whole()
        return response


def add_to_server(servicer: KafkaHandlerServicer, server: grpc.aio.Server) -> None:
    kafka_handler_pb2_grpc.add_KafkaHandlerServicer_to_server(servicer, server)  # type: ignore[arg-type]
