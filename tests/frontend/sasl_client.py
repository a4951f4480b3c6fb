"""The client side of SASL for tests that speak the wire themselves: SCRAM (RFC 5802) with
its proofs, PLAIN tokens, and SaslHandshake / SaslAuthenticate requests as kio entities."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


def handshake(mechanism: str) -> SaslHandshakeRequest:
    return SaslHandshakeRequest(mechanism=mechanism)


def authenticate(token: bytes) -> SaslAuthenticateRequest:
    return SaslAuthenticateRequest(auth_bytes=token)


def plain_token(user: str, password: str, authzid: str = "") -> bytes:
    return f"{authzid}\x00{user}\x00{password}".encode()


class ScramClient:
    """One SCRAM exchange: :meth:`first`, :meth:`final` (given the server's first message),
    then :meth:`verify` the server's final message."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self._hash = HASHES[mechanism]
        self._user = user.replace("=", "=3D").replace(",", "=2C")
        self._password = password
        self._nonce = secrets.token_urlsafe(18)
        self._bare = f"n={self._user},r={self._nonce}"
        self._auth_message = b""
        self._server_key = b""

    def first(self) -> bytes:
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes, *, nonce: str | None = None) -> bytes:
        parts = dict(item.split("=", 1) for item in server_first.decode().split(","))
        assert parts["r"].startswith(self._nonce)
        salted = hashlib.pbkdf2_hmac(self._hash, self._password.encode(),
                                     base64.b64decode(parts["s"]), int(parts["i"]))
        client_key = hmac.new(salted, b"Client Key", self._hash).digest()
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c=biws,r={nonce or parts['r']}"
        self._auth_message = f"{self._bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.new(stored_key, self._auth_message, self._hash).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_key = hmac.new(salted, b"Server Key", self._hash).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        expected = hmac.new(self._server_key, self._auth_message, self._hash).digest()
        return server_final == b"v=" + base64.b64encode(expected)
