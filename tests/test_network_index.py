"""casebox verify --index URL (docs/pipeline.md, "A network index"): pip's resolver and the fetch over HTTP
through the forwarder, the preparer's index-network sandboxes, a real sandbox with the index network, and end
to end as root against a PEP 503 index served on loopback, with a listener on another loopback port standing in
for a metadata service that must never be reached (issue 16)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import secrets
import shutil
import socket

import pytest
from evidence_support import DESIGNED_STATUS
from index_support import IndexServer, Listener, build_simple
from pipeline_support import BINDING, RUNTIME, FakeSession, outcome
from plan_support import case as case_doc
from test_forwarder import forwarding
from test_resolver import failure, leaves
from sandbox_support import mount_table, processes_of, start_with_launcher_without
from test_verify import EXAMPLES, packed, scratch_dirs, table, value
from wheelforge import wheel

from executor import inside
from executor.transport import pack
from executor.environ import SANDBOX_ENV
from executor.cases.ownership import CASE_SERVICE, Gate, OwnershipError
from executor.deps.preparer import PIP_ENV, Dependencies, Preparer
from executor.deps.protocol import Pin, acks_bytes, leaf
from executor.scratch import Scratch
from journal.errors import Refused
from journal.files import JOURNAL_NAME
from journal.format import Kind, networked_op
from journal.reader import read_journal
from steward.api import INDEX_NETWORK, LOOPBACK
from steward.forwarder import PROXY_URL, Destinations, check_index_url

TOKEN = "ghp_casebox_must_never_send_this_0123456789"


# --- the URL rule (pure) ------------------------------------------------------------------------------


def test_a_plain_url_is_normalized_to_end_with_a_slash():
    assert check_index_url("HTTP://127.0.0.1:8080/simple", "--index") == "http://127.0.0.1:8080/simple/"
    assert check_index_url("https://pypi.org/simple/", "--index") == "https://pypi.org/simple/"


@pytest.mark.parametrize("url", ["http://user@host/simple/", "http://host/simple/?a=1", "gopher://host/", "http://[::1/"])
def test_anything_but_a_plain_url_is_refused(url):
    """No token can ride in the URL: user information, a query, another scheme are refused (exit 64)."""
    with pytest.raises(Refused, match="--index"):
        check_index_url(url, "--index")


# --- pip's resolver over HTTP through the forwarder, and the fetch of the ACKed pins ------------------------


@pytest.fixture
def served(tmp_path):
    """A candidate needing lib, and a find-links directory holding lib 1.0, 2.0 and base; the server is started
    by the test once it has laid out the pages it wants."""
    candidate, source = tmp_path / "candidate", tmp_path / "wheels"
    wheel(candidate, "demo-app", "1.0", "lib")
    wheel(source, "lib", "1.0")
    wheel(source, "lib", "2.0", "base")
    wheel(source, "base", "1.0")
    return candidate, source, tmp_path


def test_pip_s_resolver_pins_from_a_simple_index_through_the_forwarder_with_the_hash_of_each_file(served):
    """Step 4 over HTTP, through the forwarder as in the sandbox: highest version, its own requirements, each
    PIN's sha256 and URL those of the file pip chose; a yanked newer one and one whose page excludes this Python
    are never pinned. The forwarder refused nothing."""
    candidate, source, base = served
    wheel(source, "lib", "9.0")
    wheel(source, "lib", "3.0")
    web = build_simple(source, base / "web")
    page = web / "simple" / "lib" / "index.html"
    html = page.read_text().replace('lib-9.0-py3-none-any.whl#', 'lib-9.0-py3-none-any.whl" data-yanked="" x="#')
    page.write_text(html.replace('<a href="../../files/lib-3.0', '<a data-requires-python="&lt;3" href="../../files/lib-3.0'))
    with IndexServer(web) as server, forwarding(Destinations.of(server.url)) as (proxy, logged):
        found = leaves(base, candidate, server.url, proxy=proxy)
    chosen = {leaf_["name"]: (leaf_["version"], leaf_["sha256"], leaf_["url"]) for leaf_ in found if leaf_["leaf"] == "PIN"}
    assert {name: version for name, (version, _, _) in chosen.items()} == {"lib": "2.0", "base": "1.0"}
    for name, (version, digest, url) in chosen.items():
        file = f"{name}-{version}-py3-none-any.whl"
        assert digest == hashlib.sha256((source / file).read_bytes()).hexdigest()
        assert url.startswith(server.url.rsplit("/simple/", 1)[0] + "/files/" + file)
    assert logged == []


def test_a_file_the_index_links_on_another_loopback_port_is_never_fetched(served):
    """S9: an index page linking a wheel on another port of loopback (a metadata service stands in): pip asks
    the forwarder for it, the forwarder refuses before connecting and logs it, and the listener sees nothing."""
    candidate, source, base = served
    with Listener() as trap:
        digest = hashlib.sha256(b"never served").hexdigest()
        web = build_simple(source, base / "web", extra_links={
            "lib": [f'<a href="http://127.0.0.1:{trap.port}/files/lib-7.0-py3-none-any.whl#sha256={digest}">lib-7.0</a>'],
        })
        with IndexServer(web) as server, forwarding(Destinations.of(server.url)) as (proxy, logged):
            found = leaves(base, candidate, server.url, proxy=proxy)
    reason, detail = failure(found)
    assert reason == "index" and f"casebox forwarder: 127.0.0.1:{trap.port} is neither the index" in detail, detail
    assert trap.connections == 0
    assert any(f"127.0.0.1:{trap.port} is neither the index nor an allowed file host" in line for line in logged), logged


def test_a_redirect_the_index_sends_to_another_loopback_port_is_never_followed(served):
    """S9: the index answering a project page with a redirect to another loopback port: pip follows it to the
    forwarder, which refuses it; the listener sees nothing, and the resolution fails with the forwarder's
    sentence (index), read from pip's log."""
    candidate, source, base = served
    with Listener() as trap:
        web = build_simple(source, base / "web")
        moved = {"/simple/lib/": f"http://127.0.0.1:{trap.port}/simple/lib/"}
        with IndexServer(web, redirects=moved) as server, forwarding(Destinations.of(server.url)) as (proxy, logged):
            found = leaves(base, candidate, server.url, proxy=proxy)
    reason, detail = failure(found)
    assert reason == "index" and f"casebox forwarder: 127.0.0.1:{trap.port} is neither the index" in detail
    assert trap.connections == 0 and any(f"127.0.0.1:{trap.port} is neither" in line for line in logged), logged


def test_a_dependency_from_the_index_that_requires_a_direct_url_is_refused_before_pip_opens_it(served):
    """Issue 16, 1: a wheel of the index requiring ``x @ http://127.0.0.1:PORT/x.whl`` is refused inside pip as
    pip makes that requirement (direct_url, naming the project), with no forwarder at all: the listener on PORT
    sees no connection."""
    candidate, source, base = served
    with Listener() as trap:
        wheel(source, "lib", "5.0", f"x @ http://127.0.0.1:{trap.port}/x-1.0-py3-none-any.whl")
        with IndexServer(build_simple(source, base / "web")) as server:
            found = leaves(base, candidate, server.url)
    assert failure(found) == ("direct_url", "lib requires x from a direct URL") and trap.connections == 0


def test_bytes_that_differ_from_the_hash_the_page_states_fail_the_resolution(served):
    """index_hash: the index served a file whose sha256 is not the one its page states."""
    candidate, source, base = served
    web = build_simple(source, base / "web", stated={"lib-2.0-py3-none-any.whl": "0" * 64})
    with IndexServer(web) as server, forwarding(Destinations.of(server.url)) as (proxy, _):
        found = leaves(base, candidate, server.url, proxy=proxy)
    assert found[-1]["leaf"] == "FAIL" and found[-1]["reason"] == "index_hash"


def test_an_unreachable_index_fails_the_resolution(served):
    """index: an index that does not answer is a FAIL with a reason, never an empty resolution."""
    candidate, source, base = served
    web = build_simple(source, base / "web")
    with IndexServer(web) as server:
        url = server.url
    with forwarding(Destinations.of(url)) as (proxy, _):
        found = leaves(base, candidate, url, proxy=proxy)
    reason, detail = failure(found)
    assert reason == "index", detail


def fetch(tmp_path, url: str, chosen: list[Pin], proxy: str) -> tuple[int, pathlib.Path]:
    """The fetch tool (executor/inside.py) over HTTP: exactly the ACKed pins into a directory of its own."""
    acks, target = tmp_path / "pins.json", tmp_path / "deps"
    tmp_path.mkdir()
    acks.write_bytes(acks_bytes(chosen))
    target.mkdir()
    installer = str(EXAMPLES / "index" / "pip-24.2-py3-none-any.whl")
    return inside.main(["fetch", str(acks), str(target), url, installer, proxy]), target


def test_the_fetch_downloads_exactly_the_acked_pins_through_the_forwarder_and_checks_each_hash(served):
    """Step 4: the fetch takes each ACKed pin from the URL pip named, through the forwarder, hashing as it
    writes; a file with other bytes than ACKed is refused and removed (index_hash), so nothing unACKed is ever
    sealed; a pin on another loopback port is refused by the forwarder and its listener sees nothing."""
    _, source, base = served
    web = build_simple(source, base / "web")
    with IndexServer(web) as server, Listener() as trap, forwarding(Destinations.of(server.url)) as (proxy, logged):
        root = server.url.rsplit("/simple/", 1)[0]
        good = [Pin(1, "candidate", name, "1.0", f"{name}-1.0-py3-none-any.whl",
                    hashlib.sha256((source / f"{name}-1.0-py3-none-any.whl").read_bytes()).hexdigest(), f"{root}/files/{name}-1.0-py3-none-any.whl")
                for name in ("lib", "base")]
        code, target = fetch(base / "good", server.url, good, proxy)
        assert code == 0 and sorted(path.name for path in target.iterdir()) == ["base-1.0-py3-none-any.whl", "lib-1.0-py3-none-any.whl"]
        forged = [dataclasses.replace(good[0], sha256="0" * 64)]
        code, target = fetch(base / "forged", server.url, forged, proxy)
        assert code == 1 and list(target.iterdir()) == []
        elsewhere = [dataclasses.replace(good[0], url=f"http://127.0.0.1:{trap.port}/files/{good[0].file}")]
        code, target = fetch(base / "elsewhere", server.url, elsewhere, proxy)
        assert code == 1 and list(target.iterdir()) == []
    assert trap.connections == 0 and len(logged) == 1
    assert all(headers.get("User-Agent", "").startswith("casebox-fetch") for path, headers in server.requests)


# --- the preparer: which sandboxes get the index network, and with what -------------------------------------


LIB = "lib-1.0-py3-none-any.whl"
LIB_SHA = hashlib.sha256(b"lib wheel bytes").hexdigest()
ANSWER = (
    leaf("BEGIN", 0, protocol="casebox.resolver.v2", python="3.11.2", candidate=[{"name": "demo-app", "version": "1.0", "modules": ["demo_app"]}])
    + leaf("PIN", 1, tree="candidate", name="lib", version="1.0", file=LIB, sha256=LIB_SHA, url=f"http://127.0.0.1:8080/files/{LIB}")
    + leaf("END", 2, pins=1)
)


def test_only_the_resolve_and_fetch_sandboxes_get_the_index_network_and_never_the_callers_environment(tmp_path, monkeypatch):
    """Issue 7, 16: the resolver and fetch of a network index are the only sandboxes with network, the index
    network to exactly that index, which both tools name as their proxy; no token (nor a proxy, a PIP_* setting
    or a home with a .netrc) set in the parent passes into them."""
    for name, given in {"GITHUB_TOKEN": TOKEN, "PIP_INDEX_URL": f"http://x:{TOKEN}@127.0.0.1:1/", "HTTPS_PROXY": "http://127.0.0.1:1",
                        "HOME": "/root", "NETRC": "/root/.netrc"}.items():
        monkeypatch.setenv(name, given)

    def answer(op):
        if "resolve" in op.argv:
            return outcome(stdout=ANSWER)
        (op.outputs["deps"] / LIB).write_bytes(b"lib wheel bytes")
        return outcome()

    session = FakeSession(tmp_path / "s", answer)
    scratch = Scratch()
    try:
        preparer = Preparer(
            Gate(session), session, scratch=scratch, runtime=RUNTIME, index_fd=None, index_url="http://127.0.0.1:8080/simple/",
            progress=lambda line: None,
        )
        result = preparer.prepare(plan_digest=BINDING.plan_digest, runner=[], candidate={"demo-app": "1.0"})
    finally:
        scratch.close()
        session.release()
    assert isinstance(result, Dependencies) and result.files("candidate") == (LIB,)
    resolve, fetched = session.ops
    assert [resolve.network, fetched.network] == [INDEX_NETWORK, INDEX_NETWORK]
    assert resolve.index == fetched.index == "http://127.0.0.1:8080/simple/"
    assert resolve.argv[-2:] == ["http://127.0.0.1:8080/simple/", PROXY_URL] and "index" not in resolve.read
    assert fetched.argv[-3] == "http://127.0.0.1:8080/simple/" and fetched.argv[-1] == PROXY_URL and "index" not in fetched.read
    assert resolve.env == fetched.env == {**SANDBOX_ENV, **PIP_ENV}
    assert preparer.networked == ["s", "s"]


@pytest.mark.parametrize("ask", [{"network": INDEX_NETWORK, "index": "http://127.0.0.1:8080/simple/"}, {"index": "http://127.0.0.1:1/"}])
def test_the_case_service_never_gets_the_network(tmp_path, ask):
    """S9, C9: only the dependency preparer's starter may ask for the index network; a case service's request
    is refused before any sandbox starts."""
    session = FakeSession(tmp_path / "s")
    starter = Gate(session).starter(CASE_SERVICE, object())
    with pytest.raises(OwnershipError, match="loopback only"):
        starter.start(**ask)
    assert session.starts == 0


# --- as root: a sandbox with the index network ------------------------------------------------------------


PROBE = """
import json, os, socket, sys, urllib.error, urllib.request

index_url, index_port, trap_port, abstract = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


def connect(family, address):
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(5)
    try:
        sock.connect(address)
        return "reached"
    except OSError as error:
        return f"{type(error).__name__} {error.errno}"
    finally:
        sock.close()


def get(url):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://127.0.0.1:3128"}))
    try:
        with opener.open(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return type(error).__name__


print(json.dumps({
    "etc": os.path.exists("/etc"),
    "host_loopback": connect(socket.AF_INET, ("127.0.0.1", index_port)),
    "abstract": connect(socket.AF_UNIX, "\\0" + abstract),
    "metadata": connect(socket.AF_INET, ("169.254.169.254", 80)),
    "forwarder": connect(socket.AF_INET, ("127.0.0.1", 3128)),
    "index": get(index_url + "lib/"),
    "trap": get(f"http://127.0.0.1:{trap_port}/latest/meta-data/"),
}))
"""


@pytest.mark.root
def test_an_index_network_sandbox_reaches_the_index_through_its_forwarder_and_nothing_else(tmp_path, sandbox_ids, monkeypatch):
    """S9, issue 16: a sandbox with the index network has a namespace of its own: no /etc, the host's loopback
    and abstract Unix sockets unreachable, no route to the metadata address; its one way out is the forwarder
    on 127.0.0.1:3128, which carries a request to the index and refuses (and logs) one to another loopback
    port, whose listener sees nothing. It is named <stage>-<n>-net in every journal record; a loopback sandbox
    of the same session has no forwarder."""
    from steward import starter
    from steward.session import Steward
    from steward_support import ENV, accept_all, settings

    logged: list[str] = []
    monkeypatch.setattr(starter, "log", logged.append)
    source = tmp_path / "wheels"
    wheel(source, "lib", "1.0")
    name = f"casebox-test-{secrets.token_hex(8)}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0" + name)
    abstract.listen(4)
    abstract.setblocking(False)
    state = tmp_path / "state"
    steward = Steward(settings(str(state), sandbox_ids), capability_check=accept_all)
    seen = {}
    try:
        with IndexServer(build_simple(source, tmp_path / "web")) as server, Listener() as trap:
            session = steward.open_session("net-1")
            for network, index in ((INDEX_NETWORK, server.url), (LOOPBACK, None)):
                ready = session.start_sandbox(network=network, index=index)
                result = session.run(
                    ["/usr/bin/python3", "-I", "-S", "-c", PROBE, server.url, str(server.port), str(trap.port), name],
                    env=ENV, timeout_ms=60_000, stdout_cap=65_536, stderr_cap=65_536,
                )
                session.close_sandbox()
                assert result.observation.wait_status == 0, result.observation.stderr.decode()
                seen[network] = (ready, result.op_id, json.loads(result.observation.stdout))
            closed = session.close()
            requests = list(server.requests)
        with pytest.raises(BlockingIOError):
            abstract.accept()
    finally:
        steward.close()
        abstract.close()
    assert trap.connections == 0
    ready, op_id, probed = seen[INDEX_NETWORK]
    assert ready.network == INDEX_NETWORK and ready.sandbox.endswith("-1-net") and networked_op(op_id)
    assert probed == {
        "etc": False, "host_loopback": "ConnectionRefusedError 111", "abstract": "ConnectionRefusedError 111",
        "metadata": "OSError 101", "forwarder": "reached", "index": 200, "trap": 403,
    }
    assert [path for path, _ in requests] == ["/simple/lib/"]
    assert logged == [f"forwarder of sandbox {ready.sandbox} refused a connection: 127.0.0.1:{trap.port} is neither the index nor an allowed file host"]
    ready, op_id, probed = seen[LOOPBACK]
    assert ready.network == LOOPBACK and not networked_op(op_id)
    assert probed["forwarder"] == "ConnectionRefusedError 111" and probed["index"] == probed["trap"] == "URLError"
    reading = read_journal((state / "tombstones" / closed.stage_id / JOURNAL_NAME).read_bytes())
    intents = [record.fields["op_id"] for record in reading.records if record.kind is Kind.PROCESS_INTENT]
    assert {op.partition(".")[0] for op in intents if op.startswith(closed.stage_id)} == {f"{closed.stage_id}-1-net", f"{closed.stage_id}-2"}


@pytest.mark.root
def test_a_launcher_whose_pid_1_shares_the_stewards_network_namespace_never_gets_ready(tmp_path, sandbox_ids, monkeypatch):
    """S9: the starter checks through the host's /proc that pid 1 is in a network namespace of its own before
    it ACKs READY; a launcher built to leave CLONE_NEWNET out (provisioned as if shipped) fails the start, and
    no op runs."""
    failure, closed = start_with_launcher_without(tmp_path, sandbox_ids, monkeypatch, "    | syscalls.CLONE_NEWNET\n")
    assert "pid 1 shares the steward's network namespace" in failure
    # pid 1 was killed rather than shut down, so the session is not fully verified (C8).
    assert closed.diagnostic == "PRIVILEGED_NONZERO"
    assert processes_of(*sandbox_ids) == []


@pytest.mark.root
def test_a_forwarder_socket_outside_the_sandboxs_namespace_fails_the_start(tmp_path, sandbox_ids, monkeypatch):
    """S9: the starter proves (SIOCGSKNS) that the forwarder's socket is in pid 1's network namespace; a socket
    made without entering it (here setns does nothing, so it would listen on the host's loopback) is closed and
    the start fails."""
    from launcher import syscalls
    from steward.failure import SandboxFailure
    from steward.session import Steward
    from steward_support import accept_all, settings

    monkeypatch.setattr(syscalls, "setns", lambda fd, nstype: None)
    steward = Steward(settings(str(tmp_path / "state"), sandbox_ids), capability_check=accept_all)
    try:
        session = steward.open_session("net-3")
        with pytest.raises(SandboxFailure, match="not in the network namespace of the sandbox.s pid 1"):
            session.start_sandbox(network=INDEX_NETWORK, index="http://127.0.0.1:9/simple/")
        session.close()
    finally:
        steward.close()
    assert processes_of(*sandbox_ids) == []


@pytest.mark.root
def test_a_session_refuses_an_index_without_the_index_network_and_the_reverse(tmp_path, sandbox_ids):
    from steward.session import Steward
    from steward_support import accept_all, settings

    steward = Steward(settings(str(tmp_path / "state"), sandbox_ids), capability_check=accept_all)
    try:
        session = steward.open_session("net-4")
        for ask in ({"network": INDEX_NETWORK}, {"index": "http://127.0.0.1:9/simple/"}):
            with pytest.raises(Refused, match="index"):
                session.start_sandbox(**ask)
        with pytest.raises(Refused, match="index"):
            session.start_sandbox(network=INDEX_NETWORK, index="http://user:pw@127.0.0.1:9/simple/")
        session.close()
    finally:
        steward.close()


# --- as root: verify --index URL end to end ------------------------------------------------------------


UNREACHABLE_TEST = '''"""A case of the network-index test: the index the resolver used is on the host's loopback, not the case's."""
import pathlib
import urllib.error
import urllib.request

import pytest

PORT = int(pathlib.Path(__file__).with_name("index_port.txt").read_text())


def test_the_index_is_unreachable_from_a_case():
    with pytest.raises(urllib.error.URLError) as caught:
        urllib.request.urlopen(f"http://127.0.0.1:{PORT}/simple/case-was-here/", timeout=5)
    assert isinstance(caught.value.reason, ConnectionRefusedError)
'''


def verify_url(casebox, config, base: pathlib.Path, url: str, attempt: str, *, plan=None, verifier=None, env=None):
    bundle, sha256 = packed(base)
    return casebox(
        "--config", str(config), "verify", "--bundle", str(bundle), "--sha256", sha256,
        "--plan", str(plan or EXAMPLES / "plan.json"), "--verifier-tree", str(verifier or EXAMPLES / "verifier"),
        "--index", url, "--attempt", attempt, "--evidence", str(base / "evidence"), "--root", "/", timeout=180, env=env,
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory, sandbox_ids):
    base = tmp_path_factory.mktemp("netindex")
    config = base / "casebox.toml"
    uid, gid = sandbox_ids
    config.write_text(f'state_root = "{base}/state"\nsandbox_uid = {uid}\nsandbox_gid = {gid}\nsocket = "{base}/no.sock"\n')
    return base, config


@pytest.fixture(scope="module")
def url_attempt(world, casebox):
    """The demo plan plus a case that tries the index, against the demo's wheels served on loopback, run with a
    token, a poisoned PIP_INDEX_URL, proxies and a .netrc in the parent's environment."""
    base, config = world
    work = base / "url"
    work.mkdir()
    web = build_simple(EXAMPLES / "index", work / "web")
    trap_root = work / "trap"
    (trap_root / "simple").mkdir(parents=True)
    home = work / "home"
    home.mkdir()
    before = mount_table(str(base))
    staged = scratch_dirs()
    with IndexServer(web) as server, IndexServer(trap_root) as trap:
        verifier = work / "verifier"
        shutil.copytree(EXAMPLES / "verifier", verifier)
        (verifier / "tests" / "test_index.py").write_text(UNREACHABLE_TEST)
        (verifier / "tests" / "index_port.txt").write_text(str(server.port))
        plan = json.loads((EXAMPLES / "plan.json").read_text())
        plan["cases"].append({"id": "index-unreachable", "op": "pytest", "args": ["tests/test_index.py"], "timeout_ms": 60000,
                              "applicable": True, "expect_exit": 0})
        (work / "plan.json").write_text(json.dumps(plan))
        (home / ".netrc").write_text(f"machine 127.0.0.1 login casebox password {TOKEN}\n")
        env = {
            "PATH": os.environ["PATH"], "HOME": str(home), "NETRC": str(home / ".netrc"), "GITHUB_TOKEN": TOKEN,
            "PIP_INDEX_URL": trap.url, "PIP_EXTRA_INDEX_URL": trap.url, "PIP_TRUSTED_HOST": "127.0.0.1",
            "HTTP_PROXY": trap.url, "HTTPS_PROXY": trap.url, "http_proxy": trap.url, "ALL_PROXY": trap.url,
        }
        result = verify_url(casebox, config, work, server.url, "url-1", plan=work / "plan.json", verifier=verifier, env=env)
    yield result, server.requests, trap.requests, before, staged, server.url


@pytest.mark.root
def test_a_network_index_gives_the_demo_statuses(url_attempt):
    """Issue 7: resolved, fetched and installed from a PEP 503 index over HTTP, every demo case gets its designed
    status, and a case in the same attempt cannot reach that index (S9)."""
    result, requests, _, _, _, server_url = url_attempt
    stdout = result.stdout.decode()
    assert result.returncode == 3, stdout + result.stderr.decode()
    expected = {**DESIGNED_STATUS, "index-unreachable": ("PASS", "passed")}
    rows = {cells[0]: tuple(cells[1:3]) for cells in map(str.split, stdout.splitlines()) if cells[:1] and cells[0] in expected}
    assert rows == expected
    assert not any("case-was-here" in path for path, _ in requests)
    note = re.search(r"^note: the index network \(the steward's forwarder to (\S+) and its file hosts, nothing else\) was given "
                     r"to the resolver and fetch sandboxes only \((\S+), (\S+)\)", stdout, re.M)
    assert note and note.group(1) == server_url and all(name.endswith("-net") for name in note.groups()[1:])
    assert b"refused a connection" not in result.stderr


@pytest.mark.root
def test_no_token_proxy_or_pip_setting_of_the_parent_reaches_the_index(url_attempt):
    """No token ever passes into the networked sandboxes: the trap index and proxy named in the parent's
    environment get nothing, and the index gets no credential, from the token, the URL or the .netrc."""
    _, requests, trapped, _, _, _ = url_attempt
    assert trapped == []
    assert requests and {path.split("/")[1] for path, _ in requests} == {"simple", "files"}
    for path, headers in requests:
        assert TOKEN not in path + json.dumps(headers)
        assert not {"authorization", "proxy-authorization", "cookie"} & {name.lower() for name in headers}


@pytest.mark.root
def test_only_the_resolver_and_fetch_sandboxes_had_the_network_and_the_attempt_cleaned_up(url_attempt, world, sandbox_ids, casebox):
    """S9, C4, C5: in the sealed journal only two sandboxes are -net, and no receipt names one; nothing of the
    dedicated UID runs, no mount or scratch remains, and the tombstone's journal is VALID."""
    result, _, _, before, staged, _ = url_attempt
    stdout = result.stdout.decode()
    evidence = pathlib.Path(value(stdout, "evidence"))
    reading = read_journal((evidence / JOURNAL_NAME).read_bytes())
    sandboxes = {record.fields["op_id"].partition(".")[0] for record in reading.records if record.kind is Kind.PROCESS_INTENT
                 and "." in record.fields["op_id"]}
    assert len([name for name in sandboxes if networked_op(name + ".x")]) == 2
    receipts = sorted(evidence.glob("*.receipt.json"))
    assert receipts, f"{evidence} holds no receipt"
    for receipt in receipts:
        process = json.loads(receipt.read_bytes())["process"]
        assert process is None or not networked_op(process["op_id"])
    assert casebox("journal", "verify", str(pathlib.Path(value(stdout, "tombstone")) / JOURNAL_NAME)).returncode == 0
    base, _ = world
    assert processes_of(*sandbox_ids) == []
    assert mount_table(str(base)) == before and scratch_dirs() <= staged


def unresolved_notes(result) -> str:
    stdout = result.stdout.decode()
    assert result.returncode == 3, stdout + result.stderr.decode()
    statuses = {row[:2] for case, row in table(stdout).items() if case != "not-applicable"}
    assert len(statuses) == 1 and statuses.pop()[0] == "UNVERIFIED"
    return stdout


@pytest.mark.root
def test_an_index_serving_bytes_other_than_its_page_states_leaves_every_case_unverified(world, casebox, tmp_path):
    """index_hash: pip's resolver refuses a wheel whose bytes differ from the sha256 its page states."""
    _, config = world
    six = "pluggy-1.5.0-py3-none-any.whl"
    web = build_simple(EXAMPLES / "index", tmp_path / "web", stated={six: "1" * 64})
    with IndexServer(web) as server:
        stdout = unresolved_notes(verify_url(casebox, config, tmp_path, server.url, "url-hash-1"))
    assert "dependencies unresolved (index_hash)" in stdout


@pytest.mark.root
def test_an_index_that_serves_the_fetch_another_wheel_than_the_resolver_leaves_every_case_unverified(world, casebox, tmp_path):
    """The fetch is pinned to what the preparer ACKed: an index that answers the fetch with other bytes for the
    same file than it gave pip's resolver fails the fetch's hash check (fetch_failed); nothing else is installed."""
    _, config = world
    web = build_simple(EXAMPLES / "index", tmp_path / "web")
    with IndexServer(web, swap_for_fetch={"/files/pluggy-1.5.0-py3-none-any.whl": b"PK\x05\x06" + bytes(18)}) as server:
        stdout = unresolved_notes(verify_url(casebox, config, tmp_path, server.url, "url-swap-1"))
    assert "dependencies unresolved (fetch_failed)" in stdout


# --- as root: verify --index URL against a listener it must never reach (issue 16) -----------------------------


APP_PLAN = {"schema": "casebox.plan.v1", "cases": [case_doc("run", "python-module", ["app"], 30_000)]}


def verify_app(casebox, config, base: pathlib.Path, url: str, requires: list[str]):
    """`verify --index URL` of a candidate ``app`` (its module imports lib) requiring ``requires``, on one
    python-module case; (result, stdout, stderr)."""
    app = wheel(base / "candidate", "app", "1.0", *requires, files={"app/__init__.py": "", "app/__main__.py": "import lib\n"})
    data = pack.build(pack.read_wheels([str(app)]))
    (base / "candidate.tar").write_bytes(data)
    (base / "verifier").mkdir()
    (base / "plan.json").write_text(json.dumps(APP_PLAN))
    result = casebox(
        "--config", str(config), "verify", "--bundle", str(base / "candidate.tar"), "--sha256", hashlib.sha256(data).hexdigest(),
        "--plan", str(base / "plan.json"), "--verifier-tree", str(base / "verifier"), "--index", url,
        "--attempt", f"trap-{base.name[-24:].strip('_')}", "--evidence", str(base / "evidence"), "--root", "/", timeout=180,
    )
    return result, result.stdout.decode(), result.stderr.decode()


def run_status(stdout: str) -> tuple[str, str]:
    row = re.search(r"^run\s+(\S+)\s+(\S+)", stdout, re.M)
    assert row, stdout
    return row.group(1), row.group(2)


@pytest.mark.root
@pytest.mark.parametrize("attack", ["none", "candidate_direct_url", "dependency_direct_url", "index_link", "index_redirect"])
def test_a_listener_on_another_loopback_port_is_never_reached_by_verify(world, casebox, tmp_path, attack):
    """Issue 16: the index on one loopback port resolves (the control); a listener on another port, standing in
    for a metadata service, is never reached: not from a candidate's ``x @ http://127.0.0.1:PORT/x.whl``
    (direct_url, refused before pip runs), not from such a requirement of a dependency in the index
    (direct_url, refused inside pip), not from a file the index's page links there or a redirect the index
    sends there (the forwarder refuses and logs it; the case is UNVERIFIED with the forwarder's sentence)."""
    _, config = world
    source = tmp_path / "wheels"
    with Listener() as trap:
        trap_url = f"http://127.0.0.1:{trap.port}"
        requires = [f"x @ {trap_url}/x-1.0-py3-none-any.whl"] if attack == "candidate_direct_url" else ["lib"]
        wheel(source, "lib", "1.0", *([f"x @ {trap_url}/x-1.0-py3-none-any.whl"] if attack == "dependency_direct_url" else []))
        links = {"lib": [f'<a href="{trap_url}/files/lib-7.0-py3-none-any.whl#sha256={"0" * 64}">lib-7.0</a>']}
        web = build_simple(source, tmp_path / "web", extra_links=links if attack == "index_link" else None)
        moved = {"/simple/lib/": f"{trap_url}/simple/lib/"} if attack == "index_redirect" else None
        with IndexServer(web, redirects=moved) as server:
            result, stdout, stderr = verify_app(casebox, config, tmp_path, server.url, requires)
    assert trap.connections == 0
    if attack == "none":
        assert run_status(stdout) == ("PASS", "passed") and result.returncode == 0, stdout + stderr
        assert "refused a connection" not in stderr
    elif attack.endswith("direct_url"):
        assert run_status(stdout) == ("UNVERIFIED", "direct_url") and result.returncode == 3, stdout + stderr
        assert ("app requires x" if attack == "candidate_direct_url" else "lib requires x") in stdout
    else:
        assert run_status(stdout) == ("UNVERIFIED", "dependencies_unresolved") and result.returncode == 3, stdout + stderr
        assert f"casebox forwarder: 127.0.0.1:{trap.port} is neither the index" in stdout
        assert re.search(rf"^casebox-steward: forwarder of sandbox \S+-net refused a connection: 127.0.0.1:{trap.port} is "
                         "neither the index nor an allowed file host$", stderr, re.M), stderr
