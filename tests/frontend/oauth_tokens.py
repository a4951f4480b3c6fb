"""JWTs and a JSON Web Key Set made in the test (RS256), for the OAUTHBEARER tests."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm


class TokenIssuer:
    """Signs tokens with its own RSA key and publishes the key as a JWKS file."""

    def __init__(self, folder: Path, issuer: str = "https://issuer.test", kid: str = "k1"
                 ) -> None:
        self.issuer = issuer
        self.kid = kid
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(RSAAlgorithm.to_jwk(self._key.public_key()))
        jwk.update(kid=kid, use="sig", alg="RS256")
        self.jwks = folder / f"jwks-{kid}.json"
        self.jwks.write_text(json.dumps({"keys": [jwk]}))

    def token(self, subject: str = "alice", lifetime: float = 3600, audience: str = "kafka",
              **claims: object) -> str:
        now = int(time.time())
        body = {"sub": subject, "iss": self.issuer, "aud": audience, "iat": now,
                "exp": now + int(lifetime), **claims}
        return jwt.encode(body, self._key, algorithm="RS256", headers={"kid": self.kid})


def unsecured_token(subject: str = "alice", lifetime: float = 3600) -> str:
    now = int(time.time())
    return jwt.encode({"sub": subject, "exp": now + int(lifetime), "iat": now}, None,
                      algorithm="none")


def initial_response(token: str, authzid: str = "") -> bytes:
    """The OAUTHBEARER client's first (and only) message (RFC 7628)."""
    gs2 = f"n,a={authzid}," if authzid else "n,,"
    return f"{gs2}\x01auth=Bearer {token}\x01\x01".encode()
