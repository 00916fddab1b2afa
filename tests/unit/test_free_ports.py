"""Ports for servers the tests and `up` start: several picked at once are never the same one."""

import socket

import pytest

from swarmrl.infra.nats_server import free_ports
from tests.support.nats_cluster import NatsCluster


def test_ports_picked_together_are_distinct_and_free() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == 64
    for port in ports[:8]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nothing holds it any more


def test_a_clusters_nodes_get_nine_distinct_ports(tmp_path) -> None:
    cluster = NatsCluster(tmp_path)
    ports = [n.port for n in cluster.nodes] + cluster.monitor_ports
    ports += [
        int(a.rsplit(":", 1)[1]) for n in cluster.nodes for a in n.extra_args if a.startswith("nats://")
    ]
    assert len(set(ports)) == 9


def test_a_cluster_that_cannot_start_leaves_no_node_running(tmp_path) -> None:
    cluster = NatsCluster(tmp_path)
    with socket.socket() as taken:  # the third node's client port is someone else's
        taken.bind(("127.0.0.1", cluster.nodes[2].port))
        taken.listen()
        with pytest.raises(RuntimeError, match="nats-server exited"):
            cluster.start(timeout=20)
    assert all(node.proc is None or node.proc.poll() is not None for node in cluster.nodes)
