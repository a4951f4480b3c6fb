"""The frontend: speaks the Kafka wire protocol on TCP and forwards each request, as a
version-free protobuf message, to a handler over gRPC."""
