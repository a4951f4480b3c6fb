"""The frontend's listeners (Kafka's ``listeners`` / ``advertised.listeners``): where clients
connect and with which security protocol, and the address each listener advertises.

    listeners            = LISTENER ("," LISTENER)*
    LISTENER             = PROTOCOL "://" [HOST] ":" PORT      (an IPv6 host in brackets)
    PROTOCOL             = PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL

The listener's name is its security protocol (Kafka's default security protocol map), so a
frontend has at most one listener per protocol. An empty host binds every interface. Every
listener serves ``broker_ports`` consecutive ports, one per broker id (clients tell brokers
apart by address): broker N on port + N, advertised at advertised port + N.

With ``listeners`` empty, the older fields ``listen_host``/``listen_port`` and
``advertised_host``/``advertised_port`` describe one PLAINTEXT listener.
"""

from __future__ import annotations

import enum
import re
import socket
from dataclasses import dataclass

WILDCARD_HOSTS = ("", "0.0.0.0", "::")
_LISTENER = re.compile(r"^(?P<name>[A-Za-z_]+)://(?:\[(?P<ipv6>[^\]]*)\]|(?P<host>[^:\[\]]*))"
                       r":(?P<port>-?\d+)$")


class SecurityProtocol(enum.Enum):
    """Kafka's SecurityProtocol: whether a listener runs TLS and whether it asks for SASL."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


@dataclass(frozen=True, slots=True)
class EndPoint:
    """One ``PROTOCOL://host:port`` item."""

    protocol: SecurityProtocol
    host: str
    port: int

    @property
    def name(self) -> str:
        """The listener name (the protocol's name)."""
        return self.protocol.value


def parse_listeners(text: str) -> list[EndPoint]:
    """The end points of a Kafka-style listener list; ValueError for a malformed item, an
    unknown protocol, a port outside 0..65535 or a listener named twice."""
    out: list[EndPoint] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        match = _LISTENER.match(item)
        if match is None:
            raise ValueError(f"listener {item!r} is not of the form PROTOCOL://host:port")
        name = match["name"].upper()
        try:
            protocol = SecurityProtocol(name)
        except ValueError:
            raise ValueError(f"listener {item!r}: unknown security protocol {name} (one of "
                             f"{', '.join(p.value for p in SecurityProtocol)})") from None
        port = int(match["port"])
        if not 0 <= port <= 65535:
            raise ValueError(f"listener {item!r}: port {port} outside 0..65535")
        if any(e.protocol is protocol for e in out):
            raise ValueError(f"listener {name} is configured twice")
        out.append(EndPoint(protocol, match["ipv6"] if match["ipv6"] is not None
                            else match["host"], port))
    return out


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """A listener to open: where it binds and, when given, where it is advertised (host ""
    or port 0: derived from the bind address once bound)."""

    bind: EndPoint
    advertised_host: str = ""
    advertised_port: int = 0

    @property
    def name(self) -> str:
        return self.bind.name

    @property
    def protocol(self) -> SecurityProtocol:
        return self.bind.protocol

    def advertised(self, bound_port: int) -> str:
        """``host:port`` of broker 0 on this listener, as clients are told."""
        host = self.advertised_host or self.bind.host
        if host in WILDCARD_HOSTS:
            host = socket.gethostname()
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.advertised_port or bound_port}"


def listener_specs(listeners: str, advertised_listeners: str, listen_host: str,
                   listen_port: int, advertised_host: str, advertised_port: int
                   ) -> list[ListenerSpec]:
    """The listeners a frontend opens, from its settings (see the module docstring)."""
    if not listeners.strip():
        if advertised_listeners.strip():
            raise ValueError("advertised_listeners needs listeners")
        return [ListenerSpec(EndPoint(SecurityProtocol.PLAINTEXT, listen_host, listen_port),
                             advertised_host, advertised_port)]
    binds = parse_listeners(listeners)
    advertised = {e.protocol: e for e in parse_listeners(advertised_listeners)}
    unknown = set(advertised) - {e.protocol for e in binds}
    if unknown:
        raise ValueError("advertised_listeners names listeners that are not configured: "
                         + ", ".join(sorted(p.value for p in unknown)))
    out = []
    for bind in binds:
        ad = advertised.get(bind.protocol)
        if ad is not None and ad.host in WILDCARD_HOSTS:
            raise ValueError(f"advertised listener {ad.name} needs a host clients can reach")
        out.append(ListenerSpec(bind, ad.host if ad else "", ad.port if ad else 0))
    return out
