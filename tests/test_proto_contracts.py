"""The gRPC contracts: the Kafka message contract is current with kio, and every contract is
compiled into the stubs the services import."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_kafka_messages_are_generated_from_the_pinned_kio(tmp_path):
    out = tmp_path / "kafka.proto"
    subprocess.run([sys.executable, str(ROOT / "tools" / "gen_kafka_proto.py"), str(out)],
                   check=True, cwd=ROOT)
    committed = (ROOT / "proto" / "kbroker" / "kafka" / "v1" / "kafka.proto").read_text()
    assert out.read_text() == committed, "run `make proto` and commit the result"


def test_every_contract_compiles_to_importable_stubs():
    protos = sorted((ROOT / "proto" / "kbroker").rglob("*.proto"))
    assert len(protos) == 6
    for proto in protos:
        rel = proto.relative_to(ROOT / "proto").with_suffix("")
        module = importlib.import_module(".".join(rel.parts) + "_pb2")
        assert module.DESCRIPTOR.name == str(rel) + ".proto"


def test_handler_serves_one_rpc_per_kafka_api():
    from kbroker.handler.v1 import handler_pb2

    service = handler_pb2.DESCRIPTOR.services_by_name["KafkaHandler"]
    for method in service.methods:
        assert method.input_type.name == method.name + "Request"
        assert method.output_type.name == method.name + "Response"


def test_the_frontend_routes_every_supported_api_to_a_handler_rpc_and_back():
    from kbroker.handler.v1 import handler_pb2
    from services.frontend.api_versions import SUPPORTED_APIS

    rpcs = {m.name for m in handler_pb2.DESCRIPTOR.services_by_name["KafkaHandler"].methods}
    routed = {api.rpc for api in SUPPORTED_APIS.values() if api.rpc is not None}
    assert routed == rpcs
    for api in SUPPORTED_APIS.values():
        if api.rpc is not None:
            assert api.rpc == api.name
