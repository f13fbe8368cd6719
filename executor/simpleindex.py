"""A network index: the one rule for its URL, and its client, which runs only in the resolver's sandbox.

``casebox verify --index URL`` names a PEP 503 simple repository. The URL
rule (:func:`check_index_url`) is applied by the CLI before anything is
written: ``http`` or ``https``, a host, no user information (no
``user:pass@``: casebox never sends a credential), no query and no
fragment, only the characters RFC 3986 allows outside those, and a path
ending in ``/`` (added when missing).

The client (:class:`SimpleIndex`) is used by the resolver inside the one
sandbox that has the host's network (docs/pipeline.md). For a project it
reads ``URL/<project>/``, asking for the JSON form of PEP 691 and taking
the HTML form of PEP 503 when that is what comes, and lists the files the
page links with their stated ``sha256``, ``Requires-Python`` and yanked
flag (:func:`parse_page`, pure). It downloads a wheel into the sandbox's
``/tmp``, hashing it as it goes; a file whose bytes differ from the hash
its page states is refused (``index_hash``). It sends no credential, uses
no proxy, follows redirects only to http(s), and verifies https against the
certificate bundle of the installer wheel. Pages and files are capped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from html.parser import HTMLParser
from typing import Callable
from urllib.parse import unquote, urljoin, urlsplit

from journal.closed import SHA256_HEX
from journal.errors import Refused

SCHEMES = ("http", "https")
URL_MAX_BYTES = 2_048
# RFC 3986's unreserved and reserved characters and '%', less '?', '#' and '@': no query, no fragment, no
# user information, and nothing a parser could read two ways (no space, no backslash, no quote).
_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/\[\]%!$&'()*+,;=]+\Z")
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
PAGE_MAX_BYTES = 16 << 20
WHEEL_MAX_BYTES = 128 << 20
TIMEOUT_SECONDS = 60
USER_AGENT = "casebox-resolver"
CERTIFI = "pip/_vendor/certifi/cacert.pem"
_CHUNK = 1 << 16


def check_index_url(url: str, where: str) -> str:
    """The index URL, normalized to end with '/'; Refused (exit 64) for anything but a plain http(s) URL."""
    if len(url.encode("utf-8")) > URL_MAX_BYTES or not _URL_CHARS.match(url):
        raise Refused(
            where,
            f"{url!r} is not a plain index URL: no user information (user:pass@), no query, no fragment, "
            f"no spaces or quotes, at most {URL_MAX_BYTES} bytes",
        )
    try:
        parts = urlsplit(url)
    except ValueError:
        raise Refused(where, f"{url!r} is not a URL") from None
    if parts.scheme.lower() not in SCHEMES:
        raise Refused(where, f"{url!r} is not an http or https URL; a local index is given as a directory path")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if not parts.hostname or port == -1 or port == 0:
        raise Refused(where, f"{url!r} names no host, or an invalid port")
    url = parts.scheme.lower() + url[len(parts.scheme):]
    return url if url.endswith("/") else url + "/"


def fetchable(url: str) -> bool:
    """A URL the client may open: http(s), a host, no user information."""
    try:
        parts = urlsplit(url)
        return parts.scheme in SCHEMES and bool(parts.hostname) and "@" not in parts.netloc
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class Link:
    """One file a project page links: its name, where it is, and what the page says of it."""

    file: str
    url: str
    sha256: str | None
    requires_python: str | None
    yanked: bool


class IndexFailure(Exception):
    """The index could not be used: ``reason`` is ``index`` or ``index_hash`` (a resolver FAIL reason)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _link(href: str, page_url: str, requires_python: str | None, yanked: bool, hashes: dict[str, str]) -> Link | None:
    url, _, fragment = urljoin(page_url, href).partition("#")
    if not fetchable(url):
        return None
    file = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    name, _, value = fragment.partition("=")
    if name == "sha256" and "sha256" not in hashes:
        hashes = {**hashes, "sha256": value}
    digest = hashes.get("sha256")
    return Link(file, url, digest.lower() if digest and SHA256_HEX.match(digest.lower()) else None, requires_python, yanked)


class _Anchors(HTMLParser):
    def __init__(self, page_url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.page_url = page_url
        self.links: list[Link] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        values = dict(attrs)
        href = values.get("href")
        if href:
            link = _link(href, self.page_url, values.get("data-requires-python") or None, "data-yanked" in values, {})
            if link is not None:
                self.links.append(link)


def parse_page(data: bytes, content_type: str, page_url: str) -> list[Link]:
    """The links of a project page: PEP 691 JSON when ``content_type`` says so, else PEP 503 HTML."""
    if content_type.split(";")[0].strip().lower() == JSON_TYPE:
        try:
            document = json.loads(data)
            files = document["files"]
            links = []
            for entry in files:
                hashes = entry.get("hashes") or {}
                if not isinstance(hashes, dict):
                    hashes = {}
                requires = entry.get("requires-python")
                link = _link(
                    entry["url"], page_url, requires if isinstance(requires, str) and requires else None,
                    bool(entry.get("yanked")), {key: value for key, value in hashes.items() if isinstance(value, str)},
                )
                if link is not None:
                    links.append(link)
            return links
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise IndexFailure("index", f"{page_url} is not a PEP 691 page ({type(error).__name__})") from None
    parser = _Anchors(page_url)
    parser.feed(data.decode("utf-8", "replace"))
    parser.close()
    return parser.links


def _read(response, cap: int, url: str, sink: Callable[[bytes], None]) -> int:
    total = 0
    while chunk := response.read(_CHUNK):
        total += len(chunk)
        if total > cap:
            raise IndexFailure("index", f"{url} is larger than {cap} bytes")
        sink(chunk)
    return total


class SimpleIndex:
    """The client of one simple repository, inside the resolver's sandbox."""

    def __init__(self, url: str, *, cadata: str | None, scratch: str) -> None:
        import ssl
        import urllib.request

        self.url = url
        self.scratch = scratch
        context = ssl.create_default_context(cadata=cadata) if cadata else ssl.create_default_context()

        class Redirects(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, request, response, code, message, headers, new_url):
                if not fetchable(new_url):
                    raise IndexFailure("index", f"{request.full_url} redirects out of http(s) or to user information")
                return super().redirect_request(request, response, code, message, headers, new_url)

        # No proxy, no credentials, no cookies: only these handlers (and urllib's defaults for errors).
        self.opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context), Redirects()
        )

    def _open(self, url: str, accept: str):
        import urllib.error
        import urllib.request

        request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": USER_AGENT})
        try:
            return self.opener.open(request, timeout=TIMEOUT_SECONDS)
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 404:
                return None
            raise IndexFailure("index", f"{url} answered HTTP {error.code}") from None
        except (OSError, ValueError) as error:
            raise IndexFailure("index", f"{url} cannot be read ({error})") from None

    def links(self, project: str) -> list[Link]:
        """The links of ``project``'s page; none when the index does not know it (HTTP 404)."""
        url = f"{self.url}{project}/"
        response = self._open(url, ACCEPT)
        if response is None:
            return []
        with response:
            chunks: list[bytes] = []
            try:
                _read(response, PAGE_MAX_BYTES, url, chunks.append)
            except OSError as error:
                raise IndexFailure("index", f"{url} cannot be read ({error})") from None
            return parse_page(b"".join(chunks), response.headers.get("Content-Type", ""), response.geturl())

    def download(self, link: Link) -> tuple[str, str]:
        """The wheel ``link`` names, in the scratch directory: (path, its sha256); refused if it is not the stated hash."""
        response = self._open(link.url, "*/*")
        if response is None:
            raise IndexFailure("index", f"{link.url} answered HTTP 404")
        path = os.path.join(self.scratch, link.file)
        hasher = hashlib.sha256()
        with response, open(path, "xb") as file:

            def sink(chunk: bytes) -> None:
                hasher.update(chunk)
                file.write(chunk)

            try:
                _read(response, WHEEL_MAX_BYTES, link.url, sink)
            except OSError as error:
                raise IndexFailure("index", f"{link.url} cannot be read ({error})") from None
        digest = hasher.hexdigest()
        if link.sha256 is not None and digest != link.sha256:
            os.unlink(path)
            raise IndexFailure("index_hash", f"{link.file} hashes to {digest}, its page states {link.sha256}")
        return path, digest
