"""Verifier tests that meet the sandbox's limits (examples/plan.json: timeout, output-cap, network-denied)."""

import errno
import os
import socket
import time

import pytest

# Addresses reserved for documentation (RFC 5737, RFC 3849): nothing answers there.
TEST_NET_IPV4 = ("192.0.2.1", 9)
TEST_NET_IPV6 = ("2001:db8::1", 9)
FLOOD_BYTES = 4 << 20


def test_sleeps_forever():
    """Designed to hit the case's timeout_ms: UNVERIFIED (timeout), never a PASS."""
    while True:
        time.sleep(60)


def test_floods_stdout():
    """Designed to write 4 MiB, far past the launcher's per-stream output cap: UNVERIFIED (output).

    The case runs pytest with -s so the bytes reach the sandbox's stdout pipe
    instead of pytest's capture file.
    """
    chunk = b"casebox output cap " * 3449 + b"\n"
    written = 0
    while written < FLOOD_BYTES:
        written += os.write(1, chunk)


@pytest.mark.parametrize("family, address", [(socket.AF_INET, TEST_NET_IPV4), (socket.AF_INET6, TEST_NET_IPV6)])
def test_network_is_unreachable(family, address):
    """Designed to PASS inside the sandbox, which has loopback only, and to FAIL on a host with a route out.

    A UDP connect() only looks up a route; it sends no packet, so the test
    probes the network without sending traffic anywhere.
    """
    with pytest.raises(OSError) as refused:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
    assert refused.value.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
