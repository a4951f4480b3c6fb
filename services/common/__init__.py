"""Code every service shares: gRPC server and channel set-up, configuration, Kafka error codes,
metrics, process life cycle and the record batch codec (:mod:`.records`). Nothing here knows
any one service's domain."""
