"""Manifest v1 and the bundle reader's manifest check (DESIGN T5, T6, T4)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

import tarforge
from executor.transport import bundle, manifest, ustar
from journal.errors import Refused

DIGEST = hashlib.sha256(b"wheel bytes\n").hexdigest()


def document(**changes) -> dict:
    value = {"schema": "casebox.manifest.v1", "wheels": [{"file": tarforge.WHEEL, "sha256": DIGEST, "size": 12}]}
    value.update(changes)
    return value


def encoded(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def test_a_canonical_manifest_round_trips():
    """T5: the manifest's canonical bytes read back to the same manifest."""
    parsed = manifest.manifest_from_bytes(encoded(document()))
    assert parsed.wheels == (manifest.Wheel(tarforge.WHEEL, 12, DIGEST),)
    assert parsed.canonical_bytes() == encoded(document())


@pytest.mark.parametrize(
    "name",
    [
        "demo-1.0-py3-none-any.whl",
        "Demo_Pkg-2.0.post1+local.1-py2.py3-none-any.whl",
        "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "tool-0.1-1-py3-none-any.whl",
        "a-1!2.0-py3-none-any.whl",
    ],
)
def test_valid_wheel_names_pass(name):
    """T5: wheel file names follow name-version[-build]-python-abi-platform.whl."""
    assert manifest.check_wheel_name(name, "x") == name


@pytest.mark.parametrize(
    "name, rule",
    [
        ("caf\u00e9-1.0-py3-none-any.whl", "ASCII"),
        ("a" * 80 + "-1.0-py3-none-any.whl", "at most 100 bytes"),
        ("demo-1.0-py3-none.whl", "not a valid wheel file name"),
        ("demo-1.0-py3-none-any.WHL", "not a valid wheel file name"),
        ("demo-1.0-py3-none-any.zip", "not a valid wheel file name"),
        ("../x-1.0-py3-none-any.whl", "not a valid wheel file name"),
        ("sub/x-1.0-py3-none-any.whl", "not a valid wheel file name"),
        ("-x-1.0-py3-none-any.whl", "not a valid wheel file name"),
        ("demo-1.0-x-py3-none-any.whl", "not a valid wheel file name"),
        ("demo-1.0-py3-none-any.whl\n", "not a valid wheel file name"),
        ("manifest.json", "not a valid wheel file name"),
    ],
)
def test_invalid_wheel_names_are_refused(name, rule):
    """T5: a wheel file name that is not ASCII, too long or off the convention."""
    with pytest.raises(Refused, match=rule):
        manifest.check_wheel_name(name, "x")


@pytest.mark.parametrize(
    "value, rule",
    [
        (document(extra=1), r"\$\.extra: is not a known field"),
        ({"schema": "casebox.manifest.v1"}, r"\$\.wheels: is missing"),
        (document(schema="casebox.manifest.v2"), "must be 'casebox.manifest.v1'"),
        (document(wheels=[]), "must hold 1 to 3 items"),
        (document(wheels=[{"file": f"w{i}-1.0-py3-none-any.whl", "sha256": DIGEST, "size": 1} for i in range(4)]), "must hold 1 to 3 items"),
        (document(wheels=[{"file": tarforge.WHEEL, "sha256": DIGEST, "size": True}]), "must be an integer, not a bool"),
        (document(wheels=[{"file": tarforge.WHEEL, "sha256": DIGEST, "size": -1}]), "must be from 0"),
        (document(wheels=[{"file": tarforge.WHEEL, "sha256": DIGEST.upper(), "size": 1}]), "64 lowercase hex digits"),
        (document(wheels=[{"file": tarforge.WHEEL, "sha256": DIGEST, "size": 1, "note": ""}]), "is not a known field"),
        (
            document(wheels=[{"file": n, "sha256": DIGEST, "size": 1} for n in ("b-1-py3-none-any.whl", "a-1-py3-none-any.whl")]),
            "must be sorted by file name",
        ),
        (
            document(wheels=[{"file": n, "sha256": DIGEST, "size": 1} for n in ("A-1-py3-none-any.whl", "a-1-py3-none-any.whl")]),
            "without regard to case",
        ),
    ],
)
def test_manifest_outside_schema_v1_is_refused(value, rule):
    """T5: manifest v1 is closed: unknown, missing, mistyped, unsorted or duplicate entries are refused."""
    with pytest.raises(Refused, match=rule):
        manifest.manifest_from_bytes(encoded(value))


def test_non_canonical_manifest_bytes_are_refused():
    """T5, D2: the manifest in a bundle is in canonical form, so one candidate has one encoding."""
    with pytest.raises(Refused, match="not in canonical JSON form"):
        manifest.manifest_from_bytes(json.dumps(document()).encode())
    with pytest.raises(Refused, match="not in canonical JSON form"):
        manifest.manifest_from_bytes(encoded(document()) + b"\n")


def open_bytes(data: bytes) -> bundle.Bundle:
    return bundle.open_bundle(tarforge.memfd(data))


def test_bundle_without_manifest_is_refused():
    """T5: the manifest must be present."""
    data = tarforge.archive(tarforge.directory("candidate/"), tarforge.member(f"candidate/{tarforge.WHEEL}", b"x"))
    with pytest.raises(Refused, match="candidate/manifest.json: the manifest is missing"):
        open_bytes(data)


def test_manifest_as_a_directory_is_refused():
    """T5: the manifest is a regular file."""
    data = tarforge.archive(tarforge.directory("candidate/"), tarforge.directory("candidate/manifest.json/"))
    with pytest.raises(Refused, match="the manifest is missing"):
        open_bytes(data)


def test_manifest_over_its_cap_is_refused_before_it_is_read():
    """T2: the manifest's size comes from its header and is capped before the read."""
    data = tarforge.archive(tarforge.directory("candidate/"), tarforge.member("candidate/manifest.json", b" " * (manifest.MANIFEST_MAX_BYTES + 1)))
    with pytest.raises(Refused, match="manifest cap"):
        open_bytes(data)


def test_invalid_manifest_is_refused_naming_the_member_and_field():
    """T5, F1: the refusal names the manifest member and the JSON path."""
    data = tarforge.candidate(manifest=encoded(document(extra=1)))
    with pytest.raises(Refused, match=r"member candidate/manifest.json at \$\.extra: is not a known field"):
        open_bytes(data)


def test_file_not_listed_in_the_manifest_is_refused():
    """T5: no file may exist that the manifest does not list."""
    extra = ("candidate/other-1.0-py3-none-any.whl", tarforge.member("candidate/other-1.0-py3-none-any.whl", b"x"))
    with pytest.raises(Refused, match="other-1.0-py3-none-any.whl: is not listed in the manifest"):
        open_bytes(tarforge.candidate(extra=(extra,)))


def test_directory_not_listed_in_the_manifest_is_refused():
    """T5: nor any directory besides candidate/."""
    extra = ("candidate/sub", tarforge.directory("candidate/sub/"))
    with pytest.raises(Refused, match="candidate/sub: is not listed in the manifest"):
        open_bytes(tarforge.candidate(extra=(extra,)))


def test_listed_wheel_absent_from_the_archive_is_refused():
    """T5: every listed wheel is present."""
    data = tarforge.archive(
        tarforge.directory("candidate/"), tarforge.member("candidate/manifest.json", tarforge.manifest_bytes({tarforge.WHEEL: b"x"}))
    )
    with pytest.raises(Refused, match="listed in the manifest but absent"):
        open_bytes(data)


def test_wheel_size_other_than_listed_is_refused_before_any_data_is_read():
    """T5: the size check uses headers only."""
    data = tarforge.candidate(manifest=tarforge.manifest_bytes({tarforge.WHEEL: b"a different length"}))
    with pytest.raises(Refused, match="is 12 bytes but the manifest lists 18"):
        open_bytes(data)


def test_wheel_digest_other_than_listed_is_refused_as_it_streams():
    """T5: each wheel's sha256 must match; a digest inside the bundle binds only its own bytes (T6)."""
    data = tarforge.candidate(manifest=tarforge.manifest_bytes({tarforge.WHEEL: b"WHEEL BYTES\n"}))
    checked = open_bytes(data)
    buffer = memoryview(bytearray(4096))
    wheel = next(member for member in checked.members if member.path.endswith(".whl"))
    with pytest.raises(Refused, match=r"has sha256 [0-9a-f]{64}, not the [0-9a-f]{64} the manifest lists"):
        for _ in bundle.member_chunks(checked, wheel, buffer):
            pass


def test_archive_must_be_a_regular_file():
    """T2: the archive's size is known before any read, so it is a regular file."""
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(Refused, match="must be a regular file"):
            bundle.open_bundle(read_end)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_member_count_leaves_room_for_exactly_the_wheel_cap():
    """T2: candidate/, the manifest and MAX_WHEELS wheels are the member cap, and the caps nest."""
    assert ustar.MAX_MEMBERS == manifest.MAX_WHEELS + 2
    overhead = ustar.MAX_MEMBERS * 2 * ustar.BLOCK + ustar.RECORD
    assert ustar.TOTAL_MAX_BYTES + overhead <= ustar.ARCHIVE_MAX_BYTES
    assert manifest.MAX_WHEELS * ustar.MEMBER_MAX_BYTES <= ustar.TOTAL_MAX_BYTES
