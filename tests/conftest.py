"""Shared fixtures: corpora, the dedicated sandbox ids, root detection, the installed CLI."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile

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
# A second identity of this run's own is the dedicated one shifted this far, never by one: two suites run side
# by side with neighbouring dedicated ids, and one's "other uid" must not be the next one's dedicated uid.
OTHER_IDS_OFFSET = 1_000_000_000
# The default dedicated uid and the one after it form the pool of a run that chose no ids of its own, so CI runs
# the tests that need two pairs; a second suite beside it picks ids of its own (CASEBOX_TEST_UID).
DEFAULT_POOL_SIZE = 2
SUITE_TMP_PREFIX = "casebox-suite-"


def pytest_configure(config):
    """Give this run a temporary directory of its own (sticky and world-writable like /tmp, since some tests
    run casebox as another user), inside the one it was given: the scratch directories, pytest's tmp_path and
    everything the CLI makes in TMPDIR are this suite's alone, so a listing of it never sees another suite
    (or another casebox) on the same machine, and `stage recover --all` never touches theirs."""
    private = tempfile.mkdtemp(prefix=SUITE_TMP_PREFIX)
    os.chmod(private, 0o1777)
    os.environ["TMPDIR"] = tempfile.tempdir = private
    config.casebox_suite_tmp = private


def pytest_sessionfinish(session, exitstatus):
    """A run that passed leaves nothing in TMPDIR; a failed one keeps its directory to look at, and so does any
    run with a mount still inside it (removing across a mount would empty the mount's source)."""
    private = getattr(session.config, "casebox_suite_tmp", None)
    if private is None or exitstatus != 0:
        return
    inside = private.rstrip("/") + "/"
    with open("/proc/self/mountinfo") as mountinfo:
        if any(line.split(" ")[4].startswith(inside) for line in mountinfo):
            return
    shutil.rmtree(private, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, config):
    private = getattr(config, "casebox_suite_tmp", None)
    if private is not None and os.path.isdir(private):
        terminalreporter.write_line(f"this run's TMPDIR is kept: {private}")


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root; CI runs the suite as root")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo() -> pathlib.Path:
    """The checkout under test."""
    return REPO


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


@pytest.fixture(scope="session")
def sandbox_pool_size() -> int:
    """How many consecutive (uid, gid) pairs from the dedicated pair this run may use as its sandbox pool
    (config sandbox_ids, verify --jobs): CASEBOX_TEST_IDS when set. Otherwise two with the default dedicated
    ids, whose neighbour is reserved for this pool, and one with a CASEBOX_TEST_UID of the caller's, whose
    neighbour may be another side-by-side suite's dedicated uid (the tests that need two pairs then skip)."""
    if "CASEBOX_TEST_IDS" in os.environ:
        return int(os.environ["CASEBOX_TEST_IDS"])
    return 1 if "CASEBOX_TEST_UID" in os.environ else DEFAULT_POOL_SIZE


@pytest.fixture(scope="session")
def other_ids(sandbox_ids) -> tuple[int, int]:
    """A (uid, gid) that is this run's too but not the dedicated pair: for a bystander process or a socket
    group. Far from the dedicated ids, so it is never another side-by-side suite's dedicated pair."""
    uid, gid = sandbox_ids
    return uid + OTHER_IDS_OFFSET, gid + OTHER_IDS_OFFSET


@pytest.fixture
def counted_reads(monkeypatch) -> list[int]:
    """The length of every ``os.pread`` from here on: for tests that bound how much of a file is read."""
    lengths: list[int] = []
    real_pread = os.pread

    def pread(fd: int, size: int, offset: int) -> bytes:
        data = real_pread(fd, size, offset)
        lengths.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", pread)
    return lengths


CASEBOX = REPO / ".venv" / "bin" / "casebox"


class CommandLine:
    """The installed ``casebox`` console script, run from outside as a user runs it."""

    @staticmethod
    def _run(argv: list[str], cwd: os.PathLike | str, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("timeout", 120)
        return subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, **kwargs)

    def __call__(self, *args: str, cwd: os.PathLike | str = REPO, **kwargs) -> subprocess.CompletedProcess:
        return self._run([str(CASEBOX), *args], cwd, **kwargs)

    def run_python(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        """The console script's own interpreter (.venv/bin/python) with ``args``."""
        return self._run([str(CASEBOX.parent / "python"), *args], REPO, **kwargs)

    def refused(self, *args: str, naming: str, **kwargs) -> str:
        """Run, check the F1 answer (exit 64, nothing on stdout, one sentence on stderr naming
        ``naming``, no traceback), and return the sentence."""
        result = self(*args, **kwargs)
        assert result.returncode == 64, result
        assert result.stdout == b""
        return self.one_sentence(result.stderr, naming)

    @staticmethod
    def one_sentence(stderr: bytes | str, naming: str) -> str:
        """The one line ``casebox: ... .`` that is all of ``stderr``, after checking it names ``naming``."""
        text = stderr.decode("utf-8") if isinstance(stderr, bytes) else stderr
        assert text.count("\n") == 1 and text.endswith(".\n"), text
        assert text.startswith("casebox: "), text
        assert "Traceback" not in text
        assert naming in text, text
        return text[len("casebox: ") : -1]


@pytest.fixture(scope="session")
def casebox() -> CommandLine:
    """Runs .venv/bin/casebox in a subprocess (scripts/bootstrap installs it)."""
    if not os.access(CASEBOX, os.X_OK):
        pytest.fail(f"{CASEBOX} is missing: run scripts/bootstrap first")
    return CommandLine()
