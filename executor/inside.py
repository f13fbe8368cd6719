"""The one entry point of casebox's own tools inside a sandbox: the extractor, the resolver, and pip's start.

The case service and the dependency preparer run them as ops of a sandbox, as
the dedicated UID (DESIGN T4, step 4), with exactly the files of
:data:`MODULES` copied into a read-only capability mounted at ``/cap/tools``::

    RUNTIME -I -S -B -c BOOT extract /cap/bundle/candidate.tar /out/candidate
    RUNTIME -I -S -B -c BOOT resolve /cap/request /cap/candidate/candidate /cap/index
    RUNTIME -I -S -B -c BOOT pip /cap/request/pip-X.whl install|download ARGS...

Paths are opened here, inside the sandbox; the extractor then works on the
descriptors alone.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from executor.extract import SANDBOX_MODULES as EXTRACTOR_MODULES
from executor.frontend import EXIT_REFUSED
from executor.resolver import SANDBOX_MODULES as RESOLVER_MODULES

TOOLS = "/cap/tools"
# Every casebox file the tools import: what the tools capability holds, and nothing else.
MODULES = tuple(sorted(set(EXTRACTOR_MODULES) | set(RESOLVER_MODULES) | {"executor/inside.py"}))
BOOT = f"import sys; sys.path[:0] = [{TOOLS!r}]; from executor.inside import main; sys.exit(main(sys.argv[1:]))"


def _extract(archive: str, target: str) -> int:
    from executor import extract

    archive_fd = os.open(archive, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    target_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    return extract.main([str(archive_fd), str(target_fd)])


def _pip(wheel: str, arguments: Sequence[str]) -> int:
    """pip's own command line, run from its package unpacked out of the installer ``wheel`` into a private /tmp directory.

    Run from the wheel as a zip, pip is compiled from source two or three
    times over (zipimport compiles a module to answer ``get_filename`` and
    again to load it): about 0.3 s of every fetch and install op. Unpacked
    on the sandbox's tmpfs (~30 ms), each module it imports is compiled once.
    Only ``pip/`` is unpacked, and this directory and the standard library
    are all it imports from.
    """
    import tempfile
    import zipfile

    home = tempfile.mkdtemp(prefix="pip-")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(home, [name for name in archive.namelist() if name.startswith("pip/")])
    sys.path[:] = [home, *(entry for entry in sys.path if entry != TOOLS)]
    from pip._internal.cli.main import main as pip_main  # the wheel's own `pip` console script

    return pip_main(list(arguments))


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["extract"] and len(argv) == 3:
        return _extract(argv[1], argv[2])
    if argv[:1] == ["pip"] and len(argv) >= 3:
        return _pip(argv[1], argv[2:])
    if argv[:1] == ["resolve"] and len(argv) == 4:
        from executor import resolver

        return resolver.main(argv[1:])
    print(f"casebox tools: unknown invocation {list(argv)!r}", file=sys.stderr)
    return EXIT_REFUSED
