"""SHA-256 of a descriptor's bytes, for the launcher's self-checks (S1, S3).

The C module is imported directly: ``hashlib`` pulls in OpenSSL and costs
about 2.6 ms of the launcher's start, twice per sandbox. Python 3.12 renamed
``_sha256`` to ``_sha2``.
"""

from __future__ import annotations

import os

try:
    from _sha2 import sha256
except ImportError:
    from _sha256 import sha256

_CHUNK = 1 << 16


def sha256_of_fd(fd: int) -> bytes:
    """The digest of every byte of ``fd`` from offset 0, read with pread (the offset is untouched)."""
    state = sha256()
    offset = 0
    while True:
        chunk = os.pread(fd, _CHUNK, offset)
        if not chunk:
            return state.digest()
        state.update(chunk)
        offset += len(chunk)
