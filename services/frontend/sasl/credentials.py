"""The credentials SASL checks (Kafka's CredentialCache plus a users file):

- ``sasl_users_file``: one ``user:password`` per line (the password is everything after the
  first ":"; blank lines and lines starting with "#" are skipped), reread when the file
  changes. Meant for a Kubernetes Secret or a test to define users without the admin API.
- the SCRAM credentials of the cluster metadata (AlterUserScramCredentials), from
  :class:`~services.frontend.cluster_view.ClusterView`: salted, never a password.

PLAIN accepts a password that matches the file's (compared in constant time), or else one
from which the user's SCRAM credential in the metadata derives (SHA-512's, else SHA-256's).
SCRAM uses the user's credential in the metadata; a user only in the file gets one derived
from the file's password (random salt, 4096 iterations, kept in memory while the password
stays the same).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os

from kbroker.replicator.v1 import replicator_pb2

from .scram import (
    ScramCredential,
    ScramMechanism,
    credential_from_password,
    password_matches,
)

log = logging.getLogger(__name__)


def parse_users_file(text: str) -> dict[str, str]:
    """``user -> password`` of a users file (ValueError for a line without ":" or user)."""
    users: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user.strip():
            raise ValueError(f"line {number}: expected user:password")
        users[user.strip()] = password
    return users


class CredentialStore:
    """Looks credentials up for the SASL mechanisms (see the module docstring)."""

    def __init__(self, users_file: str = "") -> None:
        self._users_file = users_file
        self._file_stamp: tuple[int, int] | None = None
        self._file_users: dict[str, str] = {}
        # (user, mechanism) -> (password it was derived from, credential)
        self._derived: dict[tuple[str, ScramMechanism], tuple[str, ScramCredential]] = {}
        self._scram: dict[tuple[str, ScramMechanism], ScramCredential] = {}

    def on_metadata(self, snapshot: replicator_pb2.ClusterMetadata) -> None:
        """ClusterView listener: index the snapshot's SCRAM credentials."""
        scram = {}
        for c in snapshot.scram_credentials:
            mechanism = ScramMechanism.of_code(c.mechanism)
            if mechanism is not None:
                scram[(c.user, mechanism)] = ScramCredential(
                    bytes(c.salt), bytes(c.stored_key), bytes(c.server_key), c.iterations)
        self._scram = scram

    def file_users(self) -> dict[str, str]:
        """The users file's users (reread when it changed; kept as they were when a new
        version does not parse)."""
        if not self._users_file:
            return {}
        try:
            st = os.stat(self._users_file)
        except OSError as e:
            log.warning("SASL users file %s unreadable: %s", self._users_file, e)
            return self._file_users
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._file_stamp:
            try:
                with open(self._users_file, encoding="utf-8") as f:
                    self._file_users = parse_users_file(f.read())
                self._file_stamp = stamp
            except (OSError, ValueError) as e:
                log.warning("SASL users file %s not loaded: %s", self._users_file, e)
        return self._file_users

    async def check_password(self, user: str, password: str) -> bool:
        """PLAIN: does ``password`` authenticate ``user``?"""
        expected = self.file_users().get(user)
        if expected is not None and hmac.compare_digest(expected.encode("utf-8"),
                                                        password.encode("utf-8")):
            return True
        for mechanism in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256):
            credential = self._scram.get((user, mechanism))
            if credential is not None:
                # PBKDF2 takes milliseconds: off the event loop.
                return await asyncio.to_thread(password_matches, mechanism, credential,
                                               password)
        return False

    async def scram_credential(self, user: str,
                               mechanism: ScramMechanism) -> ScramCredential | None:
        """SCRAM: the user's credential for ``mechanism``, or None."""
        credential = self._scram.get((user, mechanism))
        if credential is not None:
            return credential
        password = self.file_users().get(user)
        if password is None:
            return None
        derived = self._derived.get((user, mechanism))
        if derived is None or derived[0] != password:
            credential = await asyncio.to_thread(credential_from_password, mechanism, password)
            derived = (password, credential)
            self._derived[(user, mechanism)] = derived
        return derived[1]
