"""What every SASL mechanism's server side is (Java's SaslServer as Kafka uses it): it takes
the client's tokens one at a time and answers each with a challenge until it is complete,
then names the authenticated user.

Failures come in Kafka's two kinds: :class:`SaslAuthenticationError` carries a message meant
for the client (it says nothing a stranger should not learn), :class:`SaslError` does not, and
the client is told only that its credentials were invalid.
"""

from __future__ import annotations

from typing import Protocol


class SaslError(Exception):
    """Authentication failed; the reason stays in the broker's log."""


class SaslAuthenticationError(SaslError):
    """Authentication failed; the message is sent to the client."""


class SaslServer(Protocol):
    """One authentication exchange of one mechanism."""

    mechanism: str

    @property
    def complete(self) -> bool: ...

    @property
    def authorization_id(self) -> str:
        """The authenticated user name (once complete)."""
        ...

    @property
    def credential_expiry_ms(self) -> int | None:
        """When the credential expires (epoch ms: a token's exp), or None."""
        ...

    async def evaluate(self, token: bytes) -> bytes:
        """The challenge answering ``token``; raises :class:`SaslError` on failure."""
        ...
