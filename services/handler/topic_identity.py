"""What identifies a topic: its name (validated as Kafka's ``Topic.validate`` does) and its
topic id (a UUID, carried as canonical text, ``00000000-0000-0000-0000-000000000000`` meaning
"none" as Kafka's ``Uuid.ZERO_UUID`` does)."""

from __future__ import annotations

import base64
import binascii
import re
import uuid

MAX_NAME_LENGTH = 249
ZERO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def invalid_name_reason(name: str) -> str | None:
    """Why ``name`` is not a legal topic name, or None when it is."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return 'Topic name cannot be "." or ".."'
    if len(name) > MAX_NAME_LENGTH:
        return (
            f"Topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters,"
            f" topic name: {name}"
        )
    if not _LEGAL.fullmatch(name):
        return (
            f'Topic name "{name}" is illegal, it contains a character other than ASCII'
            " alphanumerics, '.', '_' and '-'"
        )
    return None


def canonical_topic_id(raw: str | None) -> str | None:
    """``raw`` as canonical UUID text; None for an absent, zero or unreadable id.

    Accepts the canonical form in any case and Kafka's own base64url form (22 characters), so
    ids typed by hand through grpcurl compare equal to the ones the replicator hands out.
    """
    if not raw:
        return None
    try:
        value = uuid.UUID(raw)
    except ValueError:
        if len(raw) != 22:
            return None
        try:
            value = uuid.UUID(bytes=base64.urlsafe_b64decode(raw + "=="))
        except (ValueError, binascii.Error):
            return None
    if value.int == 0:
        return None
    return str(value)
