"""TCP ports for a rendezvous that other processes on the node will not take in the meantime.

A port found free by binding port 0 comes from the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default). Every other process's
port-0 bind and outgoing connection draws from that range too. Between the pick and the moment
the process group's TCPStore binds the port, another process can take it. CI saw this on
2026-12-05: a trainer rank's TCPStore failed with EADDRINUSE, and the other rank had connected to
a Ray worker's gRPC server on that port ("Ping failed ... Got: 68681728", the bytes of an HTTP/2
SETTINGS frame).

So ports are drawn at random from between Ray's worker ports (``min_worker_port`` /
``max_worker_port``, 10002-19999 by default) and the ephemeral range, and each is checked by
binding it. Nothing binds there unasked; the other fp8rl picks are kept apart by the randomness
and by never handing out a port twice in one process. Stdlib only: the API server imports it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOW = 20000
"""Lowest port drawn: above Ray's default worker ports (10002-19999)."""
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_given: set[int] = set()


def _ceiling() -> int:
    """One below the kernel's ephemeral range (32767 when the range cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0]) - 1
    except (OSError, ValueError, IndexError):
        return 32767


def free_ports(count: int = 1, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports, each bindable on ``host`` right now (all held open while
    choosing), outside the ephemeral range where the node's other processes get their ports.

    Falls back to kernel-chosen (ephemeral) ports when the range below the ephemeral one has
    fewer than 1,000 ports (a node configured so).

    Args:
        count: how many ports (≥ 1).
        host: the address to bind: ``127.0.0.1`` for a local rendezvous, ``""`` for all
            interfaces (a group across nodes).
    Raises:
        OSError: no free port found after 200 tries per port.
    """
    top = _ceiling()
    socks: list[socket.socket] = []
    try:
        while len(socks) < count:
            sock = socket.socket()
            socks.append(sock)
            if top - LOW < 1000:
                sock.bind((host, 0))
                continue
            for _ in range(200):
                port = random.randint(LOW, top)
                if port in _given:
                    continue
                try:
                    sock.bind((host, port))
                    break
                except OSError:
                    continue
            else:
                raise OSError(f"no free TCP port in {LOW}-{top} after 200 tries")
        ports = [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    _given.update(ports)
    return ports


def free_port(host: str = "127.0.0.1") -> int:
    """One port of ``free_ports`` (a process group's rendezvous)."""
    return free_ports(1, host)[0]
