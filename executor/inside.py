"""The one entry point of casebox's own tools inside a sandbox: the extractor, the resolver, the fetcher and the
installer.

The case service and the dependency preparer run them as ops of a sandbox, as
the dedicated UID (DESIGN T4, step 4), with exactly the files of
:func:`modules` copied into a read-only capability mounted at ``/cap/tools``::

    RUNTIME -I -S -B -c BOOT extract /cap/bundle/candidate.tar /out/candidate
    RUNTIME -I -S -B -c BOOT resolve /cap/request /cap/candidate/candidate /cap/index|URL|- PROXY|-
    RUNTIME -I -S -B -c BOOT fetch /cap/pins/pins.json /out/deps /cap/index|URL /cap/request/pip-X.whl PROXY|-
    RUNTIME -I -S -B -c BOOT install /out/TREE /cap/TREE WHEEL...
    RUNTIME -I -S -B -c BOOT install-runner /out/TREE /cap/TREE WHEEL...

Paths are opened here, inside the sandbox; the extractor then works on the
descriptors alone. ``PROXY`` is the steward's forwarder (``http://127.0.0.1:3128``)
for a network index, the sandbox's only way out, or ``-``.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from executor.cli.frontend import EXIT_REFUSED

TOOLS = "/cap/tools"
# Where an installed tree keeps its modules, as a venv does: tools that tell installed code from the project's
# own by that name (hypothesis parses every "local" module's source for constants, once per case) leave it be.
MODULES_DIRECTORY = "site-packages"
# Libraries the tools import, copied from casebox's own environment: their Python files only.
LIBRARIES = ("installer",)
BOOT = f"import sys; sys.path[:0] = [{TOOLS!r}]; from executor.inside import main; sys.exit(main(sys.argv[1:]))"
# The runner's boot, which install-runner writes as the runner tree's sitecustomize (executor/cases/runner_boot.py).
RUNNER_BOOT_SOURCE = "executor/cases/runner_boot.py"
RUNNER_BOOT_NAME = "sitecustomize.py"


def modules() -> tuple[str, ...]:
    """Every casebox file the tools import: what the tools capability holds, with LIBRARIES, and nothing else.

    Asked on the trusted side only. Each tool imports what it uses when it
    runs, so an install or fetch op does not pay for the resolver's and the
    extractor's imports (about 0.1 s of every op, issue 14)."""
    from executor.deps.resolver import SANDBOX_MODULES as RESOLVER_MODULES
    from executor.transport.extract import SANDBOX_MODULES as EXTRACTOR_MODULES

    return tuple(sorted(set(EXTRACTOR_MODULES) | set(RESOLVER_MODULES) | {"executor/inside.py", "executor/deps/simpleindex.py", RUNNER_BOOT_SOURCE}))


def _extract(archive: str, target: str) -> int:
    from executor.transport import extract

    archive_fd = os.open(archive, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    target_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    return extract.main([str(archive_fd), str(target_fd)])


def load_pip(wheel: str, parts: tuple[str, ...] = ("pip/",)) -> None:
    """pip's package, unpacked out of the installer ``wheel`` into a private /tmp directory, first on the path;
    only its members named by ``parts`` (names, or directory prefixes ending in ``/``).

    Run from the wheel as a zip, pip is compiled from source two or three
    times over (zipimport compiles a module to answer ``get_filename`` and
    again to load it): about 0.3 s of every resolve and install op. Unpacked
    on the sandbox's tmpfs (~30 ms), each module it imports is compiled once.
    Only ``pip/`` is unpacked; the tools directory leaves the path, so pip
    imports from that copy and the standard library alone (a tool imports
    what it needs of casebox before it loads pip).
    """
    import tempfile
    import zipfile

    home = tempfile.mkdtemp(prefix="pip-")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(home, [name for name in archive.namelist() if name.startswith(parts)])
    sys.path[:] = [home, *(entry for entry in sys.path if entry != TOOLS)]


def _install(target: str, mounted: str, wheels: Sequence[str], *, runner: bool = False) -> int:
    """Exactly ``wheels`` unpacked into ``target`` by PyPA's ``installer``, each checked against its own RECORD
    first; then every module there gets a checked-hash .pyc whose code names ``mounted``, the path at which
    the cases see the sealed tree.

    The resolver already fixed every wheel and its sha256, so nothing is left
    to resolve: pip would spend some 0.5 s of each install importing and
    compiling itself (docs/pipeline.md, "Install"). The layout is a venv's:
    modules and ``.data/purelib`` and ``platlib`` in ``site-packages/``
    (:data:`MODULES_DIRECTORY`), scripts in ``bin/``, and ``data`` in
    ``data/``, not at the top as in a venv: a case with a verifier mount runs
    in /cap, where the working directory, first on the search path, would
    make a top-level ``__init__.py`` of the tree the package ``site`` (or
    ``runner``) ahead of the standard library.
    Compiled here, once, in sorted order, the
    same wheels give the same bytes: pip's own compile named its random
    temporary directory in every .pyc, so two installs were two trees.

    The runner's tree (``runner``) also gets casebox's runner boot as its
    ``sitecustomize``, created once: a runner closure that ships one of its
    own fails the install rather than replace the boot."""
    import compileall
    import py_compile

    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.exceptions import InstallerError
    from installer.sources import WheelFile

    modules = os.path.join(target, MODULES_DIRECTORY)
    os.mkdir(modules, 0o755)
    scheme = {
        "purelib": modules, "platlib": modules, "scripts": os.path.join(target, "bin"),
        "headers": os.path.join(target, "include"), "data": os.path.join(target, "data"),
    }
    destination = SchemeDictionaryDestination(scheme, interpreter=sys.executable, script_kind="posix")
    for wheel in wheels:
        try:
            with WheelFile.open(wheel) as source:
                source.validate_record()
                install(source, destination, additional_metadata={"INSTALLER": b"casebox\n"})
        except (InstallerError, OSError, ValueError, KeyError) as error:
            print(f"casebox install: {os.path.basename(wheel)}: {error}", file=sys.stderr)
            return 1
    if runner:
        # This file's own tree: /cap/tools in the sandbox, the checkout or the installed package elsewhere.
        with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), RUNNER_BOOT_SOURCE), "rb") as source:
            boot = source.read()
        try:
            with open(os.path.join(modules, RUNNER_BOOT_NAME), "xb") as written:
                written.write(boot)
        except FileExistsError:
            print("casebox install: the runner's closure ships a sitecustomize of its own, where the runner's boot goes", file=sys.stderr)
            return 1
    # As pip does, a module that does not compile is left without a .pyc: importing it fails in the case itself.
    compileall.compile_dir(target, ddir=mounted, quiet=2, workers=1, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    return 0


def _fetch(acks: str, target: str, index: str, installer: str, proxy: str) -> int:
    """Exactly the ACKed pins into ``target``: copied from a find-links index, or downloaded from a network index;
    each file created once and refused unless its bytes have the ACKed sha256."""
    from executor.deps import simpleindex
    from executor.deps.protocol import LOCAL_INDEX, NO_PROXY, acks_from_bytes

    with open(acks, "rb") as file:
        pins = acks_from_bytes(file.read())
    target_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    client = None
    done: set[str] = set()
    try:
        for pin in pins:
            if pin.file in done:
                continue
            if index == LOCAL_INDEX:
                source = os.open(os.path.join(LOCAL_INDEX, pin.file), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    simpleindex.write_checked(lambda: os.read(source, 1 << 20), pin.sha256, target_fd, pin.file, pin.file)
                finally:
                    os.close(source)
            else:
                if client is None:
                    client = simpleindex.IndexClient(cadata=_certificates(installer), proxy=None if proxy == NO_PROXY else proxy)
                client.download(pin.url, pin.sha256, target_fd, pin.file)
            done.add(pin.file)
    except simpleindex.IndexFailure as failure:
        print(f"casebox fetch: {failure.reason}: {failure.detail}", file=sys.stderr)
        return 1
    finally:
        os.close(target_fd)
    return 0


def _certificates(installer: str) -> str | None:
    """The CA bundle pip vendors (certifi), read from the installer wheel: what https is verified against."""
    import zipfile

    from executor.deps.simpleindex import CERTIFI

    try:
        with zipfile.ZipFile(installer) as archive:
            return archive.read(CERTIFI).decode("ascii")
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError):
        return None


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["extract"] and len(argv) == 3:
        return _extract(argv[1], argv[2])
    if argv[:1] in (["install"], ["install-runner"]) and len(argv) >= 4:
        return _install(argv[1], argv[2], argv[3:], runner=argv[0] == "install-runner")
    if argv[:1] == ["fetch"] and len(argv) == 6:
        return _fetch(*argv[1:])
    if argv[:1] == ["resolve"] and len(argv) == 5:
        from executor.deps import resolver

        return resolver.main(argv[1:])
    print(f"casebox tools: unknown invocation {list(argv)!r}", file=sys.stderr)
    return EXIT_REFUSED
