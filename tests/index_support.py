"""A PEP 503 simple index served over HTTP on loopback, for the network-index tests: no internet needed.

:func:`build_simple` lays out ``simple/<project>/index.html`` pages linking
``files/<wheel>#sha256=HEX`` for every wheel of a find-links directory;
:class:`IndexServer` serves such a tree from a thread on 127.0.0.1 and
records every request it got (path and headers); :class:`Listener` only
counts the connections it gets.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import http.server
import pathlib
import select
import shutil
import socket
import threading

from executor.transport.manifest import wheel_project
from executor.deps.simpleindex import USER_AGENT


def build_simple(source: pathlib.Path, target: pathlib.Path, *, stated: dict[str, str] | None = None,
                 extra_links: dict[str, list[str]] | None = None) -> pathlib.Path:
    """A simple index of the wheels in ``source`` under ``target``; ``stated`` overrides the sha256 a page states
    for a file, ``extra_links`` adds raw anchors to a project's page."""
    files = target / "files"
    files.mkdir(parents=True)
    projects: dict[str, list[str]] = collections.defaultdict(list)
    for wheel in sorted(source.glob("*.whl")):
        shutil.copy(wheel, files / wheel.name)
        digest = (stated or {}).get(wheel.name, hashlib.sha256(wheel.read_bytes()).hexdigest())
        project, _ = wheel_project(wheel.name, wheel.name)
        projects[project].append(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a>')
    for project, anchors in (extra_links or {}).items():
        projects[project].extend(anchors)
    for project, anchors in projects.items():
        page = target / "simple" / project
        page.mkdir(parents=True)
        (page / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "<br>\n".join(anchors) + "\n</body></html>\n")
    return target


class IndexServer:
    """Serves ``root`` on 127.0.0.1 from a thread; ``requests`` is every (path, headers) it was sent.
    ``swap_for_fetch`` maps a path to other bytes served only to casebox's fetch, not to pip's resolver;
    ``redirects`` maps a path to the Location of a 302."""

    def __init__(
        self, root: pathlib.Path, *, swap_for_fetch: dict[str, bytes] | None = None, redirects: dict[str, str] | None = None,
    ) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        recorded = self.requests
        swapped = swap_for_fetch or {}
        moved = redirects or {}

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                recorded.append((self.path, dict(self.headers.items())))
                if self.path in moved:
                    self.send_response(302)
                    self.send_header("Location", moved[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path in swapped and self.headers.get("User-Agent", "").startswith(USER_AGENT):
                    body = swapped[self.path]
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                super().do_GET()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple/"

    def __enter__(self) -> "IndexServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


class Listener:
    """A TCP listener on 127.0.0.1 that only counts the connections it is sent (a stand-in for a metadata
    service or any other host service a sandbox must never reach); ``connections`` is how many arrived."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            if select.select([self.socket], [], [], 0.05)[0]:
                connection, _ = self.socket.accept()
                self.connections += 1
                connection.close()

    def __enter__(self) -> "Listener":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join()
        self.socket.close()
