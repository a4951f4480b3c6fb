"""SASL/PLAIN (RFC 4616), as Kafka's PlainSaslServer:

    message = [authzid] NUL authcid NUL passwd

One token, answered with an empty challenge once the password checks out. Every failure
message goes to the client (they reveal nothing about which users exist).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .mechanism import SaslAuthenticationError, SaslServer

PasswordCheck = Callable[[str, str], Awaitable[bool]]


class PlainSaslServer(SaslServer):
    mechanism = "PLAIN"

    def __init__(self, check_password: PasswordCheck) -> None:
        super().__init__()
        self._check_password = check_password

    async def evaluate(self, token: bytes) -> bytes:
        tokens = token.decode("utf-8", "replace").split("\x00", 3)
        if len(tokens) != 3:
            raise SaslAuthenticationError(
                f"Invalid SASL/PLAIN response: expected 3 tokens, got {min(len(tokens), 4)}")
        authzid, username, password = tokens
        if not username:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        if not await self._check_password(username, password):
            raise SaslAuthenticationError("Authentication failed: Invalid username or password")
        if authzid and authzid != username:
            raise SaslAuthenticationError("Authentication failed: Client requested an "
                                          "authorization id that is different from username")
        self._user = username
        self._complete = True
        return b""
