import base64
import uuid

from hypothesis import given
from hypothesis import strategies as st

from services.handler.topic_identity import (
    ZERO_TOPIC_ID,
    canonical_topic_id,
    invalid_name_reason,
)


def test_legal_names_pass():
    for name in ["a", "orders", "my.topic_v2-x", "_internal", "x" * 249, "..."]:
        assert invalid_name_reason(name) is None, name


def test_illegal_names_say_why():
    assert "empty" in invalid_name_reason("")
    assert invalid_name_reason(".") == 'Topic name cannot be "." or ".."'
    assert invalid_name_reason("..") is not None
    assert "249" in invalid_name_reason("x" * 250)
    for bad in ["a b", "a/b", "ü", "a:b", "tab\t"]:
        assert "illegal" in invalid_name_reason(bad), bad


def test_zero_absent_and_garbage_ids_are_none():
    for raw in [None, "", ZERO_TOPIC_ID, "AAAAAAAAAAAAAAAAAAAAAA", "not-a-uuid", "xyz"]:
        assert canonical_topic_id(raw) is None, raw


@given(st.uuids().filter(lambda u: u.int != 0))
def test_every_spelling_of_an_id_is_the_same_id(value: uuid.UUID):
    canonical = str(value)
    assert canonical_topic_id(canonical) == canonical
    assert canonical_topic_id(canonical.upper()) == canonical
    kafka_form = base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")
    assert canonical_topic_id(kafka_form) == canonical
