"""The resolver protocol casebox.resolver.v2 (executor/deps/protocol.py): hand-written leaves, each refusal by its code."""

from __future__ import annotations

import pytest

from executor.deps.protocol import (
    ABORTS,
    MAX_PINS,
    Abort,
    Acceptor,
    Failed,
    Pin,
    accept,
    acks_bytes,
    acks_from_bytes,
    is_file_url,
    leaf,
    request_bytes,
    request_from_bytes,
)
from journal.errors import Refused

SIX = "4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"
PLUGGY = "44e1ad92c8ca002de6377e165f3e0f1be63266ab4d554740532335b9d75ea669"
INDEX = {"six-1.17.0-py2.py3-none-any.whl": SIX, "pluggy-1.5.0-py3-none-any.whl": PLUGGY}

BEGIN = (
    b'{"candidate":[{"modules":["demo_core"],"name":"demo-core","version":"1.0.0"},'
    b'{"modules":["demo_extra"],"name":"demo-extra","version":"1.0.0"}],'
    b'"leaf":"BEGIN","protocol":"casebox.resolver.v2","python":"3.11.2","seq":0}\n'
)
PIN_SIX = (
    b'{"file":"six-1.17.0-py2.py3-none-any.whl","leaf":"PIN","name":"six","seq":1,'
    b'"sha256":"' + SIX.encode() + b'","tree":"candidate","url":"file:///cap/index/six-1.17.0-py2.py3-none-any.whl",'
    b'"version":"1.17.0"}\n'
)
PIN_PLUGGY = (
    b'{"file":"pluggy-1.5.0-py3-none-any.whl","leaf":"PIN","name":"pluggy","seq":2,'
    b'"sha256":"' + PLUGGY.encode() + b'","tree":"runner","url":"file:///cap/index/pluggy-1.5.0-py3-none-any.whl",'
    b'"version":"1.5.0"}\n'
)
END_2 = b'{"leaf":"END","pins":2,"seq":3}\n'


def acceptor(**changes) -> Acceptor:
    options = dict(python="3.11.2", candidate={"demo-core": "1.0.0", "demo-extra": "1.0.0"}, index_sha256=INDEX.get)
    options.update(changes)
    return Acceptor(**options)


def aborted(output: bytes, **changes) -> str:
    with pytest.raises(Abort) as stop:
        accept(output, acceptor(**changes))
    assert stop.value.code in ABORTS
    return stop.value.code


def test_a_complete_answer_is_acked_pin_by_pin():
    """Step 4: each PIN is ACKed with the seq that named it; END closes the answer."""
    pins = accept(BEGIN + PIN_SIX + PIN_PLUGGY + END_2, acceptor())
    assert pins == (
        Pin(1, "candidate", "six", "1.17.0", "six-1.17.0-py2.py3-none-any.whl", SIX, "file:///cap/index/six-1.17.0-py2.py3-none-any.whl"),
        Pin(2, "runner", "pluggy", "1.5.0", "pluggy-1.5.0-py3-none-any.whl", PLUGGY, "file:///cap/index/pluggy-1.5.0-py3-none-any.whl"),
    )


def test_begin_gives_the_modules_each_candidate_project_installs():
    """E7: the resolver lists each wheel's top-level modules; the acceptor keeps them for the shadowing rule."""
    answer = acceptor()
    accept(BEGIN + b'{"leaf":"END","pins":0,"seq":1}\n', answer)
    assert answer.modules == {"demo-core": ("demo_core",), "demo-extra": ("demo_extra",)}
    assert aborted(BEGIN.replace(b'"modules":["demo_core"]', b'"modules":["demo-core"]') + END_2) == "unknown"


def test_the_encoder_writes_these_exact_bytes():
    """D2: the resolver's lines are canonical JSON, keys sorted, one newline."""
    assert leaf("END", 3, pins=2) == END_2
    assert leaf(
        "PIN", 1, tree="candidate", name="six", version="1.17.0", file="six-1.17.0-py2.py3-none-any.whl", sha256=SIX,
        url="file:///cap/index/six-1.17.0-py2.py3-none-any.whl",
    ) == PIN_SIX


def test_no_dependencies_is_begin_then_end():
    assert accept(BEGIN + b'{"leaf":"END","pins":0,"seq":1}\n', acceptor()) == ()


def test_a_fail_leaf_is_the_resolvers_own_answer():
    """A FAIL leaf ends the answer with a reason from the closed set; the pins before it are not used."""
    output = BEGIN + PIN_SIX + b'{"leaf":"FAIL","reason":"no_match","requirement":"pytest","seq":2}\n'
    assert accept(output, acceptor()) == Failed("no_match", "pytest")


def test_an_unknown_leaf_aborts():
    """S2-style protocol: an unknown kind of leaf aborts."""
    assert aborted(BEGIN + b'{"leaf":"HELLO","seq":1}\n') == "unknown"


def test_an_unknown_field_aborts():
    """D1: a leaf is closed; a field it does not define aborts."""
    extra = PIN_SIX.replace(b'"file"', b'"extra":1,"file"')
    assert aborted(BEGIN + extra + b'{"leaf":"END","pins":1,"seq":2}\n') == "unknown"


def test_a_non_canonical_leaf_aborts():
    """D2: a leaf in any spelling but its canonical one aborts."""
    spaced = b'{"leaf": "END", "pins": 0, "seq": 1}\n'
    assert aborted(BEGIN + spaced) == "unknown"


def test_an_unknown_fail_reason_aborts():
    assert aborted(BEGIN + b'{"leaf":"FAIL","reason":"because","requirement":"x","seq":1}\n') == "unknown"


def test_a_leaf_out_of_order_aborts():
    """A seq that is not the next number aborts: skipped, replayed or first."""
    assert aborted(BEGIN + PIN_PLUGGY) == "out_of_order"
    assert aborted(BEGIN + PIN_SIX + PIN_SIX) == "out_of_order"
    assert aborted(PIN_SIX.replace(b'"seq":1', b'"seq":0')) == "out_of_order"
    assert aborted(BEGIN + BEGIN.replace(b'"seq":0', b'"seq":1')) == "out_of_order"


def test_a_leaf_after_end_aborts():
    """Nothing may follow END (or FAIL): an extra leaf aborts."""
    after = b'{"leaf":"END","pins":0,"seq":2}\n'
    assert aborted(BEGIN + b'{"leaf":"END","pins":0,"seq":1}\n' + after) == "extra"
    failed = b'{"leaf":"FAIL","reason":"no_match","requirement":"x","seq":1}\n'
    assert aborted(BEGIN + failed + PIN_SIX.replace(b'"seq":1', b'"seq":2')) == "extra"


def test_a_wheel_whose_hash_differs_aborts():
    """The trusted side hashes the index file itself; a PIN claiming another sha256 aborts."""
    forged = PIN_SIX.replace(SIX.encode(), b"0" * 64)
    assert aborted(BEGIN + forged + b'{"leaf":"END","pins":1,"seq":2}\n') == "hash_mismatch"
    replaced = {**INDEX, "six-1.17.0-py2.py3-none-any.whl": "f" * 64}
    assert aborted(BEGIN + PIN_SIX + b'{"leaf":"END","pins":1,"seq":2}\n', index_sha256=replaced.get) == "hash_mismatch"


def test_a_pin_outside_the_index_aborts():
    assert aborted(BEGIN + PIN_SIX + b'{"leaf":"END","pins":1,"seq":2}\n', index_sha256={}.get) == "not_in_index"


def test_a_pin_whose_file_is_another_wheel_aborts():
    other = PIN_SIX.replace(b'"version":"1.17.0"', b'"version":"1.16.0"')
    assert aborted(BEGIN + other + b'{"leaf":"END","pins":1,"seq":2}\n') == "file_mismatch"
    path = PIN_SIX.replace(b'"file":"six-1.17.0', b'"file":"../six-1.17.0')
    assert aborted(BEGIN + path + b'{"leaf":"END","pins":1,"seq":2}\n') == "file_mismatch"


def test_a_second_pin_of_one_project_in_one_tree_aborts():
    again = PIN_SIX.replace(b'"seq":1', b'"seq":2')
    assert aborted(BEGIN + PIN_SIX + again) == "duplicate"


def test_one_wheel_may_be_pinned_in_both_trees_with_one_hash():
    """E7: the runner and the candidate are resolved apart, so both may pin one file; never with two hashes."""
    runner = PIN_SIX.replace(b'"seq":1', b'"seq":2').replace(b'"tree":"candidate"', b'"tree":"runner"')
    pins = accept(BEGIN + PIN_SIX + runner + END_2, acceptor())
    assert [(pin.tree, pin.file) for pin in pins] == [("candidate", "six-1.17.0-py2.py3-none-any.whl"), ("runner", "six-1.17.0-py2.py3-none-any.whl")]
    forged = runner.replace(SIX.encode(), b"0" * 64)
    network = acceptor(index_sha256=None)
    with pytest.raises(Abort) as stop:
        accept(BEGIN + http(PIN_SIX) + http(forged) + END_2, network)
    assert stop.value.code == "hash_mismatch"


def http(line: bytes) -> bytes:
    """The leaf as a network index's resolver writes it: the file's URL on the index host."""
    return line.replace(b"file:///cap/index/", b"https://files.example/packages/")


def test_a_pin_from_a_url_that_is_not_the_index_aborts():
    """Only the index is fetched: a local pin names its file in the find-links index, a network pin an
    http(s) URL of its file without user information."""
    elsewhere = PIN_SIX.replace(b"file:///cap/index/", b"file:///tmp/")
    assert aborted(BEGIN + elsewhere + b'{"leaf":"END","pins":1,"seq":2}\n') == "url_mismatch"
    for url in (b"http://user:pw@files.example/six-1.17.0-py2.py3-none-any.whl", b"ftp://files.example/six-1.17.0-py2.py3-none-any.whl",
                b"https://files.example/other-1.0-py3-none-any.whl", b"file:///cap/index/six-1.17.0-py2.py3-none-any.whl"):
        line = PIN_SIX.replace(b"file:///cap/index/six-1.17.0-py2.py3-none-any.whl", url)
        assert aborted(BEGIN + line + b'{"leaf":"END","pins":1,"seq":2}\n', index_sha256=None) == "url_mismatch"
    assert accept(BEGIN + http(PIN_SIX) + b'{"leaf":"END","pins":1,"seq":2}\n', acceptor(index_sha256=None))


def test_a_file_url_names_its_file_percent_decoded():
    assert is_file_url("https://files.example/p/a%2Bb-1.0-py3-none-any.whl#sha256=00", "a+b-1.0-py3-none-any.whl")
    assert not is_file_url('https://files.example/"x.whl', '"x.whl')


def test_pinning_the_candidate_itself_aborts():
    """The candidate's own projects come from the sealed extraction, never from the index."""
    own = PIN_SIX.replace(b'"name":"six"', b'"name":"demo-core"')
    assert aborted(BEGIN + own) == "candidate_pin"


def test_a_runner_pin_of_a_candidate_project_is_acked_for_the_shadowing_rule():
    """E7: the runner is resolved without the bundle, so it may pin a project the candidate also ships; the
    preparer then refuses the candidate (candidate_shadows_runner), which the acceptor leaves to it."""
    index = {"demo_core-1.0.0-py3-none-any.whl": "b" * 64}
    line = leaf("PIN", 1, tree="runner", name="demo-core", version="1.0.0", file="demo_core-1.0.0-py3-none-any.whl",
                sha256="b" * 64, url="file:///cap/index/demo_core-1.0.0-py3-none-any.whl")
    assert accept(BEGIN + line + b'{"leaf":"END","pins":1,"seq":2}\n', acceptor(index_sha256=index.get))[0].tree == "runner"


def test_a_wrong_count_aborts():
    assert aborted(BEGIN + PIN_SIX + b'{"leaf":"END","pins":2,"seq":2}\n') == "count"


def test_an_answer_without_end_aborts():
    assert aborted(BEGIN + PIN_SIX) == "incomplete"
    assert aborted(b"") == "incomplete"
    assert aborted(BEGIN + b'{"leaf":"END","pins":0,"seq":1}') == "incomplete"


def test_begin_must_name_the_runtime_and_the_sealed_candidate():
    assert aborted(BEGIN + END_2, python="3.12.0") == "runtime_mismatch"
    assert aborted(BEGIN + END_2, candidate={"demo-core": "1.0.0"}) == "candidate_mismatch"


def test_more_pins_than_the_cap_abort():
    index = {f"p{n}-1.0-py3-none-any.whl": "a" * 64 for n in range(MAX_PINS + 1)}
    lines = [BEGIN]
    for n in range(MAX_PINS + 1):
        lines.append(leaf("PIN", n + 1, tree="candidate", name=f"p{n}", version="1.0", file=f"p{n}-1.0-py3-none-any.whl",
                          sha256="a" * 64, url=f"file:///cap/index/p{n}-1.0-py3-none-any.whl"))
    assert aborted(b"".join(lines), index_sha256=index.get) == "too_many"


def test_the_acks_become_the_fetch_ops_capability():
    """Each ACKed pin, exactly, with its hash and URL: pins.json, which the fetch tool reads back strictly."""
    pins = accept(BEGIN + PIN_SIX + PIN_PLUGGY + END_2, acceptor())
    data = acks_bytes(pins)
    assert data.startswith(b'{"pins":[{"ack":1,"file":"six-1.17.0-py2.py3-none-any.whl","name":"six",')
    assert acks_from_bytes(data) == pins
    with pytest.raises(Refused):
        acks_from_bytes(data.replace(b'"ack":1,', b'"ack":1,"extra":0,'))


def test_the_request_round_trips_and_is_closed():
    data = request_bytes("sha256:" + "0" * 64, ["pytest"], {"file": "pip-24.2-py3-none-any.whl", "sha256": "1" * 64, "source": "index"})
    request = request_from_bytes(data)
    assert request.runner == ("pytest",) and request.installer_file == "pip-24.2-py3-none-any.whl"
    with pytest.raises(Refused):
        request_from_bytes(data.replace(b'"pip-24.2-py3-none-any.whl"', b'"../pip.whl"'))
