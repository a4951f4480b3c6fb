"""The Kafka APIs, one module per API family (as Kafka's ``KafkaApis`` handlers).

Each module takes a version-free domain request, does the work through the collaborator
interfaces (``..collaborators``) and the metadata cache, and returns a domain response with
the error codes Kafka's Java broker would give. Nothing here knows about gRPC or protobuf.
"""
