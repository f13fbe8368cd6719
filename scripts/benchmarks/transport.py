"""Transport throughput: extracting a three-wheel bundle, and the candidate identity digest.

- extract: MB/s of executor.transport.extract on a bundle of three ~20 MB wheels, against
  `tar -xf` of the same bundle into the same filesystem (goal: at least 0.8x).
- identity_digest: MB/s of the identity digest over the extracted files, against
  hashlib.sha256 streaming the same files (goal: at least 0.9x).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import io
import os
import pathlib
import shutil
import statistics
import subprocess
import tempfile
import time
import zipfile

from executor.transport import extract, identity, pack

WHEEL_BYTES = 20 * 1000 * 1000
REPEAT = 7
CHUNK = 1 << 20


def _wheel(name: str, seed: int) -> tuple[str, bytes]:
    out = io.BytesIO()
    payload = hashlib.shake_256(seed.to_bytes(4, "big")).digest(WHEEL_BYTES)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        archive.writestr(f"{name}/blob.bin", payload)
    return f"{name}-1.0-py3-none-any.whl", out.getvalue()


@functools.lru_cache(maxsize=1)
def _workspace() -> tuple[pathlib.Path, int]:
    root = pathlib.Path(tempfile.mkdtemp(prefix="casebox-bench-transport-"))
    atexit.register(shutil.rmtree, root, True)
    wheels = [_wheel(name, seed) for seed, name in enumerate(("alpha", "beta", "gamma"))]
    (root / "candidate.tar").write_bytes(pack.build(wheels))
    return root, sum(len(data) for _, data in wheels)


def _fresh(root: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(dir=root))


def _discard(path: pathlib.Path) -> None:
    for directory in [path, *(p for p in path.rglob("*") if p.is_dir())]:
        os.chmod(directory, 0o755)
    shutil.rmtree(path)


def _casebox_extract(root: pathlib.Path, target: pathlib.Path) -> None:
    archive_fd = os.open(root / "candidate.tar", os.O_RDONLY)
    target_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        extract.extract(archive_fd, target_fd)
    finally:
        os.close(archive_fd)
        os.close(target_fd)


def _tar_extract(root: pathlib.Path, target: pathlib.Path) -> None:
    subprocess.run(["tar", "-xf", str(root / "candidate.tar"), "-C", str(target)], check=True)


def _timed_into_fresh(root: pathlib.Path, function) -> float:
    target = _fresh(root)
    start = time.perf_counter()
    function(root, target)
    elapsed = time.perf_counter() - start
    _discard(target)
    return elapsed


def extract_mb_s() -> dict:
    root, payload = _workspace()
    megabytes = payload / 1e6
    # Alternate the two so that both see the same load on a shared machine.
    samples: dict = {_casebox_extract: [], _tar_extract: []}
    for index in range(REPEAT + 1):
        for function, times in samples.items():
            elapsed = _timed_into_fresh(root, function)
            if index:
                times.append(elapsed)
    ours, theirs = (statistics.median(times) for times in samples.values())
    return {
        "metric": "extract",
        "value": round(megabytes / ours, 1),
        "unit": "MB/s",
        "anchor": "tar -xf of the same bundle",
        "anchor_value": round(megabytes / theirs, 1),
    }


def _sha256_files(directory: pathlib.Path) -> None:
    for path in sorted(directory.iterdir()):
        hasher = hashlib.sha256()
        with open(path, "rb", buffering=0) as handle:
            while chunk := handle.read(CHUNK):
                hasher.update(chunk)


def _identity(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        identity.digest_directory(fd)
    finally:
        os.close(fd)


def identity_digest_mb_s() -> dict:
    root, _ = _workspace()
    target = _fresh(root)
    _casebox_extract(root, target)
    candidate = target / "candidate"
    megabytes = sum(path.stat().st_size for path in candidate.iterdir()) / 1e6
    samples: dict = {_identity: [], _sha256_files: []}
    for index in range(REPEAT + 1):
        for function, times in samples.items():
            start = time.perf_counter()
            function(candidate)
            if index:
                times.append(time.perf_counter() - start)
    ours, anchor = (statistics.median(times) for times in samples.values())
    _discard(target)
    return {
        "metric": "identity_digest",
        "value": round(megabytes / ours, 1),
        "unit": "MB/s",
        "anchor": "hashlib.sha256 streaming the same files",
        "anchor_value": round(megabytes / anchor, 1),
    }


METRICS = {"extract": extract_mb_s, "identity_digest": identity_digest_mb_s}
