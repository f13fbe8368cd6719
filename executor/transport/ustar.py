"""The candidate transport format: closed POSIX ustar, its bounds, and the lexical preflight.

docs/transport.md is the specification. ``pack`` writes exactly one encoding per
set of members, and the reader accepts exactly that encoding: every header is
decoded field by field, each rule refusing with its own sentence, and is then
re-encoded and compared byte for byte. Member data padding, the end-of-archive
blocks and the record padding must be zero, so every byte of an accepted
archive is bound to its content (DESIGN T1, T4).

The preflight reads headers and padding only, through ``read_at``; it never
reads member data and never writes. Every bound (DESIGN T2) is checked before
a read goes past it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from journal.errors import Refused

BLOCK = 512
RECORD = 10_240
TOP = "candidate"

# DESIGN T2. The archive cap admits three wheels at the member cap's
# three-quarters; the total cap is what the three largest members can expand to.
ARCHIVE_MAX_BYTES = 256 * 1024 * 1024
MEMBER_MAX_BYTES = 64 * 1024 * 1024
TOTAL_MAX_BYTES = 192 * 1024 * 1024
# candidate/, candidate/manifest.json and at most three wheels.
MAX_MEMBERS = 5
PATH_MAX_BYTES = 128

FILE_MODE = 0o644
DIRECTORY_MODE = 0o755
MAGIC = b"ustar\x00"
VERSION = b"00"
REGULAR = b"0"
DIRECTORY = b"5"

# (name, offset, width) of every header field, in header order.
_FIELDS = (
    ("name", 0, 100),
    ("mode", 100, 8),
    ("uid", 108, 8),
    ("gid", 116, 8),
    ("size", 124, 12),
    ("mtime", 136, 12),
    ("chksum", 148, 8),
    ("typeflag", 156, 1),
    ("linkname", 157, 100),
    ("magic", 257, 6),
    ("version", 263, 2),
    ("uname", 265, 32),
    ("gname", 297, 32),
    ("devmajor", 329, 8),
    ("devminor", 337, 8),
    ("prefix", 345, 155),
    ("pad", 500, 12),
)
FIELD = {name: slice(offset, offset + width) for name, offset, width in _FIELDS}
NUMERIC_FIELDS = ("mode", "uid", "gid", "size", "mtime", "devmajor", "devminor")
# The fields pack always writes with one value, and the value as an integer or bytes.
FIXED_NUMBERS = {"uid": 0, "gid": 0, "mtime": 0, "devmajor": 0, "devminor": 0}
EMPTY_TEXT_FIELDS = ("linkname", "uname", "gname", "pad")

_TYPE_NAMES = {
    b"\x00": "NUL (old regular file)",
    b"1": "'1' (hard link)",
    b"2": "'2' (symbolic link)",
    b"3": "'3' (character device)",
    b"4": "'4' (block device)",
    b"6": "'6' (FIFO)",
    b"7": "'7' (contiguous file)",
    b"x": "'x' (pax extended header)",
    b"g": "'g' (pax global header)",
    b"L": "'L' (GNU long name)",
    b"K": "'K' (GNU long link name)",
    b"S": "'S' (GNU sparse file)",
    b"D": "'D' (GNU directory dump)",
}
_ZERO_BLOCK = bytes(BLOCK)


@dataclasses.dataclass(frozen=True)
class Member:
    """One accepted entry: its normalized path, kind, size and where its data starts."""

    path: str
    directory: bool
    size: int
    data_offset: int


def round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def fold(path: str) -> str:
    """The key under which two paths collide on a case-insensitive filesystem."""
    return path.casefold()


def shown(raw: bytes) -> str:
    """Untrusted name bytes made printable for a refusal sentence."""
    text = raw.decode("ascii", "backslashreplace")
    return "".join(char if " " <= char <= "~" else f"\\x{ord(char):02x}" for char in text)[:160]


# --- names -------------------------------------------------------------------


def check_relative_path(path: str, where: str) -> str:
    """The one lexical rule for a relative path: ASCII, printable, no backslash, clean segments."""
    if not path:
        raise Refused(where, "the name is empty")
    if not path.isascii():
        raise Refused(where, "the name is not ASCII")
    if any(char < " " or char == "\x7f" for char in path):
        raise Refused(where, "the name contains a control character")
    if "\\" in path:
        raise Refused(where, "the name contains a backslash")
    if path.startswith("/"):
        raise Refused(where, "the name is absolute")
    for segment in path.split("/"):
        if segment == "":
            raise Refused(where, "the name has an empty segment")
        if segment in (".", ".."):
            raise Refused(where, f"the name has a {segment!r} segment")
    return path


def check_member_path(raw: bytes, *, directory: bool, where: str) -> str:
    """The normalized path of a member name (prefix joined), or a refusal (DESIGN T4).

    Used by ``pack`` on the names it writes and by the reader on every header.
    A directory is written with one trailing slash, which normalization drops.
    """
    if len(raw) > PATH_MAX_BYTES:
        raise Refused(where, f"the name is {len(raw)} bytes, over the {PATH_MAX_BYTES}-byte cap")
    text = raw.decode("latin-1")
    if directory:
        if not text.endswith("/"):
            raise Refused(where, "a directory name must end with one '/'")
        text = text[:-1]
    elif text.endswith("/"):
        raise Refused(where, "a regular file name must not end with '/'")
    path = check_relative_path(text, where)
    top, _, rest = path.partition("/")
    if top != TOP:
        raise Refused(where, f"the name falls outside {TOP}/")
    if not rest and not directory:
        raise Refused(where, f"{TOP} must be a directory")
    return path


# --- encoding ----------------------------------------------------------------


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\x00" % (width - 1, value)


def _split_name(name: bytes) -> tuple[bytes, bytes]:
    """(prefix, name): the name field alone when it fits, else split at the last '/' but a directory's own."""
    if len(name) <= 100:
        return b"", name
    cut = name.rfind(b"/", 0, len(name) - 1)
    prefix, last = name[:cut], name[cut + 1 :]
    if cut < 0 or len(prefix) > 155 or len(last) > 100:
        # check_member_path's cap and the wheel-name rule keep every caller inside these limits.
        raise ValueError(f"{name!r} does not fit ustar's prefix and name fields")
    return prefix, last


def checksum(header: bytes) -> int:
    """The ustar header checksum: the byte sum with the checksum field read as spaces."""
    return sum(header[:148]) + 8 * 0x20 + sum(header[156:])


def encode_header(path: str, *, directory: bool, size: int) -> bytes:
    """The one header pack writes for a normalized member path."""
    name = (path + "/" if directory else path).encode("ascii")
    prefix, name_field = _split_name(name)
    header = bytearray(BLOCK)
    header[FIELD["name"]] = name_field.ljust(100, b"\x00")
    header[FIELD["mode"]] = _octal(DIRECTORY_MODE if directory else FILE_MODE, 8)
    for field in ("uid", "gid", "devmajor", "devminor"):
        header[FIELD[field]] = _octal(0, 8)
    header[FIELD["size"]] = _octal(size, 12)
    header[FIELD["mtime"]] = _octal(0, 12)
    header[FIELD["typeflag"]] = DIRECTORY if directory else REGULAR
    header[FIELD["magic"]] = MAGIC
    header[FIELD["version"]] = VERSION
    header[FIELD["prefix"]] = prefix.ljust(155, b"\x00")
    header[FIELD["chksum"]] = b"%06o\x00 " % checksum(header)
    return bytes(header)


def end_of_archive(length: int) -> bytes:
    """The two zero blocks and the zero padding that close an archive of ``length`` bytes of entries."""
    return bytes(round_up(length + 2 * BLOCK, RECORD) - length)


# --- decoding ----------------------------------------------------------------


def _number(header: bytes, field: str, where: str) -> int:
    raw = header[FIELD[field]]
    if raw[0] & 0x80:
        raise Refused(where, f"the {field} field is a base-256 number; only octal is allowed")
    digits, terminator = raw[:-1], raw[-1:]
    if terminator != b"\x00" or digits.strip(b"01234567"):
        raise Refused(where, f"the {field} field is not {len(raw) - 1} octal digits and a NUL")
    return int(digits, 8)


def _text(header: bytes, field: str, where: str) -> bytes:
    """A NUL-padded text field; bytes hidden after its terminator are refused."""
    raw = header[FIELD[field]]
    value, nul, rest = raw.partition(b"\x00")
    if nul and rest.strip(b"\x00"):
        raise Refused(where, f"the {field} field contains a NUL byte followed by more bytes")
    return value


def decode_header(header: bytes, offset: int) -> Member:
    """One header's member, or a refusal naming the rule; ``offset`` is where it starts."""
    at = f"header at byte {offset}"
    if header[FIELD["magic"]] != MAGIC or header[FIELD["version"]] != VERSION:
        raise Refused(at, "the magic and version are not ustar's 'ustar\\0' and '00'")
    stored = header[FIELD["chksum"]]
    if stored[6:] != b"\x00 " or stored[:6].strip(b"01234567"):
        raise Refused(at, "the chksum field is not 6 octal digits, a NUL and a space")
    if int(stored[:6], 8) != checksum(header):
        raise Refused(at, "the header checksum does not match")

    prefix = _text(header, "prefix", at)
    name = _text(header, "name", at)
    raw_name = prefix + b"/" + name if prefix else name
    where = f"member {shown(raw_name)}"
    typeflag = header[FIELD["typeflag"]]
    if typeflag not in (REGULAR, DIRECTORY):
        kind = _TYPE_NAMES.get(typeflag, repr(typeflag.decode("latin-1")))
        raise Refused(where, f"typeflag {kind} is not allowed; only '0' regular file and '5' directory are")
    directory = typeflag == DIRECTORY
    numbers = {field: _number(header, field, where) for field in NUMERIC_FIELDS}

    expected_mode = DIRECTORY_MODE if directory else FILE_MODE
    if numbers["mode"] != expected_mode:
        raise Refused(where, f"mode {numbers['mode']:o} is not the fixed {expected_mode:o}")
    for field, value in FIXED_NUMBERS.items():
        if numbers[field] != value:
            raise Refused(where, f"{field} {numbers[field]} is not the fixed {value}")
    for field in EMPTY_TEXT_FIELDS:
        if header[FIELD[field]].strip(b"\x00"):
            raise Refused(where, f"the {field} field must be empty")

    size = numbers["size"]
    if directory and size:
        raise Refused(where, f"a directory has size {size}; it must be 0")
    if size > MEMBER_MAX_BYTES:
        raise Refused(where, f"the size {size} is over the {MEMBER_MAX_BYTES}-byte member cap")

    path = check_member_path(raw_name, directory=directory, where=where)
    if encode_header(path, directory=directory, size=size) != header:
        raise Refused(where, "the header is not in the one encoding pack writes")
    return Member(path, directory, size, offset + BLOCK)


# --- the lexical preflight ---------------------------------------------------


class _Listing:
    """The order, duplicate and parent rules across members."""

    def __init__(self) -> None:
        self.members: list[Member] = []
        self.folded: set[str] = set()
        self.directories: set[str] = set()
        self.total = 0

    def add(self, member: Member) -> None:
        where = f"member {member.path}"
        previous = self.members[-1].path if self.members else None
        if member.path == previous or fold(member.path) in self.folded:
            rule = "is a duplicate" if member.path == previous else "is a duplicate after case folding"
            raise Refused(where, rule)
        if previous is not None and member.path.encode("ascii") < previous.encode("ascii"):
            raise Refused(where, f"is out of sorted order (after {previous})")
        parent = member.path.rpartition("/")[0]
        if parent and parent not in self.directories:
            raise Refused(where, f"its parent directory entry {parent}/ is missing")
        self.total += member.size
        if self.total > TOTAL_MAX_BYTES:
            raise Refused(where, f"the members expand to more than the {TOTAL_MAX_BYTES}-byte total cap")
        self.members.append(member)
        self.folded.add(fold(member.path))
        if member.directory:
            self.directories.add(member.path)


def _require_zero(read_at: Callable[[int, int], bytes], start: int, end: int, where: str, rule: str) -> None:
    while start < end:
        length = min(end - start, RECORD)
        chunk = read_at(start, length)
        if len(chunk) != length:
            raise Refused(where, "the archive is truncated")
        if chunk.strip(b"\x00"):
            raise Refused(where, rule)
        start += length


def scan(read_at: Callable[[int, int], bytes], archive_size: int) -> tuple[Member, ...]:
    """Every member of the archive, after every header and all padding passed (DESIGN T2, T4)."""
    if archive_size > ARCHIVE_MAX_BYTES:
        raise Refused("the archive", f"is {archive_size} bytes, over the {ARCHIVE_MAX_BYTES}-byte cap")
    if archive_size % BLOCK:
        raise Refused("the archive", f"is {archive_size} bytes, not a whole number of {BLOCK}-byte blocks")
    listing = _Listing()
    offset = 0
    while True:
        if offset + BLOCK > archive_size:
            raise Refused(f"header at byte {offset}", "the archive ends before its end-of-archive blocks")
        header = read_at(offset, BLOCK)
        if len(header) != BLOCK:
            raise Refused(f"header at byte {offset}", "the archive is truncated")
        if header == _ZERO_BLOCK:
            break
        if len(listing.members) == MAX_MEMBERS:
            raise Refused(f"header at byte {offset}", f"the archive has more than {MAX_MEMBERS} members")
        member = decode_header(header, offset)
        data_end = member.data_offset + member.size
        if data_end > archive_size:
            raise Refused(f"member {member.path}", "the member is truncated: its data runs past the end of the archive")
        listing.add(member)
        padded_end = round_up(data_end, BLOCK)
        _require_zero(read_at, data_end, padded_end, f"member {member.path}", "the padding after its data is not zero")
        offset = padded_end
    end = offset + 2 * BLOCK
    if end > archive_size:
        raise Refused(f"header at byte {offset}", "the end-of-archive marker is one zero block, not two")
    _require_zero(read_at, offset + BLOCK, end, f"header at byte {offset + BLOCK}", "the end-of-archive marker is one zero block, not two")
    record_end = round_up(end, RECORD)
    _require_zero(
        read_at, end, min(archive_size, record_end), f"byte {end}", "data follows the end-of-archive blocks"
    )
    if archive_size > record_end:
        raise Refused(f"byte {record_end}", "data follows the zero padding of the last 10,240-byte record")
    if archive_size < record_end:
        raise Refused("the archive", f"is not padded with zeros to a whole 10,240-byte record ({record_end} bytes)")
    return tuple(listing.members)
