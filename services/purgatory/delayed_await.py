"""The operation behind the Await RPC: wait until watched keys reach their thresholds. The
kinds with rules of their own build on it: :mod:`.delayed_fetch` and :mod:`.delayed_produce`.

Each watched key has a threshold. A key is *done* for an operation once its last reported
position is >= its threshold, or once a non-zero error was reported for it after the operation
was parked. Errors reported before parking do not count: the latest state of a quiet key may be
an old error, and honouring it would answer every new waiter at once with stale news; except
for an ended epoch key (:attr:`~.key_states.KeyState.ended`), whose error stays true for what its
last position does not cover. A done key
stays done (a key that failed keeps its error in the answer even if a later report clears it),
which is how Kafka's DelayedProduce treats a partition that is no longer pending.

The operation completes when any key is done (``require_all`` false: DelayedFetch) or when every
key is done (``require_all`` true: DelayedProduce); with no keys at all, "every" holds at once
and "any" never does, so the latter is a plain delay. It answers exactly once through
``result``, with the Await RPC's own answer (``AwaitResponse``): COMPLETED with each key's state,
or EXPIRED after ``timeout_ms`` with each key's state as :meth:`DelayedAwait.expired_state`
reports it; keys in the order they were given, each with the state that decided it (its error)
or else its last reported state. A key's ISR in the answer is that of the report that satisfied
it (a leader's ISR when its high watermark reached the threshold: what min.insync.replicas is
checked against, as Kafka checks it when a partition of a DelayedProduce is satisfied), empty
for a key not satisfied.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from kbroker.purgatory.v1 import purgatory_pb2

from .delayed_operation import DelayedOperation
from .key_states import KeyState, KeyStates


class DelayedAwait(DelayedOperation):
    """An operation of some kind ("fetch", "produce", ...) waiting on keys.

    Must be created on the event loop that will complete it (``result`` is a future of it).
    """

    def __init__(
        self,
        *,
        kind: str,
        thresholds: Mapping[str, int],
        require_all: bool,
        timeout_ms: int,
        states: KeyStates,
        listener: Callable[[DelayedAwait, purgatory_pb2.AwaitResponse], None] | None = None,
    ) -> None:
        super().__init__(timeout_ms)
        self.kind = kind
        self.thresholds = dict(thresholds)
        self.require_all = require_all
        self.result: asyncio.Future[purgatory_pb2.AwaitResponse] = (
            asyncio.get_running_loop().create_future())
        self._states = states
        # Only reports numbered above this one happened after parking.
        self._parked_after = states.sequence
        self._waiting = dict(self.thresholds)
        self._failed: dict[str, KeyState] = {}
        # The ISR each key was satisfied with (see the module docstring).
        self._satisfied_with: dict[str, tuple[int, ...]] = {}
        self._satisfied = False
        self._listener = listener
        self.started = time.monotonic()

    def try_complete(self) -> bool:
        waiting = self._waiting
        for key, threshold in tuple(waiting.items()):
            state = self._states.get(key)
            if state is None:
                continue
            if state.ended and state.position >= threshold:
                del waiting[key]  # the ended epoch had covered it
                self._satisfied_with[key] = state.isr
            elif state.error_code and (state.sequence > self._parked_after or state.ended):
                self._failed[key] = state
                del waiting[key]
            elif state.position >= threshold:
                del waiting[key]
                self._satisfied_with[key] = state.isr
        done = not waiting if self.require_all else len(waiting) < len(self.thresholds)
        if not done:
            return False
        self._satisfied = True
        return self.force_complete()

    def expired_state(self, state: KeyState) -> KeyState:
        """The answer for a key still awaited when the operation expires: its last state."""
        return state

    def on_complete(self) -> None:
        satisfied = self._satisfied
        keys = []
        for key in self.thresholds:
            state = self._failed.get(key)
            error_code = 0
            if state is None:
                state = self._states.current(key)
                if not satisfied and key in self._waiting:
                    state = self.expired_state(state)
                # An ended epoch's error is not this key's when its position covered it.
                if not state.ended or state.position < self.thresholds[key]:
                    error_code = state.error_code
            else:
                error_code = state.error_code
            keys.append(purgatory_pb2.KeyState(key=key, position=state.position,
                                               error_code=error_code,
                                               isr=self._satisfied_with.get(key, ())))
        answer = purgatory_pb2.AwaitResponse(
            outcome=purgatory_pb2.OUTCOME_COMPLETED if satisfied else purgatory_pb2.OUTCOME_EXPIRED,
            keys=keys)
        if self._listener is not None:
            self._listener(self, answer)
        if not self.result.done():
            self.result.set_result(answer)

    def on_expiration(self) -> None:
        # The answer already says EXPIRED (on_complete ran first); nothing else to undo.
        pass
