"""The closed ustar profile and its lexical preflight (DESIGN T1, T2, T4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tarforge
from executor.transport import ustar
from journal.errors import Refused


def scan(data: bytes):
    return ustar.scan(lambda offset, length: data[offset : offset + length], len(data))


def refused(data: bytes, rule: str) -> Refused:
    with pytest.raises(Refused, match=rule) as caught:
        scan(data)
    return caught.value


def with_member(block: bytes) -> bytes:
    """The forge's good bundle with one more member sorted in."""
    name = block[:100].rstrip(b"\x00").decode("latin-1")
    return tarforge.candidate(extra=((name, block),))


def test_a_profile_bundle_is_accepted_with_its_members():
    """T1: the forge's closed-profile bundle scans to its sorted members."""
    members = scan(tarforge.candidate())
    assert [(m.path, m.directory) for m in members] == [
        ("candidate", True),
        ("candidate/demo-1.0-py3-none-any.whl", False),
        ("candidate/manifest.json", False),
    ]
    assert members[1].data_offset == 512 * 2 and members[1].size == len(b"wheel bytes\n")


# --- magic, version, checksum -----------------------------------------------


@pytest.mark.parametrize("magic, version", [(b"ustar ", b" \x00"), (b"ustar\x00", b"01"), (b"\x00" * 6, b"\x00\x00")])
def test_bad_magic_or_version_is_refused(magic, version):
    """T4: only ustar's magic 'ustar\\0' and version '00' (GNU and v7 headers are refused)."""
    refused(tarforge.archive(tarforge.directory("candidate/", magic=magic, version=version)), "magic and version")


def test_bad_checksum_is_refused():
    """T4: a header whose checksum does not match its bytes."""
    block = bytearray(tarforge.directory("candidate/"))
    block[0] = ord("C")
    refused(tarforge.archive(bytes(block)), "checksum does not match")


@pytest.mark.parametrize("chksum", [b"0123 5\x00 ", b"012345 \x00", b"\x80\x00\x00\x00\x00\x00\x00 "])
def test_checksum_field_not_octal_is_refused(chksum):
    """T4: the chksum field is six octal digits, a NUL and a space."""
    refused(tarforge.archive(tarforge.directory("candidate/", chksum=chksum)), "chksum field")


# --- numbers and fixed fields -----------------------------------------------


@pytest.mark.parametrize("field", ["mode", "uid", "gid", "size", "mtime", "devmajor", "devminor"])
def test_non_octal_numeric_field_is_refused(field):
    """T4: every numeric field is octal digits and a NUL; spaces or letters are refused."""
    width = tarforge.OFFSETS[field][1]
    value = b" " * (width - 2) + b"0\x00"
    refused(with_member(tarforge.member("candidate/x", **{field: value})), f"the {field} field is not")


@pytest.mark.parametrize("field", ["size", "uid", "mtime"])
def test_base256_number_is_refused(field):
    """T4: GNU base-256 numbers are refused, positive or negative."""
    width = tarforge.OFFSETS[field][1]
    refused(with_member(tarforge.member("candidate/x", **{field: b"\x80" + bytes(width - 1)})), "base-256")
    refused(with_member(tarforge.member("candidate/x", **{field: b"\xff" * width})), "base-256")


@pytest.mark.parametrize(
    "field, value, rule",
    [
        ("mode", tarforge.octal(0o755, 8), "mode 755 is not the fixed 644"),
        ("mode", tarforge.octal(0o4644, 8), "mode 4644 is not the fixed 644"),
        ("uid", tarforge.octal(1000, 8), "uid 1000 is not the fixed 0"),
        ("gid", tarforge.octal(1000, 8), "gid 1000 is not the fixed 0"),
        ("mtime", tarforge.octal(1, 12), "mtime 1 is not the fixed 0"),
        ("devmajor", tarforge.octal(8, 8), "devmajor 8 is not the fixed 0"),
        ("devminor", tarforge.octal(1, 8), "devminor 1 is not the fixed 0"),
        ("uname", b"root", "the uname field must be empty"),
        ("gname", b"root", "the gname field must be empty"),
        ("linkname", b"candidate/y", "the linkname field must be empty"),
        ("pad", b"x", "the pad field must be empty"),
    ],
)
def test_fixed_field_with_another_value_is_refused(field, value, rule):
    """T1, T4: mode, owner, names, time and device numbers are fixed to what pack writes."""
    refused(with_member(tarforge.member("candidate/x", **{field: value})), rule)


def test_directory_mode_is_fixed_too():
    """T1, T4: a directory's mode is 755, not a file's 644."""
    refused(tarforge.archive(tarforge.directory("candidate/", mode=tarforge.octal(0o644, 8))), "mode 644 is not the fixed 755")


# --- types ------------------------------------------------------------------


@pytest.mark.parametrize("typeflag", [b"1", b"2", b"3", b"4", b"6", b"7", b"x", b"g", b"L", b"K", b"S", b"D", b"\x00", b"A"])
def test_every_type_but_regular_and_directory_is_refused(typeflag):
    """T4: links, devices, FIFOs, pax x/g, GNU L/K/S/D and the NUL type are refused."""
    refusal = refused(with_member(tarforge.member("candidate/x", typeflag=typeflag)), "typeflag")
    assert "only '0' regular file and '5' directory" in refusal.rule


def test_directory_with_nonzero_size_is_refused():
    """T4: a directory carries no data."""
    refused(tarforge.archive(tarforge.member("candidate/", bytes(512), typeflag=b"5")), "directory has size 512")


# --- names ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, rule",
    [
        (b"/candidate/x", "absolute"),
        (b"candidate/../x", "'..' segment"),
        (b"candidate/./x", "'.' segment"),
        (b"candidate//x", "empty segment"),
        (b"candidate/a\x01b", "control character"),
        (b"candidate/a\x7fb", "control character"),
        (b"candidate/a\\b", "backslash"),
        ("candidate/caf\u00e9".encode("utf-8"), "not ASCII"),
        (b"candidate/\xff", "not ASCII"),
        (b"other/x", "outside candidate/"),
        (b"candidatex/y", "outside candidate/"),
        (b"candidate", "candidate must be a directory"),
        (b"candidate/x/", "must not end with '/'"),
    ],
)
def test_bad_member_names_are_refused(name, rule):
    """T4: absolute, '..', '.', empty segments, control characters, backslashes, non-ASCII, outside candidate/."""
    refused(tarforge.archive(tarforge.directory("candidate/"), tarforge.member(name)), rule)


def test_directory_name_without_trailing_slash_is_refused():
    """T4: a directory is written with exactly one trailing '/'."""
    refused(tarforge.archive(tarforge.directory("candidate")), "must end with one '/'")


def test_nul_inside_a_name_is_refused():
    """T4: a NUL followed by more bytes would hide part of a name."""
    refused(tarforge.archive(tarforge.directory("candidate/"), tarforge.member(b"candidate/a\x00b")), "NUL byte followed")
    refused(tarforge.archive(tarforge.directory("candidate/", prefix=b"x\x00y")), "NUL byte followed")


def test_prefix_is_joined_to_the_name_before_the_rules():
    """T4: the prefix field is part of the name: a '..' hidden there is refused."""
    refused(tarforge.archive(tarforge.directory("candidate/"), tarforge.member(b"x", prefix=b"candidate/..")), "'..' segment")


def test_name_over_its_cap_is_refused():
    """T2: a joined name over PATH_MAX_BYTES is refused."""
    prefix = b"candidate/" + b"d" * 100
    refused(tarforge.archive(tarforge.directory("candidate/"), tarforge.member(b"e" * 20, prefix=prefix)), "128-byte cap")


def test_name_split_other_than_packs_is_refused():
    """T1: a short name moved into the prefix field is valid ustar but not the one encoding pack writes."""
    split = tarforge.member(b"demo-1.0-py3-none-any.whl", b"wheel bytes\n", prefix=b"candidate")
    data = tarforge.candidate()
    good = tarforge.member("candidate/demo-1.0-py3-none-any.whl", b"wheel bytes\n")
    refused(data.replace(good, split), "not in the one encoding pack writes")


# --- the listing ------------------------------------------------------------


def test_duplicate_is_refused():
    """T4: the same path twice."""
    refused(tarforge.archive(tarforge.directory("candidate/"), tarforge.member("candidate/a"), tarforge.member("candidate/a")), r"is a duplicate\.$")


def test_duplicate_after_normalization_is_refused():
    """T4: a file and a directory whose names differ only by the directory's trailing '/'."""
    refused(
        tarforge.archive(tarforge.directory("candidate/"), tarforge.member("candidate/a"), tarforge.directory("candidate/a/")),
        r"member candidate/a: is a duplicate\.$",
    )


def test_duplicate_after_case_folding_is_refused():
    """T4: names equal after case folding collide on a case-insensitive filesystem."""
    refused(
        tarforge.archive(tarforge.directory("candidate/"), tarforge.member("candidate/A"), tarforge.member("candidate/a")),
        "duplicate after case folding",
    )


def test_out_of_order_is_refused():
    """T1, T4: entries are sorted by path bytes."""
    refused(
        tarforge.archive(tarforge.directory("candidate/"), tarforge.member("candidate/b"), tarforge.member("candidate/a")),
        "out of sorted order",
    )


def test_missing_parent_directory_entry_is_refused():
    """T4: a file's parent directory has its own earlier entry."""
    refused(tarforge.archive(tarforge.member("candidate/x")), "parent directory entry candidate/ is missing")
    refused(
        tarforge.archive(tarforge.directory("candidate/"), tarforge.member("candidate/sub/x")),
        "parent directory entry candidate/sub/ is missing",
    )


def test_a_file_is_not_a_parent_directory():
    """T4: a regular file cannot stand in for its children's directory."""
    refused(
        tarforge.archive(tarforge.directory("candidate/"), tarforge.member("candidate/a"), tarforge.member("candidate/a/b")),
        "parent directory entry candidate/a/ is missing",
    )


def test_member_count_over_cap_is_refused_before_the_next_header_is_decoded():
    """T2: more than MAX_MEMBERS entries; the extra header is not even decoded."""
    members = [tarforge.directory("candidate/")] + [tarforge.member(f"candidate/{i}") for i in range(ustar.MAX_MEMBERS - 1)]
    members.append(b"garbage that is not a header".ljust(512, b"!"))
    refused(tarforge.archive(*members), f"more than {ustar.MAX_MEMBERS} members")


def test_member_size_over_cap_is_refused_before_reading():
    """T2: a header claiming more than the member cap is refused from the header alone."""
    block = tarforge.header("candidate/x", length=ustar.MEMBER_MAX_BYTES + 1)
    refused(tarforge.archive(tarforge.directory("candidate/"), block), "member cap")


class VirtualArchive:
    """A huge archive of a few headers and zeros, served without allocating it."""

    def __init__(self, size: int, blocks: dict[int, bytes]) -> None:
        self.size = size
        self.blocks = blocks
        self.largest_read = 0

    def read_at(self, offset: int, length: int) -> bytes:
        self.largest_read = max(self.largest_read, length)
        out = bytearray(max(0, min(length, self.size - offset)))
        for start, block in self.blocks.items():
            if start < offset + len(out) and offset < start + len(block):
                low = max(start, offset)
                high = min(start + len(block), offset + len(out))
                out[low - offset : high - offset] = block[low - start : high - start]
        return bytes(out)


def test_total_expanded_size_over_cap_is_refused():
    """T2: four members that each fit the member cap but not the total cap together."""
    each = 50 * 1024 * 1024
    blocks = {0: tarforge.header("candidate/", typeflag=b"5")}
    offset = 512
    for index in range(4):
        blocks[offset] = tarforge.header(f"candidate/{index}", length=each)
        offset += 512 + each
    virtual = VirtualArchive(ustar.round_up(offset + 1024, 10240), blocks)
    with pytest.raises(Refused, match="total cap"):
        ustar.scan(virtual.read_at, virtual.size)
    assert virtual.largest_read <= 10240


def test_archive_over_cap_is_refused_without_reading():
    """T2: the archive size is checked before the first read."""
    with pytest.raises(Refused, match="over the 268435456-byte cap"):
        ustar.scan(lambda offset, length: pytest.fail("read before the size check"), ustar.ARCHIVE_MAX_BYTES + 512)


# --- the end of the archive -------------------------------------------------


def test_data_after_the_end_of_archive_blocks_is_refused():
    """T4: bytes hidden after the two zero blocks."""
    data = bytearray(tarforge.candidate())
    data[-1] = 1
    refused(bytes(data), "data follows the end-of-archive blocks")


def test_more_than_one_record_of_zero_padding_is_refused():
    """T1: padding is exactly up to the next 10,240-byte record."""
    refused(tarforge.candidate() + bytes(10240), "data follows the zero padding")


def test_missing_record_padding_is_refused():
    """T1: the archive is padded to a whole record."""
    refused(tarforge.candidate()[:-512], "not padded with zeros to a whole 10,240-byte record")


def test_a_single_zero_block_then_a_header_is_refused():
    """T4: a lone zero block cannot hide members after it."""
    body = tarforge.directory("candidate/") + bytes(512) + tarforge.member("candidate/x")
    refused(body + bytes(-len(body) % 10240), "one zero block, not two")


def test_archive_without_end_blocks_is_refused():
    """T4: an archive that stops after its last member."""
    refused(tarforge.directory("candidate/"), "ends before its end-of-archive blocks")


def test_archive_not_a_whole_number_of_blocks_is_refused():
    """T4: a trailing partial block."""
    refused(tarforge.candidate() + b"x", "not a whole number of 512-byte blocks")


@pytest.mark.parametrize("length", [20000, 20480])
def test_truncated_member_is_refused(length):
    """T4: a member whose data runs past the end of the archive, whether or not it ends on a block."""
    block = tarforge.header("candidate/x", length=length)
    refused(tarforge.directory("candidate/") + block + bytes(1024) + bytes(10240 - 2048), "its data runs past the end")


def test_nonzero_padding_after_member_data_is_refused():
    """T1: the bytes between a member's data and its next block are zero."""
    data = bytearray(tarforge.candidate())
    data[512 * 2 + len(b"wheel bytes\n")] = 0x41
    refused(bytes(data), "padding after its data is not zero")


# --- the encoder ------------------------------------------------------------

SEGMENT = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+", min_size=1, max_size=40).filter(
    lambda segment: segment not in (".", "..")
)


@given(st.lists(SEGMENT, min_size=1, max_size=3), st.booleans(), st.integers(min_value=0, max_value=ustar.MEMBER_MAX_BYTES))
def test_encoded_headers_decode_to_themselves(segments, directory, size):
    """T1: every header pack can write is accepted and decodes to the same member."""
    path = "/".join(["candidate", *segments])
    raw = (path + "/" if directory else path).encode()
    if len(raw) > ustar.PATH_MAX_BYTES or len(segments[-1]) + (1 if directory else 0) > 100:
        return
    size = 0 if directory else size
    header = ustar.encode_header(path, directory=directory, size=size)
    assert ustar.decode_header(header, 0) == ustar.Member(path, directory, size, 512)
    prefix, _, name = path.encode().rpartition(b"/") if len(raw) > 100 else (b"", b"", path.encode())
    forged = tarforge.header(name + b"/" if directory else name, typeflag=b"5" if directory else b"0", length=size, prefix=prefix)
    assert header == forged


def test_a_long_directory_name_splits_before_its_own_slash():
    """T1: a directory path over 100 bytes keeps its trailing '/' in the name field."""
    path = "candidate/" + "d" * 60 + "/" + "e" * 40
    header = ustar.encode_header(path, directory=True, size=0)
    assert header[345:500].rstrip(b"\x00") == ("candidate/" + "d" * 60).encode()
    assert header[:100].rstrip(b"\x00") == b"e" * 40 + b"/"
    assert ustar.decode_header(header, 0).path == path
