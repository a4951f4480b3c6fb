"""ssl.principal.mapping.rules, with the cases of Kafka's SslPrincipalMapperTest."""

from __future__ import annotations

import pytest

from services.frontend.principal import certificate_dn
from services.frontend.ssl_principal_mapper import NoMatchingRuleError, SslPrincipalMapper

from ..tls_material import CertificateAuthority, client_certificate


@pytest.mark.parametrize("rules", [
    "DEFAULT", "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
    "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U"])
def test_valid_rules(rules) -> None:
    SslPrincipalMapper(rules)


@pytest.mark.parametrize("rules", ["default", "DEFAUL", "DEFAULT/L", "DEFAULT/U",
                                   "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
                                   "RULE:CN=(.*?),OU=ServiceUsers.*/$1/L/U",
                                   "RULE:CN=(.*?),OU=ServiceUsers.*/L", "RULE:CN=(.*?),OU=.*/U",
                                   "RULE:CN=(.*?),OU=ServiceUsers.*/$1/LU"])
def test_invalid_rules(rules) -> None:
    with pytest.raises(ValueError):
        SslPrincipalMapper(rules)


def test_rules_apply_in_order() -> None:
    mapper = SslPrincipalMapper(
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),"
        "ST=(.*?),C=(.*?)$/$1@$2/L,RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U,DEFAULT")
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "Duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("CN=Duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert mapper.name("OU=JavaSoft,O=Sun Microsystems,C=US") == \
        "OU=JavaSoft,O=Sun Microsystems,C=US"


def test_back_references_past_the_last_group_stay_literal() -> None:
    assert SslPrincipalMapper("RULE:^CN=(.*?),OU=(.*?)$/$1$3/").name("CN=a,OU=b") == "a$3"
    assert SslPrincipalMapper("RULE:^CN=(.*?),OU=(.*?)$/$12/").name("CN=a,OU=b") == "a2"


def test_no_matching_rule() -> None:
    with pytest.raises(NoMatchingRuleError):
        SslPrincipalMapper("RULE:^CN=(.*?),OU=eng.*$/$1/").name("CN=bob,OU=ops")


def test_certificate_subject_in_rfc2253_order(tmp_path) -> None:
    pem = client_certificate(CertificateAuthority.create(tmp_path), "alice", unit="eng")
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    der = x509.load_pem_x509_certificate(pem.cert.read_bytes()).public_bytes(
        serialization.Encoding.DER)
    assert certificate_dn(der) == "CN=alice,OU=eng,O=kbroker tests,C=US"
