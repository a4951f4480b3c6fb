"""What the frontend knows of the client on a connection, and tells the handler with every
request: the listener it came in on, its address, the broker port it connected to and its
principal (``User:ANONYMOUS`` until authenticated; Kafka's RequestContext fields)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.acls import ANONYMOUS


@dataclass(slots=True)
class ClientSession:
    listener: str
    client_host: str
    local_port: int
    principal: str = ANONYMOUS

    @property
    def user(self) -> str:
        """The principal's name ("ANONYMOUS" for ``User:ANONYMOUS``): the ``user`` of client
        quotas."""
        return self.principal.partition(":")[2]
