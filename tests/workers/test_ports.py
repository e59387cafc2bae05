"""Rendezvous ports come from below the kernel's ephemeral range, where other processes' port-0
binds and outgoing connections cannot take them between the pick and the TCPStore's bind."""

import socket

import pytest

from fp8rl.workers import ports


def _range(tmp_path, monkeypatch, low: int, high: int = 60999) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(f"{low}\t{high}\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", path)


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range(tmp_path, monkeypatch):
    _range(tmp_path, monkeypatch, 32768)
    picked = ports.free_ports(4)
    assert len(set(picked)) == 4
    for port in picked:
        assert ports.LOW <= port < 32768
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_is_never_handed_out_twice_in_one_process(tmp_path, monkeypatch):
    _range(tmp_path, monkeypatch, ports.LOW + 1001)  # 1,001 candidates
    seen = [ports.free_port() for _ in range(50)]
    assert len(set(seen)) == 50


def test_a_port_taken_by_another_process_is_skipped(tmp_path, monkeypatch):
    _range(tmp_path, monkeypatch, ports.LOW + 1001)
    held = socket.socket()
    held.bind(("127.0.0.1", ports.LOW + 7))
    held.listen()
    draws = iter([ports.LOW + 7, ports.LOW + 9])
    monkeypatch.setattr(ports.random, "randint", lambda a, b: next(draws))
    monkeypatch.setattr(ports, "_given", set())
    try:
        assert ports.free_port() == ports.LOW + 9
    finally:
        held.close()


def test_a_node_without_room_below_the_ephemeral_range_gets_kernel_ports(tmp_path, monkeypatch):
    _range(tmp_path, monkeypatch, ports.LOW + 10)
    assert ports.free_port() >= ports.LOW + 10


def test_no_free_port_after_the_tries_is_an_error(tmp_path, monkeypatch):
    _range(tmp_path, monkeypatch, ports.LOW + 1001)
    monkeypatch.setattr(ports, "_given", set(range(ports.LOW, ports.LOW + 1001)))
    with pytest.raises(OSError, match="no free TCP port"):
        ports.free_port()
