"""SHA-256 of a descriptor's bytes, for the launcher's self-checks (S1, S3).

The C module is imported directly: ``hashlib`` pulls in OpenSSL and costs
about 2.6 ms of the launcher's start, twice per sandbox. Python 3.12 renamed
``_sha256`` to ``_sha2``. A caller that has OpenSSL loaded anyway (the
steward) passes ``hashlib.sha256``: it digests the launcher in a tenth of the
time (0.1 against 0.9 ms for its ~180 KB on 3.11).
"""

import os

try:
    from _sha2 import sha256
except ImportError:
    from _sha256 import sha256

_CHUNK = 1 << 16


def sha256_of_fd(fd: int, new=sha256) -> bytes:
    """The digest of every byte of ``fd`` from offset 0, read with pread (the offset is untouched); ``new``
    makes the SHA-256 state."""
    state = new()
    offset = 0
    while True:
        chunk = os.pread(fd, _CHUNK, offset)
        if not chunk:
            return state.digest()
        state.update(chunk)
        offset += len(chunk)
