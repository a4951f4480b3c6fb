"""kcat (Debian's package) against a real local cluster: produce with every codec, keys and
headers, consume back as JSON envelopes."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from .records import COMPRESSION_CODECS

KCAT = shutil.which("kcat")


def kcat(*args: str, stdin: str | None = None, timeout: float = 60) -> str:
    assert KCAT, "kcat is installed by `make test-deps`"
    done = subprocess.run([KCAT, *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("codec", COMPRESSION_CODECS)
def test_produce_and_consume_every_codec(cluster, topic_name, codec):
    bs = cluster.bootstrap
    lines = [f"key-{i}:{codec}-value-{i}" for i in range(100)]
    for partition in (0, 1, 2):
        # Topics are auto-created on first use with num.partitions=3.
        kcat("-b", bs, "-t", topic_name, "-P", "-z", codec, "-K", ":", "-p", str(partition),
             "-H", f"origin=kcat-{partition}", "-X", "topic.request.required.acks=1",
             stdin="\n".join(lines[partition::3]) + "\n")
    out = kcat("-b", bs, "-t", topic_name, "-C", "-o", "beginning", "-e", "-J", "-q")
    envelopes = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(envelopes) == len(lines)
    for partition in (0, 1, 2):
        mine = [e for e in envelopes if e["partition"] == partition]
        assert [e["offset"] for e in mine] == list(range(len(mine)))
        assert [f"{e['key']}:{e['payload']}" for e in mine] == lines[partition::3]
        assert all(e["headers"] == ["origin", f"kcat-{partition}"] for e in mine)


def test_metadata_listing(cluster, topic_name):
    kcat("-b", cluster.bootstrap, "-t", topic_name, "-P", stdin="x\n")
    meta = json.loads(kcat("-b", cluster.bootstrap, "-L", "-J", "-t", topic_name))
    assert sorted(b["id"] for b in meta["brokers"]) == [0, 1, 2]
    (topic,) = meta["topics"]
    assert topic["topic"] == topic_name and len(topic["partitions"]) == 3
