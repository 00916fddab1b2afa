"""Hosts as network namespaces (`tests/support/netns.py`): their own addresses, their own directories,
and the faults between them (a cut, loss, the delaying relay). Skipped where namespaces cannot be made."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.netns import Hosts, unavailable

ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 7000)); s.listen()
while True:
    c, _ = s.accept()
    while data := c.recv(1024):
        c.sendall(data)
    c.close()
"""
PING = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 7000), timeout=3)
times = []
for _ in range(int(sys.argv[2])):
    t = time.monotonic(); c.sendall(b"x"); c.recv(1); times.append((time.monotonic() - t) * 1000)
print(min(times))
"""


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    if reason := unavailable(need_nft=True):
        pytest.skip(reason)
    with Hosts(["a", "b"], tmp_path / "hosts", shaped=[("a", "b")]) as hosts:
        hosts.popen("b", [sys.executable, "-c", ECHO, hosts.hosts["b"].addr])
        yield hosts


def ping(hosts: Hosts, n: int = 3) -> subprocess.CompletedProcess[str]:
    cmd = hosts.argv("a", [sys.executable, "-c", PING, hosts.hosts["b"].addr, str(n)])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def reachable(hosts: Hosts) -> bool:
    for _ in range(50):  # the echo server may still be starting
        if ping(hosts).returncode == 0:
            return True
    return False


@pytest.mark.timeout(120)
def test_hosts_talk_over_their_addresses_and_cut_heal_and_delay_apply(hosts: Hosts) -> None:
    a, b = hosts.hosts["a"], hosts.hosts["b"]
    assert a.addr != b.addr and a.addr.rsplit(".", 1)[0] == hosts.operator_addr.rsplit(".", 1)[0]
    assert reachable(hosts)
    hosts.cut("a")
    assert ping(hosts).returncode != 0  # nothing gets through, either way
    hosts.heal()
    assert (done := ping(hosts)).returncode == 0, done
    hosts.delay("a", "b", 100, 50)  # each way: a round trip is held at least 2 x 50 ms
    assert (done := ping(hosts)).returncode == 0 and float(done.stdout) >= 100.0, done
    hosts.delay("a", "b", 0)
    hosts.loss("a", "b", 100)  # every packet dropped: nothing gets through
    assert ping(hosts).returncode != 0
    hosts.loss("a", "b", 0)
    assert (done := ping(hosts)).returncode == 0, done
    with pytest.raises(ValueError, match="integer"):
        hosts.loss("a", "b", 2.5)


def test_a_host_sees_its_own_directory_and_not_the_others(hosts: Hosts) -> None:
    (hosts.hosts["b"].dir / "secret").write_text("b's")
    (hosts.hosts["a"].dir / "mine").write_text("a's")
    look = "import pathlib, sys; print(sorted(p.name for p in pathlib.Path(sys.argv[1]).iterdir()))"
    for d, expect in ((hosts.hosts["b"].dir, "[]"), (hosts.hosts["a"].dir, "['mine']")):
        out = subprocess.run(
            hosts.argv("a", [sys.executable, "-c", look, str(d)]), capture_output=True, text=True
        )
        assert out.stdout.strip() == expect, out
    assert (hosts.hosts["b"].dir / "secret").read_text() == "b's"  # hidden there, untouched here
