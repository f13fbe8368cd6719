"""E7: the runner is the verifier's. The one rule for a candidate that would stand in for the runner or the stdlib.

A case's search path is the standard library, then the runner's sealed tree,
then the candidate's (executor/cases/service.py), so a candidate module named
like a module of either is never imported by the runner. That order is the
guard; this rule makes the attempt say so instead of running: a candidate
that ships a project the runner's closure holds, or a top-level module named
like one of the standard library's or the runner's, is refused, and every
case is UNVERIFIED with the code as its reason. So is a candidate module
named like one the standard library imports when it finds one, though it
ships none (``site``'s ``sitecustomize`` and ``usercustomize``, Jython's
``org`` in ``copy``): the order cannot keep those out, since the first copy
anywhere on the path is the candidate's.

The rule is applied where each name becomes known: the runner's projects and
the candidate's modules (as the resolver listed them from the wheels) once
resolution is ACKed; the runner's modules once its tree is sealed (listed by
name on the trusted side); and the sealed candidate tree's own listing
against the standard library, whatever the resolver said.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

SHADOWS_RUNNER = "candidate_shadows_runner"
SHADOWS_STDLIB = "candidate_shadows_stdlib"
CODES = (SHADOWS_RUNNER, SHADOWS_STDLIB)

# What a top-level entry of a wheel or an installed tree makes importable: a package directory, a source or
# bytecode file, an extension module. A wheel's .data/purelib and .data/platlib install at the top level too.
_EXTENSION = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\.[^/]*)?\.so\Z")
_SOURCE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\.py[cw]?\Z")
_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INSTALLED = re.compile(r"[^/]+\.data/(?:purelib|platlib)/(.*)\Z", re.S)
# An installed tree's own entries that are not modules: metadata, scripts, caches.
_NOT_MODULES = ("__pycache__", "bin")
# Top-level modules the standard library imports whenever it finds one, though it ships none: site's startup
# hooks (in every interpreter started without -S), the apport hook Debian's sitecustomize imports, and the probes
# for Jython (org, java), VMS and Windows (_wmi, pywin32) in copy, pickle, platform, xml.sax, logging.handlers
# and distutils.
# The first copy on the search path would be a candidate's, and would run inside the runner or another process
# of the verifier's that imports nothing of the candidate's. tests/test_shadowing.py derives the list from the
# runtime's own sources.
STDLIB_OPTIONAL_IMPORTS = (
    "_winreg", "_wmi", "apport_python_hook", "java", "org", "sitecustomize", "usercustomize", "vms_lib",
    "win32api", "win32con", "win32evtlog", "win32evtlogutil",
)


def modules(names: Iterable[str]) -> list[str]:
    """The top-level modules that entries with these names make importable.

    A wheel's member names are given as they are (``pkg/mod.py``), each a clean relative path (the resolver
    refuses any other); an installed tree's top-level listing gives each directory with a trailing ``/``.
    Every one is kept: a name left out would be a module no rule here sees, nor the runner's boot.
    """
    found = set()
    for name in names:
        installed = _INSTALLED.match(name)
        if installed:
            name = installed.group(1)
        elif name.split("/", 1)[0].endswith((".dist-info", ".data", ".egg-info")):
            continue
        head, slash, _ = name.partition("/")
        if slash:
            if _PACKAGE.match(head) and head not in _NOT_MODULES:
                found.add(head)
            continue
        match = _SOURCE.match(head) or _EXTENSION.match(head)
        if match:
            found.add(match.group(1))
    return sorted(found)


def _first(names: Iterable[str], taken: Iterable[str]) -> str | None:
    overlap = sorted(set(names) & set(taken))
    return overlap[0] if overlap else None


def shadowed(
    *,
    candidate_projects: Iterable[str] = (),
    candidate_modules: Mapping[str, Iterable[str]] | None = None,
    runner_projects: Iterable[str] = (),
    runner_modules: Iterable[str] = (),
    stdlib_modules: Iterable[str] = (),
) -> tuple[str, str] | None:
    """(code, sentence) for the first candidate name that stands in for the runner or the stdlib, else None.

    ``candidate_modules`` maps each candidate project to the modules it installs.
    """
    project = _first(candidate_projects, runner_projects)
    if project is not None:
        return SHADOWS_RUNNER, f"the candidate ships {project}, a distribution of the runner's closure"
    for owner, names in sorted((candidate_modules or {}).items()):
        names = list(names)
        module = _first(names, stdlib_modules)
        if module is not None:
            return SHADOWS_STDLIB, f"{owner} installs the top-level module {module}, a module of the standard library"
        module = _first(names, STDLIB_OPTIONAL_IMPORTS)
        if module is not None:
            return SHADOWS_STDLIB, f"{owner} installs the top-level module {module}, which the standard library imports when it finds one"
        module = _first(names, runner_modules)
        if module is not None:
            return SHADOWS_RUNNER, f"{owner} installs the top-level module {module}, a module of the runner"
    return None
