"""Loopback ports for the servers the tests and benchmarks start (pyrigaud, moto, nfs-ganesha,
sshd), handed out by one rule.

A port asked of the kernel with bind(0) lies in its ephemeral range, the range it also draws the
local port of every outgoing connection from. Between closing the probe and the server binding
the port, any connection the run makes (a gRPC channel, an S3 client, the simulator's) may take
it, and the server then fails with "Address already in use". So the port is drawn below that
range, where the kernel never hands out a local port, and never twice by one process."""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"
LOWEST = 20000  # well above the ports system services listen on
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, outside the kernel's ephemeral range, not handed out
    before by this process."""
    highest = _ephemeral_start() - 1
    if highest < LOWEST:
        raise AssertionError(f"the kernel's ephemeral ports start at {highest + 1}, below {LOWEST}")
    for _ in range(1000):
        port = random.randint(LOWEST, highest)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    raise AssertionError(f"no free loopback port between {LOWEST} and {highest}")


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
        return True
