"""Who a client is (Kafka's KafkaPrincipal as its DefaultKafkaPrincipalBuilder builds it),
written ``User:<name>``:

- PLAINTEXT, and SSL without a client certificate: ``User:ANONYMOUS``;
- SSL with a client certificate: ``User:`` + the subject's RFC 2253 DN mapped by
  ``ssl.principal.mapping.rules`` (see :mod:`.ssl_principal_mapper`);
- SASL_PLAINTEXT and SASL_SSL: ``User:`` + the name SASL authenticated (the client
  certificate, if any, names nobody).
"""

from __future__ import annotations

import ssl

from cryptography import x509

from services.common.acls import ANONYMOUS

from .ssl_principal_mapper import SslPrincipalMapper


def user(name: str) -> str:
    return f"User:{name}"


def certificate_dn(der: bytes) -> str:
    """The subject of a DER certificate as an RFC 2253 string (most specific part first,
    ``CN=alice,OU=eng,O=Example``), as Java's X500Principal.getName() writes it."""
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()


def ssl_principal(ssl_object: ssl.SSLObject | None, mapper: SslPrincipalMapper) -> str:
    """The principal of a TLS client (ANONYMOUS without a client certificate); raises
    :class:`~.ssl_principal_mapper.NoMatchingRuleError` when no mapping rule applies."""
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return ANONYMOUS
    return user(mapper.name(certificate_dn(der)))
