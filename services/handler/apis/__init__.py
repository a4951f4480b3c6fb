"""The Kafka APIs, one module per API family (as Kafka's ``KafkaApis`` handlers).

Each API takes its request as the generated message of ``kbroker.kafka.v1`` (version-free: the
frontend owns wire versions) and returns the response message, with the error codes Kafka's Java
broker would give. The work goes through the metadata cache and the interfaces of
``..collaborators``, whose requests and answers are the internal services' generated messages.
Nothing here knows about gRPC.
"""
