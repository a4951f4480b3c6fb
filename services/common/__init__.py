"""Code every service shares: gRPC server and channel set-up, configuration, Kafka error codes,
metrics and process life cycle. Nothing here knows any one service's domain."""
