"""E7: the names the standard library imports though it ships none, derived from the runtime's own sources."""

from __future__ import annotations

import ast
import pathlib
import sys
import sysconfig

from executor.deps.shadowing import SHADOWS_STDLIB, STDLIB_OPTIONAL_IMPORTS, modules, shadowed

# Names the standard library's sources import that a candidate may still ship, each for a reason of its own.
# Scanned by hand on CPython 3.10 to 3.13 as well (pyenv's builds), which add Mailman and pep517 (3.10) and _wmi
# (3.12, refused) to this interpreter's.
NEVER_IMPORTED_IN_A_CASE = {
    "__main__": "the running program, always in sys.modules, never looked up on the search path",
    "test": "CPython's own test package: only its test suite imports it (multiprocessing.util's test cleanup)",
    "pgen2": "lib2to3's implicit relative import, a Python 2 idiom that never resolves on Python 3",
    "pip": "ensurepip's, which bootstraps pip and is no step of a case; a candidate may depend on pip",
    "docutils": "distutils' check command's, which no case runs; a candidate may depend on docutils",
    "Mailman": "smtpd's MailmanProxy (3.10, 3.11), a mail relay no case runs",
    "pep517": "importlib.metadata's Distribution._local (3.10), a helper for a source checkout; a candidate may depend on it",
}
# CPython's own tests and their data: directories no case imports from.
TEST_DIRECTORIES = {"test", "tests", "idle_test"}


def _imported_elsewhere(stdlib: pathlib.Path) -> dict[str, str]:
    """Each top-level name the standard library's sources import that is no module of its own, with a file."""
    own = set(sys.stdlib_module_names)
    found: dict[str, str] = {}
    for source in sorted(stdlib.rglob("*.py")):
        if {"site-packages", "dist-packages", *TEST_DIRECTORIES} & set(source.relative_to(stdlib).parts[:-1]):
            continue
        try:
            tree = ast.parse(source.read_bytes())
        except (SyntaxError, ValueError):
            continue  # lib2to3's fixer data holds Python 2 on purpose
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in own:
                    found.setdefault(top, str(source.relative_to(stdlib)))
    return found


def test_every_module_the_standard_library_imports_but_does_not_ship_is_refused_or_never_imported_in_a_case():
    """E7: the refusal list is the runtime's own. Every top-level name this interpreter's standard library
    imports that is none of its modules is either refused as a candidate module or named above with the reason
    no case imports it; red when a Python version adds such an import and the list misses it."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    found = _imported_elsewhere(stdlib)
    assert "org" in found and "sitecustomize" in found, found  # the scan reads real sources
    missing = {name: where for name, where in found.items() if name not in STDLIB_OPTIONAL_IMPORTS and name not in NEVER_IMPORTED_IN_A_CASE}
    assert missing == {}


def test_a_candidate_module_the_standard_library_imports_when_present_is_refused_with_its_name():
    """E7: the rule itself, for both places it is applied (the resolver's listing and the sealed tree's)."""
    for module in STDLIB_OPTIONAL_IMPORTS:
        code, sentence = shadowed(candidate_modules={"calc": ["calc", module]}, stdlib_modules=sys.stdlib_module_names)
        assert code == SHADOWS_STDLIB and f"installs the top-level module {module}, which the standard library imports" in sentence
    assert shadowed(candidate_modules={"calc": ["calc", "pip", "docutils", "test"]}, stdlib_modules=sys.stdlib_module_names) is None


def test_an_installed_tree_is_listed_whole_however_many_modules_it_holds():
    """E7: the trusted side's listing of the sealed candidate tree, which the standard library names are checked
    against, is never cut: an ``org`` behind a thousand modules that sort first is still found and refused."""
    names = [f"aa{number:04d}.py" for number in range(1000)] + ["org/"]
    found = modules(names)
    assert len(found) == 1001 and found[-1] == "org"
    assert shadowed(candidate_modules={"the installed candidate tree": found}, stdlib_modules=frozenset())[0] == SHADOWS_STDLIB
