"""The layout is the import limits (docs/architecture.md, "Packages and what they may import").

Each package's imports, read from its source with ``ast`` (function-level
imports included), stay within what its zone may use: the journal runs
anywhere, the launcher is one file on the stdlib plus prctl and cffi, and the
evaluator (``executor/evidence/``) runs unprivileged from its own package,
the plan, the journal and the launcher's vocabulary alone.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
# _sha2 is the stdlib's SHA-2 module from Python 3.12 on (launcher/digest.py falls back to 3.11's _sha256).
STDLIB = frozenset(sys.stdlib_module_names) | {"_sha2"}


def imports_of(directory: pathlib.Path) -> dict[str, set[str]]:
    """Every module a package's files import, absolute, with the file that imports it."""
    found: dict[str, set[str]] = {}
    files = sorted(directory.rglob("*.py"))
    assert files, directory
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def allowed(name: str, prefixes: tuple[str, ...], packages: tuple[str, ...]) -> bool:
    top = name.split(".")[0]
    if top in STDLIB:
        return True
    if top in packages:
        return True
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


# package directory -> (casebox modules it may import, third-party packages it may import)
LIMITS = {
    "journal": (("journal",), ()),
    "launcher": (("launcher",), ("_prctl", "_cffi_backend", "cffi")),
    "steward": (("journal", "launcher", "steward", "executor.capability"), ("psutil", "pyroute2")),
    "executor/evidence": (
        ("executor.evidence", "executor.plan", "journal", "launcher.vocabulary", "executor.VERSION", "launcher"), ()),
    "executor/transport": (("executor.transport", "executor.inputs", "executor.cli.frontend", "journal", "executor.VERSION"), ()),
}


@pytest.mark.parametrize("package", sorted(LIMITS))
def test_each_package_imports_only_what_its_zone_may(package):
    """The packages' one-way imports (docs/architecture.md): a change that reaches across a zone is red here."""
    prefixes, packages = LIMITS[package]
    found = imports_of(REPO / package)
    outside = {name: sorted(where) for name, where in found.items()
               if name.split(".")[0] in ("journal", "launcher", "steward", "executor") or name.split(".")[0] not in STDLIB
               if not allowed(name, prefixes, packages)
               # `from executor import VERSION` names the package itself and its constant.
               if name != "executor" and not (package.startswith("executor") and name == "launcher")}
    assert outside == {}


def test_the_evaluator_loads_only_its_import_limit():
    """E1: evaluating needs nothing of the steward, the launcher's bindings, the CLI, the transport or the
    dependency preparer: what importing the evaluator loads, it loads from its limit alone."""
    probe = "import sys, executor.evidence.evaluate; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-I", "-c", probe], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    ours = [name for name in loaded if name.split(".")[0] in ("executor", "journal", "launcher", "steward")]
    assert "executor.evidence.evaluate" in ours
    prefixes, _ = LIMITS["executor/evidence"]
    assert [name for name in ours if name not in ("executor", "launcher") and not allowed(name, prefixes, ())] == []


def test_the_vocabulary_imports_nothing():
    """S10/S12: launcher/vocabulary.py is shared by the launcher, the steward and the evaluator, so it imports
    nothing at all, not even the stdlib."""
    tree = ast.parse((REPO / "launcher" / "vocabulary.py").read_text())
    assert [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))] == []


def test_the_launcher_loads_no_module_it_does_not_call():
    """S1/S3 cost (issue 14): each sandbox starts two interpreters that import the launcher, so what they load is
    paid per case. Everything pid 1 imports loads python-prctl's C module but not its wrapper (which builds a
    property per capability name), and no ``__future__`` (a module read from disk, for annotations that Python
    3.11 evaluates as they are). Red when a launcher module imports either again."""
    import _prctl

    # Every launcher module, a superset of what either stage imports, so no copy of pid 1's import list is kept here.
    modules = sorted(f"launcher.{path.stem}" for path in (REPO / "launcher").glob("*.py") if path.stem != "__init__")
    probe = "import sys; sys.path[:0] = sys.argv[1:3]; [__import__(name) for name in sys.argv[3:]]; print(' '.join(sorted(sys.modules)))"
    import_dir = str(pathlib.Path(_prctl.__file__).parent)
    loaded = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe, str(REPO), import_dir, *modules], capture_output=True, text=True, check=True,
    ).stdout.split()
    assert "launcher.drop" in loaded and "_prctl" in loaded and "_cffi_backend" in loaded
    assert [name for name in loaded if name in ("prctl", "__future__")] == []
