"""casebox verify --index URL (docs/pipeline.md, "A network index"): the index client, the resolver over HTTP,
the preparer's networked sandboxes, and end to end as root against a PEP 503 index served on loopback."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil

import pytest
from evidence_support import DESIGNED_STATUS
from index_support import IndexServer, build_simple
from pipeline_support import BINDING, RUNTIME, FakeSession, outcome
from test_resolver import leaves
from test_verify import EXAMPLES, dedicated_processes, mounts, packed, staging_dirs, table, value
from wheelforge import wheel

from executor import inside
from executor.environ import SANDBOX_ENV
from executor.ownership import CASE_SERVICE, Gate, OwnershipError
from executor.preparer import PIP_ENV, Dependencies, Preparer
from executor.resolverproto import Pin, acks_bytes, leaf
from executor.simpleindex import check_index_url
from executor.staging import Staging
from journal.errors import Refused
from journal.files import JOURNAL_NAME
from journal.format import Kind, networked_op
from journal.reader import read_journal
from steward.api import HOST_NETWORK, LOOPBACK

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


# --- pip's resolver over HTTP, and the fetch of the ACKed pins ------------------------------------------


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


def test_pip_s_resolver_pins_from_a_simple_index_with_the_hash_of_each_file(served):
    """Step 4 over HTTP: highest version, its own requirements, each PIN's sha256 and URL those of the file
    pip chose; a yanked newer one and one whose page excludes this Python are never pinned."""
    candidate, source, base = served
    wheel(source, "lib", "9.0")
    wheel(source, "lib", "3.0")
    web = build_simple(source, base / "web")
    page = web / "simple" / "lib" / "index.html"
    html = page.read_text().replace('lib-9.0-py3-none-any.whl#', 'lib-9.0-py3-none-any.whl" data-yanked="" x="#')
    page.write_text(html.replace('<a href="../../files/lib-3.0', '<a data-requires-python="&lt;3" href="../../files/lib-3.0'))
    with IndexServer(web) as server:
        found = leaves(base, candidate, server.url)
    chosen = {leaf_["name"]: (leaf_["version"], leaf_["sha256"], leaf_["url"]) for leaf_ in found if leaf_["leaf"] == "PIN"}
    assert {name: version for name, (version, _, _) in chosen.items()} == {"lib": "2.0", "base": "1.0"}
    for name, (version, digest, url) in chosen.items():
        file = f"{name}-{version}-py3-none-any.whl"
        assert digest == hashlib.sha256((source / file).read_bytes()).hexdigest()
        assert url.startswith(server.url.rsplit("/simple/", 1)[0] + "/files/" + file)


def test_bytes_that_differ_from_the_hash_the_page_states_fail_the_resolution(served):
    """index_hash: the index served a file whose sha256 is not the one its page states."""
    candidate, source, base = served
    web = build_simple(source, base / "web", stated={"lib-2.0-py3-none-any.whl": "0" * 64})
    with IndexServer(web) as server:
        found = leaves(base, candidate, server.url)
    assert found[-1]["leaf"] == "FAIL" and found[-1]["reason"] == "index_hash"


def test_an_unreachable_index_fails_the_resolution(served):
    """index: an index that does not answer is a FAIL with a reason, never an empty resolution."""
    candidate, source, base = served
    web = build_simple(source, base / "web")
    with IndexServer(web) as server:
        url = server.url
    found = leaves(base, candidate, url)
    assert found[-1]["leaf"] == "FAIL" and found[-1]["reason"] == "index"


def fetch(tmp_path, url: str, chosen: list[Pin]) -> tuple[int, pathlib.Path]:
    """The fetch tool (executor/inside.py) over HTTP: exactly the ACKed pins into a directory of its own."""
    acks, target = tmp_path / "pins.json", tmp_path / "deps"
    tmp_path.mkdir()
    acks.write_bytes(acks_bytes(chosen))
    target.mkdir()
    return inside.main(["fetch", str(acks), str(target), url, str(EXAMPLES / "index" / "pip-24.2-py3-none-any.whl")]), target


def test_the_fetch_downloads_exactly_the_acked_pins_and_checks_each_hash(served):
    """Step 4: the fetch takes each ACKed pin from the URL pip named, hashing as it writes; a file with other
    bytes than ACKed is refused and removed (index_hash), so nothing unACKed is ever sealed."""
    _, source, base = served
    web = build_simple(source, base / "web")
    with IndexServer(web) as server:
        root = server.url.rsplit("/simple/", 1)[0]
        good = [Pin(1, "candidate", name, "1.0", f"{name}-1.0-py3-none-any.whl",
                    hashlib.sha256((source / f"{name}-1.0-py3-none-any.whl").read_bytes()).hexdigest(), f"{root}/files/{name}-1.0-py3-none-any.whl")
                for name in ("lib", "base")]
        code, target = fetch(base / "good", server.url, good)
        assert code == 0 and sorted(path.name for path in target.iterdir()) == ["base-1.0-py3-none-any.whl", "lib-1.0-py3-none-any.whl"]
        forged = [dataclasses.replace(good[0], sha256="0" * 64)]
        code, target = fetch(base / "forged", server.url, forged)
        assert code == 1 and list(target.iterdir()) == []


# --- the preparer: which sandboxes get the network, and with what -----------------------------------------


LIB = "lib-1.0-py3-none-any.whl"
LIB_SHA = hashlib.sha256(b"lib wheel bytes").hexdigest()
ANSWER = (
    leaf("BEGIN", 0, protocol="casebox.resolver.v2", python="3.11.2", candidate=[{"name": "demo-app", "version": "1.0", "modules": ["demo_app"]}])
    + leaf("PIN", 1, tree="candidate", name="lib", version="1.0", file=LIB, sha256=LIB_SHA, url=f"http://127.0.0.1:8080/files/{LIB}")
    + leaf("END", 2, pins=1)
)


def test_only_the_resolve_and_fetch_sandboxes_get_the_network_and_never_the_callers_environment(tmp_path, monkeypatch):
    """Issue 7: the resolver and fetch of a network index are the only sandboxes with network, and no token
    (nor a proxy, a PIP_* setting or a home with a .netrc) set in the parent passes into them."""
    for name, given in {"GITHUB_TOKEN": TOKEN, "PIP_INDEX_URL": f"http://x:{TOKEN}@127.0.0.1:1/", "HTTPS_PROXY": "http://127.0.0.1:1",
                        "HOME": "/root", "NETRC": "/root/.netrc"}.items():
        monkeypatch.setenv(name, given)

    def answer(op):
        if "resolve" in op.argv:
            return outcome(stdout=ANSWER)
        (op.outputs["deps"] / LIB).write_bytes(b"lib wheel bytes")
        return outcome()

    session = FakeSession(tmp_path / "s", answer)
    staging = Staging()
    try:
        preparer = Preparer(
            Gate(session), session, staging=staging, runtime=RUNTIME, index_fd=None, index_url="http://127.0.0.1:8080/simple/",
            progress=lambda line: None,
        )
        result = preparer.prepare(plan_digest=BINDING.plan_digest, runner=[], candidate={"demo-app": "1.0"})
    finally:
        staging.close()
        session.release()
    assert isinstance(result, Dependencies) and result.files("candidate") == (LIB,)
    resolve, fetched = session.ops
    assert [resolve.network, fetched.network] == [HOST_NETWORK, HOST_NETWORK]
    assert resolve.argv[-1] == "http://127.0.0.1:8080/simple/" and "index" not in resolve.read
    assert fetched.argv[-2] == "http://127.0.0.1:8080/simple/" and "index" not in fetched.read
    assert resolve.env == fetched.env == {**SANDBOX_ENV, **PIP_ENV}
    assert preparer.networked == ["s", "s"]


def test_the_case_service_never_gets_the_network(tmp_path):
    """S9, C9: only the dependency preparer's starter may ask for the host's network; a case service's request
    is refused before any sandbox starts."""
    session = FakeSession(tmp_path / "s")
    starter = Gate(session).starter(CASE_SERVICE, object())
    with pytest.raises(OwnershipError, match="loopback only"):
        starter.start(network=HOST_NETWORK)
    assert session.starts == 0


# --- as root: the sandbox with the host's network ----------------------------------------------------------


@pytest.mark.root
def test_a_host_network_sandbox_is_observed_named_and_given_only_resolver_files(tmp_path, sandbox_ids):
    """S9: the starter observes pid 1's network namespace itself; a host-network sandbox is named <stage>-<n>-net
    in every journal record, reaches the host's loopback, and its /etc holds the host's resolv.conf, a hosts
    naming localhost and 'hosts: files dns', nothing else; a loopback sandbox of the same session reaches nothing."""
    import socket

    from steward.session import Steward
    from steward_support import ENV, accept_all, settings

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    probe = (
        "import os, socket\nprint(sorted(os.listdir('/etc')) if os.path.isdir('/etc') else None)\n"
        "print(open('/etc/resolv.conf', 'rb').read().hex() if os.path.isdir('/etc') else '')\n"
        f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5).close(); print('reached')\n"
        "except OSError as error:\n    print(type(error).__name__)\n"
    )
    state = tmp_path / "state"
    steward = Steward(settings(str(state), sandbox_ids), capability_check=accept_all)
    try:
        session = steward.open_session("net-1")
        seen = {}
        for network in (HOST_NETWORK, LOOPBACK):
            ready = session.start_sandbox(network=network)
            result = session.run(["/usr/bin/python3", "-I", "-S", "-c", probe], env=ENV, timeout_ms=20_000, stdout_cap=65_536, stderr_cap=4096)
            session.close_sandbox()
            seen[network] = (ready, result.op_id, result.observation.stdout.decode().splitlines())
        closed = session.close()
    finally:
        steward.close()
        listener.close()
    ready, op_id, lines = seen[HOST_NETWORK]
    try:
        with open("/etc/resolv.conf", "rb") as file:
            resolv = file.read()
    except FileNotFoundError:
        resolv = b""
    assert ready.network == HOST_NETWORK and ready.sandbox.endswith("-1-net") and networked_op(op_id)
    assert lines == ["['hosts', 'nsswitch.conf', 'resolv.conf']", resolv.hex(), "reached"]
    ready, op_id, lines = seen[LOOPBACK]
    assert ready.network == LOOPBACK and not networked_op(op_id)
    assert lines == ["None", "", "ConnectionRefusedError"]
    reading = read_journal((state / "tombstones" / closed.stage_id / JOURNAL_NAME).read_bytes())
    intents = [record.fields["op_id"] for record in reading.records if record.kind is Kind.PROCESS_INTENT]
    assert {op.partition(".")[0] for op in intents if op.startswith(closed.stage_id)} == {f"{closed.stage_id}-1-net", f"{closed.stage_id}-2"}
    assert [name for name in os.listdir(state / "staging") if name.startswith("net-")] == []


@pytest.mark.root
def test_a_host_network_sandbox_whose_pid_1_has_another_network_than_asked_never_gets_ready(tmp_path, sandbox_ids, monkeypatch):
    """S9: the starter checks pid 1's network namespace against the one asked for before it ACKs READY; a
    launcher told to share the host's network for a loopback sandbox fails the start, and no op runs."""
    from steward import starter
    from steward.failure import SandboxFailure
    from steward.session import Steward
    from steward_support import accept_all, settings

    monkeypatch.setattr(starter, "HOST_NETWORK", LOOPBACK)
    steward = Steward(settings(str(tmp_path / "state"), sandbox_ids), capability_check=accept_all)
    try:
        session = steward.open_session("net-2")
        with pytest.raises(SandboxFailure, match="pid 1 has the host network, not the loopback network asked for"):
            session.start_sandbox(network=LOOPBACK)
        closed = session.close()
    finally:
        steward.close()
    # pid 1 was killed rather than shut down, so the session is not fully verified (C8).
    assert closed.diagnostic == "PRIVILEGED_NONZERO"
    assert dedicated_processes(sandbox_ids[0]) == []


@pytest.mark.root
def test_recovery_removes_the_etc_a_killed_starter_left_in_staging(tmp_path):
    """A starter killed mid-sandbox leaves staging/net-<stage>-<n>; casebox stage recover removes it with the
    launcher and rendezvous residue of that stage, and nothing of another stage."""
    from steward import hostnetwork, recovery
    from steward.stateroot import STAGING, StateRoot

    root = StateRoot.open(str(tmp_path / "state"))
    try:
        staging = root.area(STAGING)
        for name in ("net-aaaa-3-net", "net-bbbb-1-net"):
            os.close(hostnetwork.make_etc(staging, name))
        removed = recovery.remove_sandbox_residue(root, "aaaa")
        assert removed == [root.path_of(STAGING, "net-aaaa-3-net")]
        assert root.entries(STAGING) == ["net-bbbb-1-net"]
    finally:
        root.close()


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
    before = mounts(base)
    staged = staging_dirs()
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
    yield result, server.requests, trap.requests, before, staged


@pytest.mark.root
def test_a_network_index_gives_the_demo_statuses(url_attempt):
    """Issue 7: resolved, fetched and installed from a PEP 503 index over HTTP, every demo case gets its designed
    status, and a case in the same attempt cannot reach that index (S9)."""
    result, requests, _, _, _ = url_attempt
    stdout = result.stdout.decode()
    assert result.returncode == 3, stdout + result.stderr.decode()
    expected = {**DESIGNED_STATUS, "index-unreachable": ("PASS", "passed")}
    rows = {cells[0]: tuple(cells[1:3]) for cells in map(str.split, stdout.splitlines()) if cells[:1] and cells[0] in expected}
    assert rows == expected
    assert not any("case-was-here" in path for path, _ in requests)
    note = re.search(r"^note: the host's network was given to the resolver and fetch sandboxes only \((\S+), (\S+)\)", stdout, re.M)
    assert note and all(name.endswith("-net") for name in note.groups())


@pytest.mark.root
def test_no_token_proxy_or_pip_setting_of_the_parent_reaches_the_index(url_attempt):
    """No token ever passes into the networked sandboxes: the trap index and proxy named in the parent's
    environment get nothing, and the index gets no credential, from the token, the URL or the .netrc."""
    _, requests, trapped, _, _ = url_attempt
    assert trapped == []
    assert requests and {path.split("/")[1] for path, _ in requests} == {"simple", "files"}
    for path, headers in requests:
        assert TOKEN not in path + json.dumps(headers)
        assert not {"authorization", "proxy-authorization", "cookie"} & {name.lower() for name in headers}


@pytest.mark.root
def test_only_the_resolver_and_fetch_sandboxes_had_the_network_and_the_attempt_cleaned_up(url_attempt, world, sandbox_ids, casebox):
    """S9, C4, C5: in the sealed journal only two sandboxes are -net, and no receipt names one; nothing of the
    dedicated UID runs, no mount or staging remains, and the tombstone's journal is VALID."""
    result, _, _, before, staged = url_attempt
    stdout = result.stdout.decode()
    evidence = pathlib.Path(value(stdout, "evidence"))
    reading = read_journal((evidence / JOURNAL_NAME).read_bytes())
    sandboxes = {record.fields["op_id"].partition(".")[0] for record in reading.records if record.kind is Kind.PROCESS_INTENT
                 and "." in record.fields["op_id"]}
    assert len([name for name in sandboxes if networked_op(name + ".x")]) == 2
    for receipt in evidence.glob("*.receipt.json"):
        process = json.loads(receipt.read_bytes())["process"]
        assert process is None or not networked_op(process["op_id"])
    assert casebox("journal", "verify", str(pathlib.Path(value(stdout, "tombstone")) / JOURNAL_NAME)).returncode == 0
    base, _ = world
    assert dedicated_processes(sandbox_ids[0]) == []
    assert before - mounts(base) == set() and staging_dirs() <= staged


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
