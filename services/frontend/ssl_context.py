"""TLS for the SSL and SASL_SSL listeners (Kafka's SslFactory with its keystore reloading):
a server ``ssl.SSLContext`` from PEM files, client certificates off, requested or required
(``ssl.client.auth``), rebuilt when the files change.

Each new connection's handshake (:mod:`.tls_listener`) takes
:meth:`ReloadingSslContext.current`. A change is noticed by the files' modification times,
looked at no more than once a second; connections already open keep the certificate they
started with, new ones get the new one. A set of files that does not load (half-written)
leaves the previous context in use until it does.
"""

from __future__ import annotations

import logging
import os
import ssl
import time

log = logging.getLogger(__name__)

CLIENT_AUTH_MODES = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                     "required": ssl.CERT_REQUIRED}
# How often the files' modification times are looked at, at most.
_CHECK_INTERVAL_SECONDS = 1.0


def build_context(certfile: str, keyfile: str, cafile: str, client_auth: str) -> ssl.SSLContext:
    """A TLS 1.2+ server context; ValueError for a bad client_auth or a missing CA."""
    mode = CLIENT_AUTH_MODES.get(client_auth.lower())
    if mode is None:
        raise ValueError(f"ssl_client_auth must be one of {', '.join(CLIENT_AUTH_MODES)}, "
                         f"not {client_auth!r}")
    if not certfile:
        raise ValueError("an SSL or SASL_SSL listener needs ssl_certfile (and ssl_keyfile)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile or None)
    if cafile:
        context.load_verify_locations(cafile)
    elif mode != ssl.CERT_NONE:
        raise ValueError(f"ssl_client_auth={client_auth} needs ssl_cafile")
    context.verify_mode = mode
    return context


class ReloadingSslContext:
    """The server context of the TLS listeners, following its files (see the module doc)."""

    def __init__(self, certfile: str, keyfile: str, cafile: str, client_auth: str) -> None:
        self._files = tuple(f for f in (certfile, keyfile, cafile) if f)
        self._args = (certfile, keyfile, cafile, client_auth)
        self._current = build_context(*self._args)
        self._stamps = self._file_stamps()
        self._checked = time.monotonic()
        self.reloads = 0

    def _file_stamps(self) -> tuple[tuple[int, int], ...]:
        out = []
        for path in self._files:
            try:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, 0))
        return tuple(out)

    def current(self) -> ssl.SSLContext:
        """The context for a new connection, rebuilt first if the files changed."""
        now = time.monotonic()
        if now - self._checked >= _CHECK_INTERVAL_SECONDS:
            self._checked = now
            stamps = self._file_stamps()
            if stamps != self._stamps:
                try:
                    self._current = build_context(*self._args)
                except (OSError, ValueError, ssl.SSLError) as e:
                    log.warning("TLS files changed but do not load (%s); keeping the "
                                "previous certificate", e)
                else:
                    self._stamps = stamps
                    self.reloads += 1
                    log.info("TLS certificate reloaded from %s", ", ".join(self._files))
        return self._current
