"""The gRPC contracts: the Kafka message contract and the handler service are current with kio
and the frontend's API table, and every contract is compiled into the stubs the services
import."""

from __future__ import annotations

import importlib
import runpy
from pathlib import Path

from kbroker.handler.v1 import kafka_handler_pb2
from kbroker.kafka.v1 import kafka_pb2
from services.frontend.api_versions import SUPPORTED_APIS

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("kbroker/kafka/v1/kafka.proto", "kbroker/handler/v1/kafka_handler.proto")


def test_generated_contracts_are_current():
    generator = runpy.run_path(str(ROOT / "tools" / "gen_kafka_proto.py"))
    for name, generated in zip(GENERATED, generator["build"](), strict=True):
        committed = (ROOT / "proto" / name).read_text()
        assert generated == committed, f"{name} is stale: run `make proto` and commit it"


def test_every_contract_compiles_to_importable_stubs():
    protos = sorted((ROOT / "proto" / "kbroker").rglob("*.proto"))
    assert len(protos) == 7
    for proto in protos:
        rel = proto.relative_to(ROOT / "proto").with_suffix("")
        module = importlib.import_module(".".join(rel.parts) + "_pb2")
        assert module.DESCRIPTOR.name == str(rel) + ".proto"


def test_the_handler_serves_one_rpc_per_forwarded_api():
    service = kafka_handler_pb2.DESCRIPTOR.services_by_name["KafkaHandler"]
    rpcs = {m.name for m in service.methods}
    assert rpcs == {api.name for api in SUPPORTED_APIS.values() if api.forwarded}
    for method in service.methods:
        assert method.input_type.name == method.name + "Request"
        assert method.output_type.name == method.name + "Response"


def test_every_supported_api_has_its_messages():
    for api in SUPPORTED_APIS.values():
        assert hasattr(kafka_pb2, api.name + "Request")
        assert hasattr(kafka_pb2, api.name + "Response")


def test_unset_fields_read_as_kafkas_defaults():
    request = kafka_pb2.FetchRequest(topics=[{"partitions": [{"partition": 0}]}])
    assert (request.replica_id, request.max_bytes, request.session_epoch) == (-1, 2**31 - 1, -1)
    assert request.topics[0].partitions[0].current_leader_epoch == -1
    assert not request.HasField("replica_id")
    metadata = kafka_pb2.MetadataRequest()
    assert metadata.allow_auto_topic_creation is True
