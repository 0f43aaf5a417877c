"""The rendezvous port of a run is never one the kernel hands out for outgoing connections."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from worker.launcher import free_port

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE.exists(), reason="Linux only")
def test_the_port_lies_below_the_ephemeral_range_and_binds() -> None:
    low, high = (int(x) for x in RANGE.read_text().split())
    held = []
    try:
        for _ in range(20):
            port = free_port()
            assert port < low, f"{port} is in the ephemeral range {low}-{high}"
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", port))  # free when returned
            held.append(s)
        ports = [s.getsockname()[1] for s in held]
        assert len(set(ports)) == len(ports)  # a held port is never handed out again
    finally:
        for s in held:
            s.close()


@pytest.mark.skipif(not RANGE.exists(), reason="Linux only")
def test_outgoing_connections_never_take_it() -> None:
    low, _ = (int(x) for x in RANGE.read_text().split())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        clients = [socket.create_connection(server.getsockname()) for _ in range(50)]
        try:
            assert all(c.getsockname()[1] >= low for c in clients)  # what free_port avoids
        finally:
            for c in clients:
                c.close()
