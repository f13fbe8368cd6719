"""Content-addressed evidence documents inside a stage: ``documents/<sha256 hex>``.

Every digest the steward binds into the journal or the seal marker (the
process and mount inventories, each helper response, each sealed output's
inventory) names a document whose bytes hash to it. The document is kept in
the stage, so the tombstone carries it and a reviewer can recompute every
digest. A document is created once (E4): identical bytes under the same name
are accepted, as a retry after a crash writes exactly them again.
"""

from __future__ import annotations

import hashlib

from journal.createonly import publish_once
from journal.strictjson import canonical

DOCUMENTS = "documents"
DOCUMENT_MODE = 0o400


def digest(data: bytes) -> str:
    """The lowercase hex SHA-256 of ``data``: a document's name and the value the journal binds."""
    return hashlib.sha256(data).hexdigest()


def encode(value: object) -> tuple[bytes, str]:
    """The canonical bytes of ``value`` (D2) and their digest."""
    data = canonical(value)
    return data, digest(data)


def keep(documents_fd: int, data: bytes, *, shown: str) -> str:
    """Store ``data`` as ``documents/<digest>`` (create-once) and return the digest."""
    name = digest(data)
    publish_once(documents_fd, name, data, mode=DOCUMENT_MODE, shown=f"{shown}/{name}")
    return name
