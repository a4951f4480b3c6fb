"""What every SASL mechanism's server side is (Java's SaslServer as Kafka uses it): it takes
the client's tokens one at a time and answers each with a challenge until it is complete,
then names the authenticated user.

Failures come in Kafka's two kinds: :class:`SaslAuthenticationError` carries a message meant
for the client (it says nothing a stranger should not learn), :class:`SaslError` does not, and
the client is told only that its credentials were invalid.
"""

from __future__ import annotations


class SaslError(Exception):
    """Authentication failed; the reason stays in the broker's log."""


class SaslAuthenticationError(SaslError):
    """Authentication failed; the message is sent to the client."""


class SaslServer:
    """One authentication exchange of one mechanism: subclasses answer tokens in
    :meth:`evaluate`, set ``_user`` (the authorization id) and finally ``_complete``, and
    ``_expiry_ms`` when the credential expires (a token's exp, epoch ms)."""

    mechanism: str

    def __init__(self) -> None:
        self._user = ""
        self._complete = False
        self._expiry_ms: int | None = None

    @property
    def complete(self) -> bool:
        return self._complete

    @property
    def authorization_id(self) -> str:
        """The authenticated user name (once complete)."""
        return self._user

    @property
    def credential_expiry_ms(self) -> int | None:
        """When the credential expires (epoch ms), or None."""
        return self._expiry_ms

    async def evaluate(self, token: bytes) -> bytes:
        """The challenge answering ``token``; raises :class:`SaslError` on failure."""
        raise NotImplementedError
