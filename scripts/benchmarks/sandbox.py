"""Sandbox start and op costs against bubblewrap, and the loopback options (run as root).

- sandbox_cold: provision, READY, one `true` op, teardown, through the
  starter API (the long-lived steward's path; the shipped launcher is built
  once per process, so that build is outside the loop).
- sandbox_hot: one more `true` op in an already READY sandbox.
- network_index_cold: sandbox_cold for a sandbox with the index network (the
  resolver and fetch of a network index: the steward's forwarder listening in
  its own namespace, started at READY and stopped at teardown), against
  sandbox_cold with loopback only, in the same run. It replaces
  network_host_cold, the cost of the host-network sandbox it replaced.
- network_veth_ms: an option not taken for those sandboxes, their namespace
  wired to the host: pyroute2 from the long-lived side creating a veth pair,
  moving one end in, addressing and raising both, and deleting it again;
  against a loopback-only sandbox_cold of the same run.
- loopback_up_ms: raising lo with the launcher's SIOCSIFFLAGS ioctl inside
  the new namespace, against pyroute2 driving the namespace from the
  long-lived side (pyroute2 already imported; its import is reported in the
  anchor's name).

The anchor for the first two is the same bwrap run, measured in this run.
The dedicated ids come from CASEBOX_TEST_UID/CASEBOX_TEST_GID when set, else
the configured defaults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time

from timing import median_seconds, run_quietly

from executor.cli import config as configuration
from launcher import network
from launcher import syscalls as sc
from steward import provision
from steward.ledger import RecordingLedger
from steward.api import INDEX_NETWORK
from steward.forwarder import Destinations
from steward.starter import Sandbox, Spec

BWRAP = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/", "/", "--proc", "/proc",
         "--dev", "/dev", "true"]
BWRAP_NAME = "bwrap --unshare-all --die-with-parent --new-session --ro-bind / / --proc /proc --dev /dev true"
TRUE = ["/usr/bin/true"]


def _spec() -> Spec:
    defaults = configuration.load()
    uid = int(os.environ.get("CASEBOX_TEST_UID", defaults.sandbox_uid))
    gid = int(os.environ.get("CASEBOX_TEST_GID", os.environ.get("CASEBOX_TEST_UID", defaults.sandbox_gid)))
    return Spec(uid, gid)


def _true(sandbox: Sandbox) -> None:
    result = sandbox.run(TRUE, env={}, timeout_ms=10_000, stdout_cap=1024, stderr_cap=1024)
    if result.wait_status != 0:
        raise SystemExit(f"sandbox benchmark: true ended with wait status {result.wait_status:#x}")


def bwrap_ms() -> float:
    return median_seconds(lambda: run_quietly(BWRAP), repeat=30, warmup=3) * 1000


def _cold_ms(spec: Spec) -> float:
    provision.shipped()
    with tempfile.TemporaryDirectory(prefix="casebox-bench-") as state_root:

        def cold() -> None:
            with Sandbox.start(spec, ledger=RecordingLedger(), state_root=state_root) as sandbox:
                _true(sandbox)

        return median_seconds(cold, repeat=15, warmup=2) * 1000


def sandbox_cold() -> dict:
    return {"metric": "sandbox_cold", "value": round(_cold_ms(_spec()), 2), "unit": "ms", "anchor": BWRAP_NAME,
            "anchor_value": round(bwrap_ms(), 2)}


def network_index_cold() -> dict:
    """Cold starts of the two kinds alternate, so a busy host slows both alike."""
    index = dataclasses.replace(_spec(), network=INDEX_NETWORK, destinations=Destinations.of("http://127.0.0.1:9/simple/"))
    provision.shipped()
    samples: dict[str, list[float]] = {"index": [], "loopback": []}
    with tempfile.TemporaryDirectory(prefix="casebox-bench-") as state_root:
        for round_ in range(2 + 15):
            for kind, spec in (("index", index), ("loopback", _spec())):
                start = time.perf_counter()
                with Sandbox.start(spec, ledger=RecordingLedger(), state_root=state_root) as sandbox:
                    _true(sandbox)
                if round_ >= 2:
                    samples[kind].append(time.perf_counter() - start)
    value, anchor = (statistics.median(samples[kind]) * 1000 for kind in ("index", "loopback"))
    return {"metric": "network_index_cold", "value": round(value, 2), "unit": "ms",
            "anchor": "sandbox_cold (own network namespace, loopback only), alternating", "anchor_value": round(anchor, 2)}


@contextlib.contextmanager
def _namespace_holder():
    """The pid of a child sleeping in a new network namespace, killed and reaped on exit."""
    holder = sc.clone(sc.CLONE_NEWNET)
    if holder == 0:
        time.sleep(60)
        os._exit(0)
    try:
        yield holder
    finally:
        os.kill(holder, 9)
        os.waitpid(holder, 0)


def network_veth_ms() -> dict:
    import pyroute2

    with _namespace_holder() as holder:

        def wire() -> None:
            with pyroute2.IPRoute() as host:
                host.link("add", ifname="cbx-host", kind="veth", peer="cbx-sandbox")
                try:
                    inner = host.link_lookup(ifname="cbx-sandbox")[0]
                    host.link("set", index=inner, net_ns_fd=f"/proc/{holder}/ns/net")
                    outer = host.link_lookup(ifname="cbx-host")[0]
                    host.addr("add", index=outer, address="169.254.77.1", prefixlen=30)
                    host.link("set", index=outer, state="up")
                    with pyroute2.IPRoute(netns=f"/proc/{holder}/ns/net") as sandbox:
                        index = sandbox.link_lookup(ifname="cbx-sandbox")[0]
                        sandbox.addr("add", index=index, address="169.254.77.2", prefixlen=30)
                        sandbox.link("set", index=index, state="up")
                finally:
                    host.link("del", ifname="cbx-host")

        value = median_seconds(wire, repeat=15, warmup=2) * 1000
    return {"metric": "network_veth_ms", "value": round(value, 2), "unit": "ms",
            "anchor": "sandbox_cold (own network namespace, loopback only)", "anchor_value": round(_cold_ms(_spec()), 2)}


def sandbox_hot() -> dict:
    with tempfile.TemporaryDirectory(prefix="casebox-bench-") as state_root:
        with Sandbox.start(_spec(), ledger=RecordingLedger(), state_root=state_root) as sandbox:
            value = median_seconds(lambda: _true(sandbox), repeat=50, warmup=5) * 1000
    return {"metric": "sandbox_hot", "value": round(value, 2), "unit": "ms", "anchor": BWRAP_NAME,
            "anchor_value": round(bwrap_ms(), 2)}


def _ioctl_in_new_namespace() -> float:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        sc.unshare(sc.CLONE_NEWNET)
        start = time.perf_counter()
        network.loopback_up()
        os.write(write_end, repr(time.perf_counter() - start).encode())
        os._exit(0)
    os.close(write_end)
    elapsed = float(os.read(read_end, 64))
    os.close(read_end)
    os.waitpid(pid, 0)
    return elapsed


def _pyroute2_import_ms() -> float:
    code = "import time; t = time.perf_counter(); import pyroute2; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout) * 1000


def loopback_up_ms() -> dict:
    import pyroute2

    with _namespace_holder() as holder:

        def with_pyroute2() -> None:
            with pyroute2.IPRoute(netns=f"/proc/{holder}/ns/net") as ipr:
                ipr.link("set", index=1, state="up")

        anchor = median_seconds(with_pyroute2, repeat=15, warmup=2) * 1000
    samples = sorted(_ioctl_in_new_namespace() for _ in range(15))
    return {
        "metric": "loopback_up_ms",
        "value": round(samples[len(samples) // 2] * 1000, 3),
        "unit": "ms",
        "anchor": f"pyroute2 IPRoute(netns).link set lo up from the long-lived side (plus a one-off import of {_pyroute2_import_ms():.0f} ms)",
        "anchor_value": round(anchor, 3),
    }


METRICS = {
    "sandbox_cold": sandbox_cold,
    "sandbox_hot": sandbox_hot,
    "loopback_up_ms": loopback_up_ms,
    "network_index_cold": network_index_cold,
    "network_veth_ms": network_veth_ms,
}
