"""A network index: the client that fetches pinned wheels in the fetch sandbox.

``casebox verify --index URL`` names a PEP 503/691 simple repository (the
URL rule is ``steward.forwarder.check_index_url``). pip's resolver reads the
index's pages in the resolver's sandbox (executor/deps/resolver.py). The fetch
sandbox then downloads exactly the ACKed pins with :class:`IndexClient`:
each file from the URL pip's report named, hashed as it is written, and
refused (``index_hash``) unless its bytes have the ACKed sha256. Its one way
out of the sandbox is the steward's forwarder, given on its command line as
its proxy (never taken from the environment). It sends no credential,
follows redirects only to http(s) without user information, verifies https
against the certificate bundle of the installer wheel, and caps every file.
"""

from __future__ import annotations

import hashlib
import os
from typing import Callable
from urllib.parse import urlsplit

SCHEMES = ("http", "https")
WHEEL_MAX_BYTES = 128 << 20
TIMEOUT_SECONDS = 60
USER_AGENT = "casebox-fetch"
CERTIFI = "pip/_vendor/certifi/cacert.pem"
_CHUNK = 1 << 16


def fetchable(url: str) -> bool:
    """A URL the client may open: http(s), a host, no user information."""
    try:
        parts = urlsplit(url)
        return parts.scheme in SCHEMES and bool(parts.hostname) and "@" not in parts.netloc
    except ValueError:
        return False


class IndexFailure(Exception):
    """The index could not be used: ``reason`` is ``index`` or ``index_hash``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class IndexClient:
    """Downloads pinned wheels from a network index, inside the fetch sandbox."""

    def __init__(self, *, cadata: str | None, proxy: str | None) -> None:
        import ssl
        import urllib.request

        context = ssl.create_default_context(cadata=cadata) if cadata else ssl.create_default_context()

        class Redirects(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, request, response, code, message, headers, new_url):
                if not fetchable(new_url):
                    raise IndexFailure("index", f"{request.full_url} redirects out of http(s) or to user information")
                return super().redirect_request(request, response, code, message, headers, new_url)

        # Only the proxy named (the forwarder, the sandbox's one way out), no credentials, no cookies: only these
        # handlers (and urllib's defaults for errors).
        proxies = {scheme: proxy for scheme in SCHEMES} if proxy else {}
        self.opener = urllib.request.build_opener(
            urllib.request.ProxyHandler(proxies), urllib.request.HTTPSHandler(context=context), Redirects()
        )

    def download(self, url: str, sha256: str, target_fd: int, file: str) -> None:
        """Write the wheel at ``url`` as ``file`` in ``target_fd``, created once; refused unless it hashes to ``sha256``."""
        import urllib.error
        import urllib.request

        if not fetchable(url):
            raise IndexFailure("index", f"{url} is not an http(s) URL without user information")
        request = urllib.request.Request(url, headers={"Accept": "*/*", "User-Agent": USER_AGENT})
        try:
            response = self.opener.open(request, timeout=TIMEOUT_SECONDS)
        except urllib.error.HTTPError as error:
            error.close()
            raise IndexFailure("index", f"{url} answered HTTP {error.code}") from None
        except (OSError, ValueError) as error:
            raise IndexFailure("index", f"{url} cannot be read ({error})") from None
        with response:
            try:
                write_checked(lambda: response.read(_CHUNK), sha256, target_fd, file, url)
            except OSError as error:
                raise IndexFailure("index", f"{url} cannot be read ({error})") from None


def write_checked(read: Callable[[], bytes], sha256: str, target_fd: int, file: str, source: str) -> None:
    """Copy what ``read`` gives into ``file`` of ``target_fd`` (created once), capped and hashed; unlink it on a mismatch."""
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=target_fd)
    hasher, total = hashlib.sha256(), 0
    try:
        while chunk := read():
            total += len(chunk)
            if total > WHEEL_MAX_BYTES:
                raise IndexFailure("index", f"{source} is larger than {WHEEL_MAX_BYTES} bytes")
            hasher.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        os.unlink(file, dir_fd=target_fd)
        raise
    os.close(fd)
    if hasher.hexdigest() != sha256:
        os.unlink(file, dir_fd=target_fd)
        raise IndexFailure("index_hash", f"{file} from {source} hashes to {hasher.hexdigest()}, not the ACKed {sha256}")
