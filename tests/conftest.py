"""Shared fixtures: corpora, the dedicated sandbox ids, root detection."""

from __future__ import annotations

import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
# The corpora sit beside the checkout (../shared/corpora); a clone elsewhere
# names them with CASEBOX_CORPORA or finds the workplace copy.
CORPORA_CANDIDATES = [
    pathlib.Path(os.environ["CASEBOX_CORPORA"]) if os.environ.get("CASEBOX_CORPORA") else None,
    REPO.parent / "shared" / "corpora",
    pathlib.Path("/work/shared/corpora"),
]
DEFAULT_SANDBOX_ID = 2_000_000_000


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root; CI runs the suite as root")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def corpora() -> pathlib.Path:
    """The shared public corpora (JSONTestSuite, Go archive/tar, RFC 8785)."""
    for candidate in CORPORA_CANDIDATES:
        if candidate is not None and candidate.is_dir():
            return candidate.resolve()
    pytest.fail("the shared corpora are missing: set CASEBOX_CORPORA or keep ../shared/corpora beside the checkout")


@pytest.fixture(scope="session")
def sandbox_ids() -> tuple[int, int]:
    """The dedicated (uid, gid) for sandbox tests; overridable so two root suites can run side by side."""
    uid = int(os.environ.get("CASEBOX_TEST_UID", DEFAULT_SANDBOX_ID))
    gid = int(os.environ.get("CASEBOX_TEST_GID", uid))
    return uid, gid
