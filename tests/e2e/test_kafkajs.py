"""kafkajs (node) against a real local cluster: create a topic and produce with every codec
(none, gzip, snappy, lz4, zstd), with keys, headers and timestamps; everything is read back
exactly, in order per partition."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from .records import Message, assert_same
from .test_confluent_kafka import consume_all

JS_DIR = Path(__file__).resolve().parent.parent / "clients" / "js"


def test_kafkajs_produce_every_codec(cluster, topic_name):
    node = shutil.which("node")
    assert node, "node is required for the kafkajs tests"
    done = subprocess.run(
        [node, "produce.js", cluster.bootstrap, topic_name, "3", "60", "none", "gzip", "snappy", "lz4",
         "zstd"],
        cwd=JS_DIR, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KAFKAJS_NO_PARTITIONER_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["created"] is True
    sent = [Message(m["partition"], m["key"].encode(), m["value"].encode(),
                    (("origin", m["headers"]["origin"].encode()),), m["timestamp"])
            for m in report["sent"]]
    assert_same(sent, consume_all(cluster.bootstrap, topic_name, len(sent)))
