"""A produce with acks=all waiting for replication (Kafka's ``DelayedProduce``).

The handler parks it after the leader appended, keyed ``topic-partition`` with the threshold
"last appended offset + 1". Each partition is settled once

- its reported high watermark reaches the threshold (every in-sync replica has the batch),
- or it reports an error after parking (the leader moved: NOT_LEADER_OR_FOLLOWER), which stays
  that partition's answer;

and the produce completes when every partition is settled. If the request timeout passes first,
it expires and every partition still pending answers REQUEST_TIMED_OUT, the settled ones keep
their outcome. Maps onto Await with ``require_all`` true; the handler reads the answer per key.
"""

from __future__ import annotations

from dataclasses import replace

from services.common.errors import ErrorCode

from .delayed_await import DelayedAwait
from .key_states import KeyState

REQUEST_TIMED_OUT = ErrorCode.request_timed_out.value


class DelayedProduce(DelayedAwait):
    """An acks=all produce parked until every partition is replicated or fails, or times out."""

    KIND = "produce"

    def expired_state(self, state: KeyState) -> KeyState:
        return replace(state, error_code=REQUEST_TIMED_OUT)
