"""E7: the runner's boot, in every interpreter of a pytest case.

This file is the runner tree's ``sitecustomize`` (the install tool writes it
there, executor/inside.py), so it is the standard library's own hook into
every interpreter of a pytest case that starts with ``site``: the worker a
plugin such as pytest-xdist starts, the verifier's own checker, and the
candidate's processes too. The runner itself starts with ``-S`` and loads it
by path (executor/cases/service.py, ``RUNNER_BOOT``). It imports nothing but
the standard library, and takes what it needs from one environment variable
the case service sets (:data:`SETTINGS`): the verifier tree's path, the
candidate tree's, and the top-level modules of the candidate's own projects.

Its one rule: such a module is found in the candidate's tree only for an
import made by code of the verifier's tree or of the candidate, judged by
the first frame outside the standard library, so a module the runner's own
code imports whenever it finds one (hypothesis's ``typing_extensions``,
pytest-xdist's ``setproctitle``) is never the candidate's. An interpreter
started with ``site`` is also a program of its own (``python -m calc``,
``python -c "import calc"``): there an import on the main thread with no
frame outside the standard library, or made by the outermost frame of a
``-c`` or stdin program (in ``__main__``'s namespace), is the program's,
and found; a thread's or an ``exec``'d code's is not. The runner's boot admits neither: its
own outermost frame is casebox's ``-c``, and pytest runs under it. A name the
search finds elsewhere first (the verifier's own ``tests`` package beside a
candidate's stray one) is left to the usual search.

An interpreter started with ``site`` also drops what ``site`` added to its
search path: the runtime's site-packages (a CI job's own installs, in a
setup-python toolcache) and the host's ``dist-packages`` (Debian and Ubuntu),
with whatever their ``.pth`` files listed. So a worker or a checker searches
what the runner, started with ``-S``, does: the standard library, the runner,
the candidate; never a package of the host that ran the case.
"""

import _thread
import os
import sys
from importlib.machinery import PathFinder

SETTINGS = "CASEBOX_RUNNER_BOOT"
_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


class CandidateModulesForTheirOwnImporters:
    """The meta path finder: refuses a candidate module to any importer but the verifier's code and the candidate's."""

    def __init__(self, verifier: str, candidate: str, own: frozenset, programs_import: bool) -> None:
        self.own = own
        self.candidate = candidate
        self.importers = (verifier + "/", candidate)
        self.transparent = ("<frozen ", os.path.dirname(os.__file__) + "/")
        self.programs_import = programs_import
        # Installed at the interpreter's start, on its main thread: the one the program runs on.
        self.main_thread = _thread.get_ident()

    def find_spec(self, name, path=None, target=None):
        if path is not None or name not in self.own:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(self.transparent):
            frame = frame.f_back
        if frame is None or (frame.f_back is None and frame.f_code.co_filename.startswith("<")):
            if self.programs_import and _thread.get_ident() == self.main_thread and _in_main(frame):
                return None
        elif frame.f_code.co_filename.startswith(self.importers):
            return None
        spec = PathFinder.find_spec(name)
        places = [] if spec is None else [p for p in (spec.origin, *(spec.submodule_search_locations or ())) if p]
        if not places or not all(place.startswith(self.candidate) for place in places):
            return None
        raise ModuleNotFoundError(
            f"casebox: {name} is a module of the candidate, which only the verifier's tests and the candidate's own "
            "code may import", name=name,
        )


def _in_main(frame) -> bool:
    """No frame (``-m``: the standard library's runpy alone), or one running in ``__main__``'s namespace."""
    main = sys.modules.get("__main__")
    return frame is None or (main is not None and frame.f_globals is getattr(main, "__dict__", None))


def install(programs_import: bool) -> None:
    """Put the finder first on the meta path, once, with the settings the case service gave."""
    if any(isinstance(finder, CandidateModulesForTheirOwnImporters) for finder in sys.meta_path):
        return
    verifier, candidate, modules = os.environ[SETTINGS].split("\n")
    own = frozenset(filter(None, modules.split(",")))
    sys.meta_path.insert(0, CandidateModulesForTheirOwnImporters(verifier, candidate, own, programs_import))


def drop_site_packages() -> None:
    """Cut the search path where the first directory ``site`` added begins: it appends each site-packages
    directory, then the paths of its ``.pth`` files, after everything else. A directory that PYTHONPATH itself
    lists is the starter's choice, and kept with what its ``.pth`` files list."""
    import site

    listed = set(os.environ.get("PYTHONPATH", "").split(os.pathsep))
    added = set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        added.add(site.getusersitepackages())
    for index, entry in enumerate(sys.path):
        if entry in added and entry not in listed:
            del sys.path[index:]
            return


def boot_runner() -> None:
    """The runner's own start: non-dumpable, so no process of the same UID can ptrace it or open its memory
    (every process that execs the session's execute-only interpreter already is; this holds for the runner
    whatever binary runs it); the finder in its strict form; and the check that an interpreter started with
    ``site`` finds this file as its ``sitecustomize``, so the runner's workers get the finder too."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError("the runner could not make itself non-dumpable")
    found = PathFinder.find_spec("sitecustomize")
    if found is None or found.origin != __file__:
        raise OSError(f"an interpreter started with site would load {found and found.origin} as sitecustomize, not {__file__}")
    install(programs_import=False)


# Imported by site, not by the trusted side (executor.cases.service reads SETTINGS) nor by the runner's -S boot.
if __name__ == "sitecustomize" and SETTINGS in os.environ:
    install(programs_import=True)
    drop_site_packages()
