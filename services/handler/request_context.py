"""Who sent a Kafka request and where its answer tells clients to connect (Kafka's
``RequestContext``): the principal it runs as and what that principal may do (``access``, see
:mod:`.security`), the client id and host, and the advertised address of the frontend that
received it. Any frontend reaches every log node through the handlers, so every broker is
advertised at that frontend: broker N at the advertised port + N when the frontend serves a
port per broker id (``broker_ports`` > N), else at the advertised port itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.common.acls import ANONYMOUS

from .security.access import UNRESTRICTED, Access


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestContext:
    advertised_host: str
    advertised_port: int
    broker_ports: int = 1
    client_id: str = ""
    client_host: str = ""
    frontend_id: str = ""
    # The request's API version, when the frontend says (None: treat as the newest).
    api_version: int | None = None
    # The broker (log node id) whose address the client sent the request to, when known.
    broker_id: int | None = None
    # The authenticated principal ("User:alice"; User:ANONYMOUS unless a trusted frontend
    # named one) and its checks against the ACLs (unrestricted without an authorizer).
    principal: str = ANONYMOUS
    access: Access = UNRESTRICTED
    # The request's record batches when they came beside it (a Produce over the frontend's
    # stream, see services.common.payloads): each partition's, in request order, the
    # request's own records left empty. None: they are in the request.
    record_payloads: Sequence[bytes | memoryview | None] | None = None
    # Whether the caller takes an answer's record batches beside it (a
    # services.common.payloads.Detached answer), rather than a whole message.
    detached_payloads: bool = False
    # The local host key of a caller that reads record batches from log segment files itself
    # (services.common.file_records; only with detached_payloads). Empty: it does not.
    local_reader: str = ""


def broker_port(context: RequestContext, node_id: int) -> int:
    """The port broker ``node_id`` is advertised at for this request's client."""
    if 0 <= node_id < context.broker_ports:
        return context.advertised_port + node_id
    return context.advertised_port


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as (host, port). Raises ValueError when malformed."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port:
        raise ValueError(f"not host:port: {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    number = int(port)
    if not 0 < number < 65536:
        raise ValueError(f"port out of range: {address!r}")
    return host, number
