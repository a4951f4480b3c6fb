"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), server side, as Kafka's
ScramSaslServer and ScramFormatter:

    client-first  = gs2-header client-first-bare
    gs2-header    = "n," ["a=" saslname] ","          (no channel binding, as Kafka)
    client-first-bare = [reserved-mext ","] "n=" saslname ",r=" c-nonce ("," ext)*
    server-first  = "r=" c-nonce s-nonce ",s=" base64(salt) ",i=" iterations
    client-final  = "c=" base64(gs2-header) ",r=" c-nonce s-nonce ("," ext)* ",p=" base64(proof)
    server-final  = "v=" base64(ServerSignature)

    SaltedPassword  = Hi(password, salt, i)           (PBKDF2-HMAC)
    ClientKey       = HMAC(SaltedPassword, "Client Key")     StoredKey = H(ClientKey)
    ServerKey       = HMAC(SaltedPassword, "Server Key")
    AuthMessage     = client-first-bare "," server-first "," client-final-without-proof
    ClientProof     = ClientKey XOR HMAC(StoredKey, AuthMessage)
    ServerSignature = HMAC(ServerKey, AuthMessage)

The broker keeps only salt, StoredKey, ServerKey and the iteration count (never the
password); a client proves it knows the password without sending it, and the server's
signature proves the server held the credential. In a saslname ``=2C`` is "," and ``=3D`` is
"="; extensions are accepted and ignored, except ``tokenauth`` (delegation tokens, which this
broker does not issue: such a client fails). Credentials with fewer than 4096 iterations are
refused, as Kafka does.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .mechanism import SaslAuthenticationError, SaslError, SaslServer

MIN_ITERATIONS = 4096
DEFAULT_ITERATIONS = 4096


class ScramMechanism(enum.Enum):
    """Kafka's ScramMechanism: name, hash, and its code in ScramCredential.mechanism."""

    SCRAM_SHA_256 = ("SCRAM-SHA-256", "sha256", 1)
    SCRAM_SHA_512 = ("SCRAM-SHA-512", "sha512", 2)

    def __init__(self, mechanism_name: str, hash_name: str, code: int) -> None:
        self.mechanism_name = mechanism_name
        self.hash_name = hash_name
        self.code = code

    @classmethod
    def named(cls, name: str) -> ScramMechanism | None:
        for m in cls:
            if m.mechanism_name == name:
                return m
        return None

    @classmethod
    def of_code(cls, code: int) -> ScramMechanism | None:
        for m in cls:
            if m.code == code:
                return m
        return None


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the broker stores for one user and mechanism."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def _hmac(mechanism: ScramMechanism, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, mechanism.hash_name).digest()


def salted_password(mechanism: ScramMechanism, password: str, salt: bytes,
                    iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode("utf-8"), salt, iterations)


def credential_from_salted_password(mechanism: ScramMechanism, salted: bytes, salt: bytes,
                                    iterations: int) -> ScramCredential:
    client_key = _hmac(mechanism, salted, b"Client Key")
    stored_key = hashlib.new(mechanism.hash_name, client_key).digest()
    server_key = _hmac(mechanism, salted, b"Server Key")
    return ScramCredential(salt, stored_key, server_key, iterations)


def credential_from_password(mechanism: ScramMechanism, password: str,
                             iterations: int = DEFAULT_ITERATIONS,
                             salt: bytes | None = None) -> ScramCredential:
    """A new credential (random salt unless given), as AlterUserScramCredentials stores."""
    salt = secrets.token_bytes(32) if salt is None else salt
    return credential_from_salted_password(
        mechanism, salted_password(mechanism, password, salt, iterations), salt, iterations)


def password_matches(mechanism: ScramMechanism, credential: ScramCredential,
                     password: str) -> bool:
    """Whether ``password`` is the one ``credential`` was made from (constant time)."""
    derived = credential_from_salted_password(
        mechanism, salted_password(mechanism, password, credential.salt,
                                   credential.iterations),
        credential.salt, credential.iterations)
    return hmac.compare_digest(derived.stored_key, credential.stored_key)


def username(saslname: str) -> str:
    """The user a saslname names (``=2C`` is ",", ``=3D`` is "="); ValueError for another
    ``=``."""
    name = saslname.replace("=2C", ",")
    if "=" in name.replace("=3D", ""):
        raise ValueError(f"Invalid username: {saslname}")
    return name.replace("=3D", "=")


_SASLNAME = r"(?:[\x01-\x2B\x2D-\x3C\x3E-\x7F]|=2C|=3D)+"
_VALUE = r"[\x01-\x2B\x2D-\x7F]+"
_PRINTABLE = r"[\x21-\x2B\x2D-\x7E]+"
_BASE64 = r"(?:[a-zA-Z0-9/+]{4})*(?:[a-zA-Z0-9/+]{3}=|[a-zA-Z0-9/+]{2}==)?"
_EXTENSIONS = rf"(?:,[A-Za-z]+={_VALUE})*"
_CLIENT_FIRST = re.compile(
    rf"(?P<gs2>n,(?:a=(?P<authzid>{_SASLNAME}))?,)"
    rf"(?P<bare>(?:m={_VALUE},)?n=(?P<saslname>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})"
    rf"(?P<extensions>{_EXTENSIONS}))")
_CLIENT_FINAL = re.compile(
    rf"(?P<without_proof>c=(?P<channel>{_BASE64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS})"
    rf",p=(?P<proof>{_BASE64})")

CredentialLookup = Callable[[str, ScramMechanism], Awaitable[ScramCredential | None]]


class ScramSaslServer(SaslServer):
    """One SCRAM exchange: client-first, then client-final."""

    def __init__(self, mechanism: ScramMechanism, lookup: CredentialLookup) -> None:
        super().__init__()
        self.mechanism = mechanism.mechanism_name
        self._scram = mechanism
        self._lookup = lookup
        self._credential: ScramCredential | None = None
        self._gs2_header = b""
        self._nonce = ""
        self._auth_message_start = ""
        self._failed = False

    async def evaluate(self, token: bytes) -> bytes:
        if self._complete or self._failed:
            raise SaslError(f"Unexpected challenge in Sasl server state "
                            f"{'COMPLETE' if self._complete else 'FAILED'}")
        try:
            if self._credential is None:
                return await self._client_first(token)
            return self._client_final(token)
        except SaslError:
            self._failed = True
            self._credential = None
            raise

    async def _client_first(self, token: bytes) -> bytes:
        text = token.decode("utf-8", "replace")
        match = _CLIENT_FIRST.fullmatch(text)
        if match is None:
            raise SaslError(f"Invalid SCRAM client first message format: {text}")
        extensions = dict(item.split("=", 1) for item in match["extensions"][1:].split(",")
                          if item)
        if extensions.get("tokenauth", "").lower() == "true":
            raise SaslError("Token Authentication failed: delegation tokens are not supported")
        try:
            user = username(match["saslname"])
        except ValueError as e:
            raise SaslError(str(e)) from None
        credential = await self._lookup(user, self._scram)
        if credential is None:
            raise SaslError("Authentication failed: Invalid user credentials")
        authzid = match["authzid"]
        if authzid and authzid != user:
            raise SaslAuthenticationError("Authentication failed: Client requested an "
                                          "authorization id that is different from username")
        if credential.iterations < MIN_ITERATIONS:
            raise SaslError(f"Iterations {credential.iterations} is less than the minimum "
                            f"{MIN_ITERATIONS} for {self.mechanism}")
        self._user = user
        self._credential = credential
        self._gs2_header = match["gs2"].encode()
        self._nonce = match["nonce"] + secrets.token_urlsafe(24)
        server_first = (f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
                        f"i={credential.iterations}")
        self._auth_message_start = f"{match['bare']},{server_first},"
        return server_first.encode()

    def _client_final(self, token: bytes) -> bytes:
        credential = self._credential
        assert credential is not None
        text = token.decode("utf-8", "replace")
        match = _CLIENT_FINAL.fullmatch(text)
        if match is None:
            raise SaslError(f"Invalid SCRAM client final message format: {text}")
        # As Kafka: the nonce must end with the full nonce (librdkafka 2.0 sends the client
        # nonce twice, and Kafka accepts it).
        if not match["nonce"].endswith(self._nonce):
            raise SaslError("Invalid client nonce in the final client message.")
        try:
            channel = base64.b64decode(match["channel"], validate=True)
            proof = base64.b64decode(match["proof"], validate=True)
        except binascii.Error:
            raise SaslError("Invalid SCRAM client final message encoding") from None
        if channel != self._gs2_header:
            raise SaslError("Invalid channel binding in the final client message")
        auth_message = (self._auth_message_start + match["without_proof"]).encode("utf-8")
        signature = _hmac(self._scram, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise SaslError("Invalid client credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._scram.hash_name, client_key).digest(),
                                   credential.stored_key):
            raise SaslError("Invalid client credentials")
        server_signature = _hmac(self._scram, credential.server_key, auth_message)
        self._credential = None
        self._complete = True
        return b"v=" + base64.b64encode(server_signature)
