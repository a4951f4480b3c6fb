"""What the frontend answers when no handler did: the request's own items, each carrying one
error code (built from the message schema by :mod:`services.common.error_answers`, the way
Kafka's broker answers a request it failed to complete).

Two kinds of failure reach here:

- the outcome is unknown (a handler took the request and then died or missed the deadline):
  the request may or may not have taken effect, so mutating APIs answer REQUEST_TIMED_OUT, the
  code the Java broker gives for an operation whose result it cannot tell;
- no handler could be reached at all: read-only APIs answer the retriable code that makes a
  client refresh its metadata and try again (:data:`UNAVAILABLE_CODES`).

The APIs served by a coordinator (groups, producer ids) answer as Kafka's coordinators do when
they cannot complete an operation: a timed-out write or an unavailable coordinator is
COORDINATOR_NOT_AVAILABLE (Kafka's coordinator turns REQUEST_TIMED_OUT into it), which makes
clients look the coordinator up again and retry (:func:`failure_code`). OffsetFetch, read-only,
answers COORDINATOR_LOAD_IN_PROGRESS instead, as its handler does while the group's partition
cannot be read: librdkafka retries that in place, but after COORDINATOR_NOT_AVAILABLE it never
starts fetching the partitions it asked about.

A Produce whose outcome is unknown has no such answer either, and closes the connection (see
:meth:`~.dispatcher.Dispatcher.handle`): its append may still be on its way to the log node, and
a REQUEST_TIMED_OUT would let the client's next request for the partition overtake it. The
client would then be answered OUT_OF_ORDER_SEQUENCE_NUMBER, and librdkafka bumps its producer
epoch and renumbers the records it still holds, the unknown ones included, so a late append
would be stored twice. A closed connection fails every request in flight on it, which clients
resend in order under the same sequence numbers, and the log node recognises whichever copy of
the unknown batch comes second. (A Kafka broker's REQUEST_TIMED_OUT never has this problem: by
then the records are in the leader's log.)

Metadata has no such answer: a response without brokers leaves a client with nowhere to send
anything, and one naming brokers or leaders the frontend does not know would be a lie. The
frontend therefore closes the connection, which every client handles as a broker that went
away (reconnect, with back-off, to its bootstrap servers). :func:`error_response` returns None
for it.
"""

from __future__ import annotations

from google.protobuf.message import Message
from kio.schema.errors import ErrorCode

from services.common import error_answers

METADATA_KEY = 3
OFFSET_FETCH_KEY = 9
# APIs served by a coordinator (groups, transactions, producer ids): their failures are the
# coordinator's. Kafka's group and transaction coordinators answer a write that timed out
# COORDINATOR_NOT_AVAILABLE; REQUEST_TIMED_OUT to EndTxn or AddPartitionsToTxn is an abortable
# error to librdkafka, where COORDINATOR_NOT_AVAILABLE is retried.
COORDINATOR_APIS = frozenset({8, 9, 10, 11, 12, 13, 14, 15, 16, 22, 24, 25, 26, 28, 42, 47,
                              68, 69})

# The retriable code a read-only API answers when no handler is reachable.
UNAVAILABLE_CODES: dict[int, ErrorCode] = {
    1: ErrorCode.not_leader_or_follower,     # Fetch: refresh metadata, fetch again
    2: ErrorCode.not_leader_or_follower,     # ListOffsets: likewise
    32: ErrorCode.request_timed_out,         # DescribeConfigs: likewise
    60: ErrorCode.request_timed_out,         # DescribeCluster: retried by the admin client
}


def failure_code(api_key: int, code: ErrorCode) -> ErrorCode:
    """The code an API answers for a failure the frontend would call ``code``: coordinator
    APIs say COORDINATOR_NOT_AVAILABLE where others say REQUEST_TIMED_OUT."""
    if api_key in COORDINATOR_APIS and code == ErrorCode.request_timed_out:
        if api_key == OFFSET_FETCH_KEY:
            return ErrorCode.coordinator_load_in_progress
        return ErrorCode.coordinator_not_available
    return code


def error_response(api_key: int, request: Message, code: ErrorCode) -> Message | None:
    """The answer to ``request`` (its protobuf form) giving every item it names the code
    ``code`` stands for (:func:`failure_code`), or None when the API has no safe error answer
    and the connection should close instead."""
    if api_key == METADATA_KEY:
        return None
    return error_answers.error_response(request, int(failure_code(api_key, code)))
