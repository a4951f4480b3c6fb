"""The purgatory service: requests that must wait for a condition or a timeout (Kafka's
DelayedOperationPurgatory), parked over gRPC by handlers and completed by progress reports.

Layers: ``timer`` (run a task after a delay), ``delayed_operation`` (the exactly-once contract),
``delayed_operation_purgatory`` (operations watched by key), ``key_states`` (the last reported
state of each key), ``delayed_await`` (the operation behind the Await RPC), ``purgatories`` (one
purgatory per operation kind, the service's domain facade); ``servicer``/``server`` are the gRPC
glue.
"""
