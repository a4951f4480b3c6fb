"""The handler: Kafka's request logic (KafkaApis) as a stateless gRPC service.

It validates each decoded Kafka request, routes partition work to the leader log nodes, parks
requests that must wait in the purgatory and builds the Kafka answer. Its only state is a cache
of cluster metadata fed by the replicator, so any handler can serve any request.
"""
