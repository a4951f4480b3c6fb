"""Launchers starting clusters at the same time never hand out the same port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services import local_cluster, port_claims
from services.local_cluster import free_port

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.processes

# Each process picks ports one after another, as a launcher does for a cluster's services,
# without binding them (in this window no bound socket keeps another launcher away), and lives
# on until told to end, as a launcher does while its cluster runs: the claims of a process that
# ended lapse.
PICKER = """
import sys
from pathlib import Path
from services import port_claims
from services.local_cluster import free_port
port_claims.claims_file = lambda: Path(sys.argv[1])
print(" ".join(str(free_port()) for _ in range(int(sys.argv[2]))), flush=True)
sys.stdin.read()
"""


def pick_in_parallel(claims: Path, processes: int, each: int) -> list[list[int]]:
    procs = [subprocess.Popen([sys.executable, "-c", PICKER, str(claims), str(each)], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(processes)]
    try:
        picked = []
        for proc in procs:
            assert proc.stdout is not None
            picked.append([int(p) for p in proc.stdout.readline().split()])
    finally:
        for proc in procs:
            proc.communicate(input="", timeout=60)
    assert [proc.returncode for proc in procs] == [0] * processes
    return picked


def test_launchers_starting_at_once_pick_disjoint_ports(tmp_path: Path):
    # 4 x 300 picks from the 12,768 ports below the ephemeral range: without the claims, 50
    # ports were picked twice in one run.
    picked = pick_in_parallel(tmp_path / "claims.json", processes=4, each=300)
    every = [port for ports in picked for port in ports]
    assert len(every) == 1200
    assert len(set(every)) == len(every)


def test_ports_claimed_by_a_live_process_are_not_handed_out(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch):
    claims = tmp_path / "claims.json"
    monkeypatch.setattr(port_claims, "claims_file", lambda: claims)
    monkeypatch.setattr(local_cluster, "_ephemeral_range", lambda: (32768, 60999))
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as other:
        try:
            claims.write_text(json.dumps(
                {str(port): [other.pid, time.time()] for port in range(20000, 32768, 2)}))
            picked = [free_port() for _ in range(50)]
        finally:
            other.kill()
    assert all(port % 2 == 1 for port in picked), picked


def test_claims_lapse_with_their_process_or_their_age(tmp_path: Path):
    claims = tmp_path / "claims.json"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    old = time.time() - port_claims.CLAIM_SECONDS - 1
    claims.write_text(json.dumps({"21000": [dead.pid, time.time()], "21001": [os.getpid(), old],
                                  "21002": [os.getpid(), time.time()], "21003": "garbage",
                                  "21004": []}))
    with port_claims.claimed_ports(claims) as live:
        assert live.free([21000, 21001, 21003, 21004])
        assert not live.free([21002])
    assert list(json.loads(claims.read_text())) == ["21002"]
    claims.write_text("[1, 2]")  # not claims at all: none are kept
    with port_claims.claimed_ports(claims) as live:
        assert live.free([21002])
