"""The Kafka wire protocol at the frontend of a real cluster: pipelining and bad input."""

from __future__ import annotations

import socket

from kio.schema.metadata.v12.request import MetadataRequest

from .wire import encode_request, read_response


def connect(cluster) -> socket.socket:
    host, port = cluster.bootstrap.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def test_pipelined_requests_are_answered_in_order(cluster):
    request = MetadataRequest(topics=None, allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False)
    with connect(cluster) as sock:
        sock.sendall(b"".join(encode_request(request, cid) for cid in range(100, 160)))
        ids = [read_response(sock, MetadataRequest)[0] for _ in range(60)]
    assert ids == list(range(100, 160))


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_garbage_closes_only_that_connection(cluster):
    request = MetadataRequest(topics=None, allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False)
    full = encode_request(request, 1)
    body = full[4:]
    cut = body[: len(body) - 4]
    garbage = [
        b"\x7f\xff\xff\xff",  # absurd frame length
        b"\xff\xff\xff\xf0",  # negative frame length
        b"\x00\x00\x00\x08\x03\xe7\x00\x00\x00\x00\x00\x01",  # unknown API key 999
        len(cut).to_bytes(4, "big") + cut,  # a complete frame holding a truncated body
        full[:20],  # a frame cut off mid-way, then the client stops sending
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    with connect(cluster) as healthy:
        for i, junk in enumerate(garbage):
            with connect(cluster) as bad:
                bad.sendall(junk)
                if i == 4:
                    bad.shutdown(socket.SHUT_WR)
                assert closed_by_peer(bad), f"case {i} left the connection open"
            healthy.sendall(encode_request(request, 1000 + i))
            assert read_response(healthy, MetadataRequest)[0] == 1000 + i
