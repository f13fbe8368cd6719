"""Corpora and hostile layouts against the reader and extractor (DESIGN T4, T1, F3).

- Go's archive/tar test archives: every one is refused, each for a named rule.
- CPython's PEP 706 extraction-filter cases and jwilk's traversal-archives
  layouts, rebuilt by the tests' own forge: all refused, target left empty.
- Differential: whatever tarfile's data filter refuses, casebox refuses too.
- Every single-byte change of the golden bundle is refused.
"""

from __future__ import annotations

import bz2
import functools
import glob
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import tarforge
from executor.transport import bundle, extract, ustar
from executor.cli.main import main
from journal.errors import Refused

REPO = pathlib.Path(__file__).resolve().parent.parent
MAGIC = "magic and version"
PAX = "typeflag 'x' (pax extended header)"
PAX_GLOBAL = "typeflag 'g' (pax global header)"

# Every archive in go-archive-tar and the rule that refuses it. None passes: the
# closed profile needs the candidate/ directory, a manifest, and the fixed mode,
# owner, names, time and devices, and none of Go's archives has all of them.
# The clean ustar controls come closest and are refused for a fixed field:
# ustar.tar (uid 501), ustar-file-reg.tar (an empty devmajor field, not octal),
# ustar-file-devs.tar (devmajor 1), file-and-dir.tar (mode 0), writer.tar (mode 640).
GO_REFUSALS = {
    "file-and-dir.tar": "mode 0 is not the fixed 644",
    "gnu-incremental.tar": MAGIC,
    "gnu-long-nul.tar": MAGIC,
    "gnu-multi-hdrs.tar": MAGIC,
    "gnu-nil-sparse-data.tar": MAGIC,
    "gnu-nil-sparse-hole.tar": MAGIC,
    "gnu-not-utf8.tar": MAGIC,
    "gnu-sparse-big.tar": MAGIC,
    "gnu-utf8.tar": MAGIC,
    "gnu.tar": MAGIC,
    "hardlink.tar": "uid 1000 is not the fixed 0",
    "hdr-only.tar": MAGIC,
    "invalid-go17.tar": MAGIC,
    "issue10968.tar": MAGIC,
    "issue11169.tar": "not a whole number of 512-byte blocks",
    "issue12435.tar": MAGIC,
    "neg-size.tar": MAGIC,
    "nil-uid.tar": MAGIC,
    "pax-bad-hdr-file.tar": PAX,
    "pax-bad-hdr-large.tar.bz2": "not a whole number of 512-byte blocks",
    "pax-bad-mtime-file.tar": PAX,
    "pax-global-records.tar": PAX_GLOBAL,
    "pax-multi-hdrs.tar": PAX,
    "pax-nil-sparse-data.tar": PAX,
    "pax-nil-sparse-hole.tar": PAX,
    "pax-nul-path.tar": PAX,
    "pax-nul-xattrs.tar": PAX,
    "pax-path-hdr.tar": PAX,
    "pax-pos-size-file.tar": PAX,
    "pax-records.tar": PAX,
    "pax-sparse-big.tar": PAX,
    "pax.tar": PAX,
    "sparse-formats.tar": MAGIC,
    "star.tar": "chksum field is not 6 octal digits",
    "trailing-slash.tar": PAX,
    "ustar-file-devs.tar": "devmajor 1 is not the fixed 0",
    "ustar-file-reg.tar": "devmajor field is not 7 octal digits",
    "ustar.tar": "uid 501 is not the fixed 0",
    "v7.tar": MAGIC,
    "writer-big-long.tar": PAX,
    "writer-big.tar": MAGIC,
    "writer.tar": "mode 640 is not the fixed 644",
    "xattrs.tar": PAX,
}
GO_ACCEPTED: dict[str, str] = {}


def go_files(corpora: pathlib.Path) -> list[pathlib.Path]:
    return sorted((corpora / "go-archive-tar").glob("*.tar*"))


def test_the_table_covers_every_go_archive(corpora):
    """T4: no archive in the corpus goes unclassified, and the table names no missing file."""
    assert sorted(path.name for path in go_files(corpora)) == sorted({**GO_REFUSALS, **GO_ACCEPTED})


@pytest.mark.parametrize("name", sorted(GO_REFUSALS))
def test_every_go_archive_is_refused_with_64_and_its_rule(corpora, capsys, name):
    """T4, F1: `bundle check` refuses each Go archive with exit 64 and one sentence naming its rule."""
    code = main(["bundle", "check", str(corpora / "go-archive-tar" / name)])
    captured = capsys.readouterr()
    assert code == 64 and captured.out == ""
    assert captured.err.count("\n") == 1 and GO_REFUSALS[name] in captured.err, captured.err


def test_the_decompressed_oversized_pax_header_is_refused(corpora):
    """T4: CVE-2022-2879's oversized pax header, decompressed, is refused by its type before any record is read."""
    data = bz2.decompress((corpora / "go-archive-tar" / "pax-bad-hdr-large.tar.bz2").read_bytes())
    with pytest.raises(Refused, match=r"typeflag 'x'"):
        bundle.open_bundle(tarforge.memfd(data))


# --- hostile layouts --------------------------------------------------------

SYMLINK, HARDLINK, FILE, DIRECTORY, FIFO, CHAR, BLOCK = "2", "1", "0", "5", "6", "3", "4"

# (name, type, link target, extra raw fields): CPython's TestExtractionFilters cases.
PEP706 = {
    "absolute": [("/tmp/escaped.evil", FILE, "", {})],
    "parent_symlink": [("current", SYMLINK, ".", {}), ("parent", SYMLINK, "current/..", {}), ("parent/evil", FILE, "", {})],
    "parent_symlink2": [("current", SYMLINK, ".", {}), ("current/parent", SYMLINK, "..", {}), ("parent/evil", FILE, "", {})],
    "absolute_symlink": [("parent", SYMLINK, "/tmp/outerdir", {}), ("parent/evil", FILE, "", {})],
    "absolute_hardlink": [("parent", HARDLINK, "/tmp/outerdir/foo", {})],
    "sly_relative0": [("../moo", SYMLINK, "..//tmp/moo", {})],
    "sly_relative2": [("tmp/", DIRECTORY, "", {}), ("tmp/../../moo", SYMLINK, "tmp/../..//tmp/moo", {})],
    "deep_symlink": [
        ("targetdir/target", FILE, "", {}),
        ("linkdir/hardlink", HARDLINK, "targetdir/target", {}),
        ("linkdir/symlink", SYMLINK, "../targetdir/target", {}),
    ],
    "chains": [
        ("linkdir/symlink", SYMLINK, "hardlink", {}),
        ("symlink2", SYMLINK, "linkdir/../targetdir/target", {}),
        ("targetdir/target", FILE, "", {}),
        ("linkdir/hardlink", HARDLINK, "targetdir/target", {}),
    ],
    "modes_setuid_sticky": [("all_bits", FILE, "", {"mode": tarforge.octal(0o7777, 8)})],
    "modes_group_other_exec": [("exec_group_other", FILE, "", {"mode": tarforge.octal(0o677, 8)})],
    "pipe": [("foo", FIFO, "", {})],
    "char_device": [("foo", CHAR, "", {"devmajor": tarforge.octal(1, 8), "devminor": tarforge.octal(3, 8)})],
    "block_device": [("foo", BLOCK, "", {"devmajor": tarforge.octal(8, 8)})],
}
# jwilk/traversal-archives, tar flavour.
JWILK = {
    "absolute1": [("/tmp/moo", FILE, "", {})],
    "absolute2": [("//tmp/moo", FILE, "", {})],
    "relative0": [("../moo", FILE, "", {})],
    "relative2": [("tmp/../../moo", FILE, "", {})],
    "symlink": [("moo", SYMLINK, "/tmp/moo", {}), ("moo", FILE, "", {})],
    "dirsymlink": [("tmp", SYMLINK, "/tmp", {}), ("tmp/moo", FILE, "", {})],
    "dirsymlink2a": [("cur", SYMLINK, ".", {}), ("par", SYMLINK, "cur/..", {}), ("par/moo", FILE, "", {})],
    "dirsymlink2b": [("cur", SYMLINK, ".", {}), ("cur/par", SYMLINK, "..", {}), ("par/moo", FILE, "", {})],
}
# The rule each layout hits once it is moved inside candidate/ with the fixed fields.
EXPECTED = {
    "absolute": "absolute",
    "parent_symlink": "typeflag '2'",
    "parent_symlink2": "typeflag '2'",
    "absolute_symlink": "typeflag '2'",
    "absolute_hardlink": "typeflag '1'",
    "sly_relative0": "typeflag '2'",
    "sly_relative2": "typeflag '2'",
    "deep_symlink": "typeflag '1'",
    "chains": "typeflag '1'",
    "modes_setuid_sticky": "mode 7777 is not the fixed 644",
    "modes_group_other_exec": "mode 677 is not the fixed 644",
    "pipe": "typeflag '6'",
    "char_device": "typeflag '3'",
    "block_device": "typeflag '4'",
    "absolute1": "absolute",
    "absolute2": "absolute",
    "relative0": "'..' segment",
    "relative2": "'..' segment",
    "symlink": "typeflag '2'",
    "dirsymlink": "typeflag '2'",
    "dirsymlink2a": "typeflag '2'",
    "dirsymlink2b": "typeflag '2'",
}
LAYOUTS = {**PEP706, **JWILK}


def forge(name: str, kind: str, target: str, raw: dict) -> bytes:
    data = b"moo\n" if kind == FILE else b""
    return tarforge.member(name, data, typeflag=kind.encode(), linkname=target.encode(), **raw)


def as_found(layout) -> bytes:
    """The layout as its authors wrote it: bare names, in their order."""
    return tarforge.archive(*(forge(*entry) for entry in layout))


def inside_candidate(layout) -> bytes:
    """The layout moved into a profile bundle, so only its hostile part can refuse it."""
    extra = []
    for name, kind, target, raw in layout:
        moved = name if name.startswith("/") else f"candidate/{name}"
        extra.append((moved.rstrip("/"), forge(moved, kind, target, raw)))
    return tarforge.candidate(extra=tuple(extra))


def extract_refused(data: bytes) -> Refused:
    with tempfile.TemporaryDirectory() as target:
        archive_fd, target_fd = tarforge.memfd(data), os.open(target, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(Refused) as caught:
                extract.extract(archive_fd, target_fd)
        finally:
            os.close(archive_fd)
            os.close(target_fd)
        assert os.listdir(target) == []
    return caught.value


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_hostile_layouts_are_refused_as_found(name):
    """T4, F3: each PEP 706 case and jwilk layout, as published, is refused and the target stays empty."""
    extract_refused(as_found(LAYOUTS[name]))


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_hostile_layouts_inside_candidate_are_refused_for_their_hostile_part(name):
    """T4, F3: moved into a valid bundle, each layout is refused by the rule its attack needs."""
    refusal = extract_refused(inside_candidate(LAYOUTS[name]))
    assert EXPECTED[name] in refusal.sentence()


def test_the_benign_control_is_accepted():
    """T4: the PEP 706 benign file, as a listed wheel in a profile bundle, extracts."""
    with tempfile.TemporaryDirectory() as target:
        archive_fd, target_fd = tarforge.memfd(tarforge.candidate({"benign-1.0-py3-none-any.whl": b"benign"})), os.open(target, os.O_RDONLY | os.O_DIRECTORY)
        try:
            extract.extract(archive_fd, target_fd)
        finally:
            os.close(archive_fd)
            os.close(target_fd)
        assert sorted(os.listdir(os.path.join(target, "candidate"))) == ["benign-1.0-py3-none-any.whl", "manifest.json"]


# --- differential against tarfile's data filter ---------------------------

SEGMENTS = st.sampled_from(["candidate", "a", "A", "b", "..", ".", "", "x\\y", "\u00e9", "c\x01"])
ANY_NAME = st.builds(
    lambda lead, segments, trail: lead + "/".join(segments) + trail,
    st.sampled_from(["", "", "", "/", "//"]),
    st.lists(SEGMENTS, min_size=1, max_size=3),
    st.sampled_from(["", "", "/"]),
)
NAMES = st.one_of(st.builds("candidate/{}".format, SEGMENTS), ANY_NAME)
KINDS = st.sampled_from([FILE, FILE, FILE, DIRECTORY, SYMLINK, HARDLINK, FIFO, CHAR, "x", "g"])
LINKS = st.sampled_from(["", "candidate/a", "a", "../x", "../../x", "/etc/passwd", ".", "candidate"])
ENTRIES = st.builds(
    lambda head, rest, ordered: head + (sorted(rest) if ordered else rest),
    st.sampled_from([[("candidate", DIRECTORY, "")], []]),
    st.lists(st.tuples(NAMES, KINDS, LINKS), min_size=1, max_size=4),
    st.booleans(),
)


def differential_archive(entries) -> bytes:
    members = []
    for name, kind, target in entries:
        if kind == DIRECTORY and not name.endswith("/"):
            name += "/"
        members.append(forge(name, kind, target if kind in (SYMLINK, HARDLINK) else "", {}))
    return tarforge.archive(*members)


# The oracle: tarfile's data filter (PEP 706, CPython 3.11.4 and later), in a process of its own that answers
# one byte per archive (b"1": it did not extract). A FilterError, or tarfile failing in any other way: either
# way it did not extract.
ORACLE = """
import io, sys, tarfile, tempfile
read, write = sys.stdin.buffer.read, sys.stdout.buffer.write
while header := read(8):
    data = read(int.from_bytes(header, "big"))
    with tempfile.TemporaryDirectory() as target:
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
                archive.extractall(target, filter="data")
            write(b"0")
        except Exception:
            write(b"1")
    sys.stdout.buffer.flush()
"""
_HAS_DATA_FILTER = "import sys, tarfile; sys.exit(not hasattr(tarfile, 'data_filter'))"


def _filtering_python() -> str | None:
    """An interpreter whose tarfile has the data filter: this one, else the newest of this machine's pyenv
    CPythons (the distribution's 3.11.2 of Debian 12, which .venv may be built on, has none)."""
    candidates = [sys.executable, *sorted(glob.glob("/root/.pyenv/versions/3.1[1-9].*/bin/python3.1[1-9]"), reverse=True)]
    for candidate in candidates:
        if subprocess.run([candidate, "-I", "-S", "-c", _HAS_DATA_FILTER]).returncode == 0:
            return candidate
    return None


@functools.cache
def _oracle() -> subprocess.Popen:
    python = _filtering_python()
    if python is None:
        pytest.skip("no interpreter here has tarfile's data filter (CPython 3.11.4 and later), the oracle of T4's differential")
    return subprocess.Popen([python, "-I", "-S", "-c", ORACLE], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def tarfile_refuses(data: bytes) -> bool:
    oracle = _oracle()
    oracle.stdin.write(len(data).to_bytes(8, "big") + data)
    oracle.stdin.flush()
    answer = oracle.stdout.read(1)
    assert answer in (b"0", b"1"), f"the tarfile oracle answered {answer!r}"
    return answer == b"1"


def casebox_refuses(data: bytes) -> bool:
    """The header rules alone, without the manifest rule that would refuse nearly every draw."""
    try:
        ustar.scan(lambda offset, length: data[offset : offset + length], len(data))
    except Refused:
        return True
    return False


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ENTRIES)
def test_whatever_the_data_filter_refuses_casebox_refuses(entries):
    """T4: casebox's lexical preflight alone is at least as strict as tarfile's data filter."""
    data = differential_archive(entries)
    tarfile_said, casebox_said = tarfile_refuses(data), casebox_refuses(data)
    event(f"tarfile {'refuses' if tarfile_said else 'accepts'}, casebox {'refuses' if casebox_said else 'accepts'}")
    if tarfile_said:
        assert casebox_said


def test_the_differential_generator_reaches_archives_both_accept():
    """T4: the generator is not trivially refused: a profile-shaped draw passes both sides."""
    data = differential_archive([("candidate", DIRECTORY, ""), ("candidate/a", FILE, "")])
    assert not tarfile_refuses(data) and not casebox_refuses(data)
    hostile = differential_archive([("candidate", DIRECTORY, ""), ("candidate/a", SYMLINK, "../../etc")])
    assert tarfile_refuses(hostile) and casebox_refuses(hostile)


# --- every byte is bound ------------------------------------------------------


def test_every_single_byte_change_of_the_golden_bundle_is_refused():
    """T1, T4: the reader accepts one encoding per candidate, so any flipped bit is refused."""
    golden = (REPO / "golden" / "transport" / "candidate.tar").read_bytes()
    fd = tarforge.memfd(golden)
    try:
        accepted = []
        for offset in range(len(golden)):
            original = golden[offset : offset + 1]
            os.pwrite(fd, bytes([original[0] ^ 0x01]), offset)
            try:
                bundle.identity_of(bundle.open_bundle(fd))
                accepted.append(offset)
            except Refused:
                pass
            os.pwrite(fd, original, offset)
        assert accepted == []
        bundle.identity_of(bundle.open_bundle(fd))
    finally:
        os.close(fd)
