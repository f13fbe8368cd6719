"""The shipped launcher's top level: the launcher package, compiled, in one file (S1; docs/launcher.md).

steward/provision.py compiles this file as the top-level code of the shipped
launcher, a .pyc that ``python -I -S /proc/self/fd/N`` runs directly, and puts
every other module of ``launcher/`` into MODULES as (name, is_package, code).
Running it installs a finder that serves ``launcher`` and its modules from
those code objects, with ``__file__`` inside the file being run, then starts
``launcher.__main__``. A script needs no ``runpy`` (an executable zip does,
and it costs each of the two interpreter starts about 6 ms), and nothing is
compiled or read from disk for the launcher's own modules.
"""

import sys
from _frozen_importlib import ModuleSpec

MODULES = "replaced by steward.provision.build"


class Embedded:
    """A meta path finder and loader for the launcher modules compiled into this file."""

    def __init__(self, origin: str, modules) -> None:
        self.origin = origin
        self.modules = {name: (package, code) for name, package, code in modules}

    def find_spec(self, name, path=None, target=None):
        entry = self.modules.get(name)
        if entry is None:
            return None
        where = f"{self.origin}/{name.replace('.', '/')}"
        spec = ModuleSpec(name, self, origin=f"{where}/__init__.py" if entry[0] else f"{where}.py", is_package=entry[0])
        if entry[0]:
            spec.submodule_search_locations = [where]
        spec.has_location = True
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        exec(self.modules[module.__spec__.name][1], module.__dict__)


if __name__ == "__main__":
    sys.meta_path.insert(0, Embedded(sys.argv[0], MODULES))
    from launcher.__main__ import main

    main()
