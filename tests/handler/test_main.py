
"""``python -m services.handler``: configuration from flags and environment, serving, and a
clean stop on SIGTERM."""

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.common.config import load
from services.handler.config import HandlerConfig

ROOT = Path(__file__).resolve().parents[2]


def test_config_defaults_flags_and_environment():
    config = load(HandlerConfig, [], env={})
    assert config == HandlerConfig()
    assert (config.grpc_address, config.replicator_address, config.purgatory_address) == (
        "127.0.0.1:19100", "127.0.0.1:19400", "127.0.0.1:19300")
    assert (config.metrics_port, config.auto_create_topics_enable) == (0, True)
    assert (config.advertised, config.instance) == ("127.0.0.1:9092", "handler-0")
    config = load(HandlerConfig, ["--auto-create-topics-enable", "false", "--instance", "h7"],
                  env={"KBROKER_ADVERTISED": "kafka:19092"})
    assert (config.auto_create_topics_enable, config.instance, config.advertised) == (
        False, "h7", "kafka:19092")


@pytest.mark.processes
def test_the_process_serves_until_sigterm():
    env = dict(os.environ, KBROKER_LOG_LEVEL="INFO")
    process = subprocess.Popen(
        [sys.executable, "-m", "services.handler", "--grpc-address", "127.0.0.1:0",
         "--replicator-address", "127.0.0.1:1", "--purgatory-address", "127.0.0.1:1"],
        cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 20
        lines = []
        while time.monotonic() < deadline:
            ready, _, _ = select.select([process.stderr], [], [], 0.5)
            if ready:
                line = process.stderr.readline()
                lines.append(line)
                if "serving on port" in line:
                    break
            assert process.poll() is None, "".join(lines)
        else:
            raise AssertionError("the handler never said it was serving: " + "".join(lines))
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()
