"""SASL/OAUTHBEARER (RFC 7628), server side, as Kafka's OAuthBearerSaslServer with its JWT
validator (KIP-768):

    client-initial-response = gs2-header %x01 *(key "=" value %x01) %x01
    gs2-header              = "n," ["a=" saslname] ","
    auth                    = "auth=Bearer " token          (one of the key/value pairs)

The token is a JWT. It is valid when its signature checks out against a key of the configured
JSON Web Key Set (``sasl_oauthbearer_jwks``: a file, reread when it changes, or an https URL,
fetched again every ``sasl_oauthbearer_jwks_refresh_ms`` and when a token names a key id the
set lacks), it has ``exp`` (not passed) and ``sub``, ``nbf`` (if present) has come, and ``iss``
and ``aud`` are the expected ones where those are configured; ``exp`` and ``nbf`` allow the
configured clock skew. Unsigned tokens (``alg: none``) are accepted only when
``sasl_oauthbearer_allow_unsecured`` is on. The principal is ``sub``; the session ends at
``exp`` (see re-authentication in :mod:`.authenticator`).

A token that is not valid is answered, as RFC 7628 asks, with a JSON error challenge
(``{"status":"invalid_token"}``); the client acknowledges it with a single %x01 and the
exchange fails with that JSON as the message. Extensions are accepted (and ignored).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
import urllib.request
from typing import Any

import jwt

from .mechanism import SaslAuthenticationError, SaslError, SaslServer

log = logging.getLogger(__name__)

_SASLNAME = r"(?:[\x01-\x2B\x2D-\x3C\x3E-\x7F]|=2C|=3D)+"
_KEY = r"[A-Za-z]+"
_VALUE = r"[\x21-\x7E \t\r\n]+"
_INITIAL_RESPONSE = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,\x01(?P<kvpairs>(?:{_KEY}={_VALUE}\x01)*)\x01",
    re.DOTALL)
_AUTH = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_~+/.a-zA-Z0-9]+=*)")
_SIGNED_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                      "ES256", "ES384", "ES512", "EdDSA"]
INVALID_TOKEN = '{"status":"invalid_token"}'
# A token naming an unknown key id makes a URL key set be fetched again, at most this often.
_MIN_REFETCH_SECONDS = 10.0


class TokenError(Exception):
    """The token is not valid (the reason stays in the log)."""


class JwksSource:
    """The keys tokens are checked against: a JWKS file or URL (see the module docstring)."""

    def __init__(self, location: str, refresh_ms: int = 3_600_000) -> None:
        self._location = location
        self._is_url = location.startswith(("https://", "http://"))
        self._refresh_seconds = max(refresh_ms, 1000) / 1000
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._stamp: tuple[int, int] | None = None
        self._fetched = 0.0
        self._lock = asyncio.Lock()

    @staticmethod
    def _parse(text: str) -> dict[str | None, jwt.PyJWK]:
        data = json.loads(text)
        keys: dict[str | None, jwt.PyJWK] = {}
        for entry in data.get("keys", []):
            if entry.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK(entry)
            except jwt.PyJWTError as e:
                log.warning("skipping a JWKS key (%s)", e)
                continue
            keys[entry.get("kid")] = key
        return keys

    def _read_file(self) -> str:
        with open(self._location, encoding="utf-8") as f:
            return f.read()

    def _fetch_url(self) -> str:
        with urllib.request.urlopen(self._location, timeout=10) as reply:
            return reply.read().decode("utf-8")

    async def key(self, kid: str | None) -> jwt.PyJWK:
        """The key named ``kid`` (without a kid: the only key); TokenError if none."""
        async with self._lock:
            await self._refresh(kid)
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        key = self._keys.get(kid)
        if key is None:
            raise TokenError(f"no key {kid!r} in the JWKS")
        return key

    async def _refresh(self, kid: str | None) -> None:
        if not self._is_url:
            try:
                st = os.stat(self._location)
            except OSError as e:
                raise TokenError(f"JWKS file unreadable: {e}") from None
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                try:
                    self._keys = self._parse(self._read_file())
                except (OSError, ValueError) as e:
                    raise TokenError(f"JWKS file unreadable: {e}") from None
                self._stamp = stamp
            return
        now = time.monotonic()
        stale = now - self._fetched >= self._refresh_seconds
        unknown = kid not in self._keys and now - self._fetched >= _MIN_REFETCH_SECONDS
        if self._fetched == 0.0 or stale or unknown:
            try:
                self._keys = self._parse(await asyncio.to_thread(self._fetch_url))
                self._fetched = now
            except (OSError, ValueError) as e:
                if not self._keys:
                    raise TokenError(f"JWKS {self._location} unavailable: {e}") from None
                log.warning("JWKS %s not refreshed: %s", self._location, e)


class TokenValidator:
    """Checks a JWT and returns (principal name, expiry in epoch ms)."""

    def __init__(self, jwks: JwksSource | None, issuer: str = "",
                 audience: tuple[str, ...] = (), allow_unsecured: bool = False,
                 clock_skew_seconds: int = 30) -> None:
        self._jwks = jwks
        self._issuer = issuer or None
        self._audience = list(audience) or None
        self._allow_unsecured = allow_unsecured
        self._leeway = clock_skew_seconds

    async def validate(self, token: str) -> tuple[str, int]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise TokenError(f"malformed token: {e}") from None
        algorithm = header.get("alg")
        options: dict[str, Any] = {"require": ["exp", "sub"],
                                   "verify_aud": self._audience is not None,
                                   "verify_iss": self._issuer is not None}
        key: Any = None
        if algorithm == "none":
            if not self._allow_unsecured:
                raise TokenError("unsecured token (alg none) not allowed")
            options.update(verify_signature=False, verify_exp=True, verify_nbf=True)
            algorithms = ["none"]
        else:
            if self._jwks is None:
                raise TokenError("signed token but no JWKS configured")
            jwk = await self._jwks.key(header.get("kid"))
            key = jwk.key
            algorithms = [jwk.algorithm_name] if getattr(jwk, "algorithm_name", None) \
                else _SIGNED_ALGORITHMS
            if algorithm not in algorithms:
                raise TokenError(f"token algorithm {algorithm!r} does not fit its key")
        try:
            claims = jwt.decode(token, key, algorithms=algorithms, audience=self._audience,
                                issuer=self._issuer, leeway=self._leeway, options=options)
        except jwt.PyJWTError as e:
            raise TokenError(str(e)) from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject.strip():
            raise TokenError("sub claim missing or empty")
        return subject, int(float(claims["exp"]) * 1000)


class OAuthBearerSaslServer(SaslServer):
    mechanism = "OAUTHBEARER"

    def __init__(self, validator: TokenValidator) -> None:
        super().__init__()
        self._validator = validator
        self._error: str | None = None

    async def evaluate(self, token: bytes) -> bytes:
        if token == b"\x01" and self._error is not None:
            raise SaslAuthenticationError(self._error)
        self._error = None
        text = token.decode("utf-8", "replace")
        match = _INITIAL_RESPONSE.fullmatch(text)
        if match is None:
            raise SaslError("Invalid OAUTHBEARER client first message")
        pairs = dict(item.split("=", 1) for item in match["kvpairs"].split("\x01") if item)
        auth = _AUTH.fullmatch(pairs.get("auth", ""))
        if auth is None:
            raise SaslError("Invalid OAUTHBEARER client first message: no valid auth")
        if auth["scheme"].lower() != "bearer":
            raise SaslError(f"Invalid scheme in OAUTHBEARER client first message: "
                            f"{auth['scheme']}")
        try:
            subject, expiry_ms = await self._validator.validate(auth["token"])
        except TokenError as e:
            log.info("OAUTHBEARER token rejected: %s", e)
            self._error = INVALID_TOKEN
            return INVALID_TOKEN.encode()
        authzid = match["authzid"]
        if authzid and authzid != subject:
            raise SaslAuthenticationError(
                f"Authentication failed: Client requested an authorization id ({authzid}) "
                f"that is different from the token's principal name ({subject})")
        self._user, self._expiry_ms, self._complete = subject, expiry_ms, True
        return b""
