"""The SASL mechanisms' server sides and what they check, without sockets: OAUTHBEARER tokens
(signature against a JWKS file, exp, nbf, issuer, audience, unsecured tokens), SCRAM messages
out of order or tampered with, the users file and the failed-authentication delays."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.frontend.sasl.credentials import CredentialStore, parse_users_file
from services.frontend.sasl.failure_delays import FailedAuthenticationDelays
from services.frontend.sasl.mechanism import SaslAuthenticationError, SaslError
from services.frontend.sasl.oauthbearer import (
    INVALID_TOKEN,
    JwksSource,
    OAuthBearerSaslServer,
    TokenValidator,
)
from services.frontend.sasl.plain import PlainSaslServer
from services.frontend.sasl.scram import (
    ScramMechanism,
    ScramSaslServer,
    credential_from_password,
)

from .oauth_tokens import TokenIssuer, initial_response, unsecured_token
from .sasl_client import ScramClient, plain_token


def run(coro):
    return asyncio.run(coro)


@pytest.fixture()
def issuer(tmp_path) -> TokenIssuer:
    return TokenIssuer(tmp_path)


def oauth_server(issuer: TokenIssuer, **options) -> OAuthBearerSaslServer:
    options.setdefault("issuer", issuer.issuer)
    options.setdefault("audience", ("kafka",))
    return OAuthBearerSaslServer(TokenValidator(JwksSource(str(issuer.jwks)), **options))


def test_a_valid_token_names_its_subject_and_expiry(issuer) -> None:
    server = oauth_server(issuer)
    token = issuer.token("alice", lifetime=600)
    assert run(server.evaluate(initial_response(token))) == b""
    assert server.complete and server.authorization_id == "alice"
    assert server.credential_expiry_ms is not None


@pytest.mark.parametrize("case", ["expired", "not_yet_valid", "wrong_audience",
                                  "wrong_issuer", "unsecured", "other_key", "garbage"])
def test_invalid_tokens_get_the_error_challenge_then_fail(issuer, tmp_path, case) -> None:
    server = oauth_server(issuer)
    token = {
        "expired": lambda: issuer.token(lifetime=-120),
        "not_yet_valid": lambda: issuer.token(nbf=int(time.time()) + 600),
        "wrong_audience": lambda: issuer.token(audience="other"),
        "wrong_issuer": lambda: issuer.token(iss="https://evil.test"),
        "unsecured": lambda: unsecured_token(),
        "other_key": lambda: TokenIssuer(tmp_path, kid="k2").token(),
        "garbage": lambda: "abc.def.ghi",
    }[case]()
    assert run(server.evaluate(initial_response(token))) == INVALID_TOKEN.encode()
    assert not server.complete
    with pytest.raises(SaslAuthenticationError, match="invalid_token"):
        run(server.evaluate(b"\x01"))


def test_unsecured_tokens_only_when_allowed() -> None:
    server = OAuthBearerSaslServer(TokenValidator(None, allow_unsecured=True))
    assert run(server.evaluate(initial_response(unsecured_token("bob")))) == b""
    assert server.authorization_id == "bob"
    expired = OAuthBearerSaslServer(TokenValidator(None, allow_unsecured=True))
    assert run(expired.evaluate(initial_response(unsecured_token(lifetime=-120)))) == \
        INVALID_TOKEN.encode()


def test_authzid_must_be_the_subject_and_the_message_well_formed(issuer) -> None:
    with pytest.raises(SaslAuthenticationError, match="authorization id"):
        run(oauth_server(issuer).evaluate(initial_response(issuer.token("alice"), "bob")))
    with pytest.raises(SaslError):
        run(oauth_server(issuer).evaluate(b"n,,auth=Bearer x"))


def scram_server(password: str = "pw") -> ScramSaslServer:
    async def lookup(user, mechanism):
        return credential_from_password(mechanism, password) if user == "alice" else None

    return ScramSaslServer(ScramMechanism.SCRAM_SHA_256, lookup)


def test_scram_rejects_tampering() -> None:
    client = ScramClient("SCRAM-SHA-256", "alice", "pw")
    server = scram_server()
    first = run(server.evaluate(client.first()))
    with pytest.raises(SaslError, match="nonce"):
        run(server.evaluate(client.final(first, nonce=first.decode()[2:].split(",")[0] + "x")))
    with pytest.raises(SaslError, match="Unexpected"):
        run(server.evaluate(b"anything"))
    # librdkafka 2.0 repeats the client nonce; Kafka accepts a nonce ending with the full one.
    client = ScramClient("SCRAM-SHA-256", "alice", "pw")
    server = scram_server()
    first = run(server.evaluate(client.first()))
    full = first.decode()[2:].split(",")[0]
    assert run(server.evaluate(client.final(first, nonce=full[:5] + full))).startswith(b"v=")
    client = ScramClient("SCRAM-SHA-256", "alice", "pw")
    server = scram_server()
    first = run(server.evaluate(client.first()))
    final = client.final(first).replace(b"c=biws", b"c=eSws")  # "y,," channel binding
    with pytest.raises(SaslError, match="channel binding"):
        run(server.evaluate(final))
    with pytest.raises(SaslError, match="format"):
        run(scram_server().evaluate(b"y,,n=alice,r=abc"))
    with pytest.raises(SaslError, match="Invalid user credentials"):
        run(scram_server().evaluate(ScramClient("SCRAM-SHA-256", "nobody", "pw").first()))
    with pytest.raises(SaslAuthenticationError, match="authorization id"):
        run(scram_server().evaluate(b"n,a=bob,n=alice,r=abc"))


def test_plain_messages() -> None:
    async def check(user, password):
        return (user, password) == ("alice", "pw")

    with pytest.raises(SaslAuthenticationError, match="expected 3 tokens, got 2"):
        run(PlainSaslServer(check).evaluate(b"alice\x00pw"))
    with pytest.raises(SaslAuthenticationError, match="username not specified"):
        run(PlainSaslServer(check).evaluate(plain_token("", "pw")))
    with pytest.raises(SaslAuthenticationError, match="authorization id"):
        run(PlainSaslServer(check).evaluate(plain_token("alice", "pw", authzid="bob")))
    server = PlainSaslServer(check)
    run(server.evaluate(plain_token("alice", "pw", authzid="alice")))
    assert server.authorization_id == "alice"


def test_users_file_format(tmp_path) -> None:
    assert parse_users_file("# c\nalice:a:b\n\n bob :x\n") == {"alice": "a:b", "bob": "x"}
    with pytest.raises(ValueError, match="line 1"):
        parse_users_file("alice\n")
    path = tmp_path / "users"
    path.write_text("alice:one\n")
    store = CredentialStore(str(path))
    assert run(store.check_password("alice", "one"))
    path.write_text("alice:two-changed\n")
    assert run(store.check_password("alice", "two-changed"))
    assert not run(store.check_password("alice", "one"))


def test_failed_authentication_delays_grow_are_bounded_and_decay() -> None:
    delays = FailedAuthenticationDelays(100)
    assert [delays.failed("a", now=0) for _ in range(4)] == [0.1, 0.2, 0.4, 0.8]
    assert delays.failed("b", now=0) == 0.1
    assert max(delays.failed("a", now=1) for _ in range(20)) == 5.0
    assert delays.failed("a", now=10_000) == 0.1
    assert FailedAuthenticationDelays(0).failed("a") == 0.0


def test_jwks_from_a_url_is_fetched_again_for_an_unknown_key(tmp_path, monkeypatch) -> None:
    import http.server
    import threading

    first, second = TokenIssuer(tmp_path, kid="k1"), TokenIssuer(tmp_path, kid="k2")
    served = {"body": first.jwks.read_bytes(), "fetches": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served["fetches"] += 1
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(served["body"])

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
        validator = TokenValidator(JwksSource(url), audience=("kafka",))
        assert run(validator.validate(first.token("alice")))[0] == "alice"
        assert served["fetches"] == 1
        # The issuer rotates its key: a token with the new key id makes the set be fetched
        # again (no sooner than the minimum interval, here shortened).
        served["body"] = second.jwks.read_bytes()
        monkeypatch.setattr("services.frontend.sasl.oauthbearer._MIN_REFETCH_SECONDS", 0.0)
        assert run(validator.validate(second.token("bob")))[0] == "bob"
        assert served["fetches"] == 2
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
