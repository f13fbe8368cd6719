"""scripts/seccomp-digest: the syscall filter digest a libseccomp builds from casebox's rules (S12).

Prints one JSON line: the machine, the libseccomp version that built the
program, its instruction count, its SHA-256 and whether this casebox ships
that digest (launcher.vocabulary.SHIPPED_DIGESTS). It builds the program exactly
as every sandbox does (launcher.seccomp.program) and installs nothing.

``--library PATH`` builds with that file instead of the host's
libseccomp.so.2: how a maintainer checks a libseccomp version the host does
not have (docs/launcher.md, "Verified libseccomp versions"). Only this
script points the launcher at another library; casebox itself never does.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

from _cffi_backend import FFI

REPO = pathlib.Path(__file__).resolve().parent.parent


def main(arguments: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from launcher import seccomp, syscalls

    if arguments and (len(arguments) != 2 or arguments[0] != "--library"):
        print("scripts/seccomp-digest: usage: scripts/seccomp-digest [--library PATH]", file=sys.stderr)
        return 64
    if arguments:
        library = os.path.abspath(arguments[1])
        if not os.path.isfile(library):
            print(f"scripts/seccomp-digest: --library {arguments[1]} is not a file", file=sys.stderr)
            return 64
        # An absolute path: the dynamic loader opens exactly this file and searches nowhere.
        seccomp.LIBRARY = library
        try:
            seccomp.library_version()
        except (seccomp.FilterError, FFI.error):  # not loadable, or a library without libseccomp's symbols
            print(f"scripts/seccomp-digest: --library {arguments[1]} is not a loadable libseccomp", file=sys.stderr)
            return 64
    try:
        data = seccomp.program()
        version = seccomp.library_version()
    except seccomp.FilterError as error:
        print(f"scripts/seccomp-digest: {error}", file=sys.stderr)
        return 70
    digest = seccomp.digest(data)
    print(json.dumps({
        "machine": syscalls.MACHINE, "libseccomp": version, "instructions": len(data) // 8, "sha256": digest,
        "shipped": seccomp.unshipped_reason(digest, syscalls.MACHINE) is None,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
