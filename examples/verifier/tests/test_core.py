"""Verifier tests of the demo candidate's behaviour (examples/plan.json: pass, assertion-failure, not-applicable)."""

import sys

import pytest

import demo_core
import demo_extra
import demo_greet


def test_add():
    """Designed to PASS: every wheel imports and behaves."""
    assert demo_core.add(2, 3) == 5
    assert demo_greet.greeting("ada") == "hello, ada (3 letters)"
    assert demo_extra.as_text(b"ok") == "ok"


def test_deliberate_failure():
    """Designed to FAIL: a real assertion failure, so the case's exit is pytest's 1, not the expected 0."""
    assert demo_core.add(2, 2) == 5


@pytest.mark.skipif(sys.platform != "win32", reason="the demo runs on Linux only")
def test_windows_only():
    """The plan declares this case not applicable (N/A); it is never run."""
    assert sys.platform == "win32"
