"""The purgatory service: requests that must wait for a condition or a timeout (Kafka's
DelayedOperationPurgatory), parked over gRPC by handlers and completed by progress reports.

Layers: the timer (``timer`` over a hierarchical ``timing_wheel`` of buckets holding tasks,
both in ``timer_task``, ordered in a ``delay_queue``), ``delayed_operation`` (the
exactly-once contract), ``delayed_operation_purgatory`` (operations watched by key, with the
periodic purge), ``key_states`` (the last reported state of each key), ``delayed_await`` (the
operation behind the Await RPC) and its kinds ``delayed_fetch`` and ``delayed_produce``,
``purgatories`` (one purgatory per operation kind, the service's domain facade);
``servicer``/``server`` are the gRPC glue.
"""
