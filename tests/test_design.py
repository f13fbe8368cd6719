"""docs/design.md is the one definition of the numbered invariants the code, tests and docs cite.

Pure and unprivileged: it reads files of this checkout and parses Python with ``ast`` and
``tokenize``; it imports and runs nothing of casebox.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import pathlib
import re
import subprocess
import sys
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"

# An invariant id: a family letter and a number, standing alone ("DESIGN S4", "J2:", "(C6)", "S4/S5", "S1–S11").
# Not after a word character or a dot, so hex digits and version numbers are not ids.
CITED = re.compile(r"(?<![\w.])([TDSJCEFP]\d{1,2})(?!\w)")
# Text that looks like an id and is not one: the C0 and C1 control-character sets.
NOT_CITATIONS = re.compile(r"\bC0\s+and\s+C1\s+control|\bC[01]\s+control|\(C0, C1, ESC")
ENFORCED = re.compile(r"^- \*\*Enforced by\*\* `([^`]+)`", re.MULTILINE)
RED = re.compile(r"^- \*\*Red without it\*\* `([^`]+)`", re.MULTILINE)
SCRIPT_PATH = re.compile(r"`((?:scripts|\.ci)/[^`\s:]+)")

# Where citations live: every text file of the checkout but the data in golden/ and what tools make.
SKIPPED_DIRECTORIES = {".git", ".venv", "golden", "__pycache__", ".pytest_cache", "build", "dist"}
TEXT_SUFFIXES = {".md", ".yml", ".yaml", ".toml", ".ini", ".service", ".cfg"}
SCRIPT_DIRECTORIES = ("scripts", ".ci")


def _load_mutation_check():
    """scripts/mutation_check.py, loaded by its path: the one reader of docs/design.md's entries, and the
    tables of the mutation check (it reads files of this checkout and runs nothing here)."""
    spec = importlib.util.spec_from_file_location("casebox_mutation_check", ROOT / "scripts" / "mutation_check.py")
    module = importlib.util.module_from_spec(spec)
    # A dataclass looks its module up by name while it is built.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


MUTATION_CHECK = _load_mutation_check()
entries = MUTATION_CHECK.entries


# Python 3.12 splits an f-string into parts; its literal text is prose too.
PROSE_TOKENS = {tokenize.COMMENT, tokenize.STRING} | ({tokenize.FSTRING_MIDDLE} if hasattr(tokenize, "FSTRING_MIDDLE") else set())


def prose_of_python(source: str) -> str:
    """The comments and string literals of a Python file: where code cites invariants (never its names)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return "\n".join(token.string for token in tokens if token.type in PROSE_TOKENS)


def citations(text: str) -> set[str]:
    return set(CITED.findall(NOT_CITATIONS.sub(" ", text)))


def cited_by_the_repository() -> dict[str, set[str]]:
    """Every invariant id cited anywhere in code, tests, scripts and docs, with the files citing it."""
    cited: dict[str, set[str]] = {}
    for path in sorted(_text_files(ROOT)):
        if path == pathlib.Path(__file__).resolve():
            continue  # its string literals are the scan's own samples, ids that are no citation among them
        text = path.read_text(encoding="utf-8")
        for found in citations(prose_of_python(text) if path.suffix == ".py" else text):
            cited.setdefault(found, set()).add(str(path.relative_to(ROOT)))
    return cited


def _text_files(directory: pathlib.Path):
    for path in directory.iterdir():
        if path.is_dir() and not path.is_symlink():
            if path.name not in SKIPPED_DIRECTORIES and not path.name.endswith(".egg-info"):
                yield from _text_files(path)
        elif path.is_file() and (
            path.suffix in TEXT_SUFFIXES | {".py"}
            or (path.suffix == "" and path.parent.relative_to(ROOT).as_posix() in SCRIPT_DIRECTORIES)
        ):
            yield path


def resolve(reference: str) -> ast.AST:
    """The ``ast`` node of ``path::Name`` or ``path::Class.member``; an AssertionError saying what is missing."""
    path_text, separator, symbol = reference.partition("::")
    assert separator and symbol, f"{reference} is not path::symbol"
    path = ROOT / path_text
    assert path.is_file(), f"{path_text} does not exist"
    scope: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8"), filename=path_text).body
    node: ast.AST | None = None
    for part in symbol.split("."):
        node = next((child for child in scope if part in _names(child)), None)
        assert node is not None, f"{path_text} defines no {symbol} (no {part})"
        scope = getattr(node, "body", [])
    assert node is not None
    return node


def _names(node: ast.stmt) -> tuple[str, ...]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return (node.name,)
    if isinstance(node, ast.Assign):
        return tuple(target.id for target in node.targets if isinstance(target, ast.Name))
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return (node.target.id,)
    return ()


DEFINED = entries(DESIGN.read_text(encoding="utf-8"))


def test_the_design_defines_every_family():
    """The design doc defines invariants of every family (T, D, S, J, C, E, F, P), so a parse that found
    none cannot pass the other checks vacuously."""
    assert {invariant[0] for invariant in DEFINED} == set("TDSJCEFP")


def test_the_scan_sees_each_way_an_invariant_is_cited_and_nothing_else():
    """The citation scan finds an id however the code writes it, and skips names, hex and control-set names."""
    source = (
        '"""DESIGN T1; J2: a (C6) rule, S4/S5 and E1/J4, S1\u2013S11."""\n'
        "T0 = 0xE5  # C0 and C1 controls, (C0, C1, ESC, DEL), 1.D2, F1x\n"
    )
    assert citations(prose_of_python(source)) == {"T1", "J2", "C6", "S4", "S5", "E1", "J4", "S1", "S11"}


def test_every_cited_invariant_is_defined():
    """Every invariant id the code, tests, scripts or docs cite is defined in docs/design.md."""
    cited = cited_by_the_repository()
    assert len(cited) >= len(DEFINED) // 2, "the scan found almost no citation; the pattern is broken"
    undefined = {invariant: sorted(files) for invariant, files in cited.items() if invariant not in DEFINED}
    assert not undefined, f"cited but not defined in docs/design.md: {undefined}"


def test_every_entry_names_its_guard_and_its_red_test():
    """Each invariant entry has exactly one Enforced-by line and one Red-without-it line."""
    for invariant, body in DEFINED.items():
        assert len(ENFORCED.findall(body)) == 1, f"{invariant} needs one '- **Enforced by** `path::symbol`' line"
        assert len(RED.findall(body)) == 1, f"{invariant} needs one '- **Red without it** `tests/...::test`' line"


def _python_references() -> list[tuple[str, str, str]]:
    found = []
    for invariant, body in DEFINED.items():
        for line, pattern in (("Enforced by", ENFORCED), ("Red without it", RED)):
            for reference in pattern.findall(body):
                if "::" in reference:
                    found.append((invariant, line, reference))
    return found


@pytest.mark.parametrize("invariant, line, reference", _python_references())
def test_each_named_module_symbol_and_test_exists(invariant, line, reference):
    """Each ``path::symbol`` of an entry exists (``Class.method`` resolved through the class); a Red-without
    test is a test function under tests/ whose docstring names the invariant it guards."""
    node = resolve(reference)
    if line == "Red without it":
        assert reference.startswith("tests/test_"), f"{invariant}: {reference} is not a test module"
        assert isinstance(node, ast.FunctionDef) and node.name.startswith("test_"), f"{reference} is not a test"
        assert invariant in citations(ast.get_docstring(node) or ""), f"{reference}'s docstring does not name {invariant}"


def test_every_reference_without_a_symbol_is_a_script():
    """An entry may name a script instead of a Python symbol only under scripts/ or .ci/ (P1's CI run)."""
    for invariant, line, reference in (
        (invariant, line, reference)
        for invariant, body in DEFINED.items()
        for line, pattern in (("Enforced by", ENFORCED), ("Red without it", RED))
        for reference in pattern.findall(body)
        if "::" not in reference
    ):
        assert SCRIPT_PATH.match(f"`{reference}"), f"{invariant} {line}: {reference} is neither path::symbol nor a script"


def test_every_script_the_design_names_exists():
    """Every backticked scripts/... or .ci/... path in docs/design.md is a file of this checkout."""
    named = set(SCRIPT_PATH.findall(DESIGN.read_text(encoding="utf-8")))
    assert named, "docs/design.md names no script; the pattern is broken"
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"docs/design.md names scripts that do not exist: {missing}"


def test_the_architecture_page_links_the_design():
    """docs/architecture.md, a newcomer's first page, links to the invariants."""
    assert "(design.md)" in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_every_invariant_has_the_one_edit_that_takes_its_guard_out():
    """scripts/mutation_check.py's MUTATIONS holds, for every invariant here and no other, an edit of a file its Enforced-by
    line names whose piece occurs there exactly once and whose result still compiles: what
    scripts/mutation-check makes before it runs the Red-without-it tests, so the table cannot drift from
    the code it edits (docs/design.md, "Invariants")."""
    check = MUTATION_CHECK
    found = check.claims(DESIGN.read_text(encoding="utf-8"))
    assert found.keys() == DEFINED.keys()
    assert all(claim.red_tests for claim in found.values())
    assert check.check_catalogue(found, check.in_order(found)) == []


def test_the_catalogue_check_names_each_way_an_edit_can_miss_its_guard(monkeypatch):
    """An edit whose piece is gone from its file, occurs twice, changes nothing, breaks the file's syntax or
    lies in a file the Enforced-by line does not name is reported, each with its invariant."""
    check = MUTATION_CHECK
    found = check.claims(DESIGN.read_text(encoding="utf-8"))
    real = check.MUTATIONS["S3"]
    broken = {
        "S3": check.Mutation(real.path, "a piece that is nowhere", "x", "gone"),
        "S1": check.Mutation("launcher/reexec.py", real.old, real.new, "another file"),
        "S2": check.Mutation(check.MUTATIONS["S2"].path, "\n", "\n", "twice"),
        "J4": check.Mutation(check.MUTATIONS["J4"].path, check.MUTATIONS["J4"].old, check.MUTATIONS["J4"].old, "nothing"),
        "E4": check.Mutation(check.MUTATIONS["E4"].path, check.MUTATIONS["E4"].old, "    (\n", "syntax"),
    }
    monkeypatch.setattr(check, "MUTATIONS", {**check.MUTATIONS, **broken})
    problems = check.check_catalogue(found, list(broken))
    assert [problem.split(":")[0] for problem in problems] == list(broken)
    assert "occurs 0 times" in problems[0] and "is not named on its Enforced-by line" in problems[1]
    assert "occurs" in problems[2] and "changes nothing" in problems[3] and "does not compile" in problems[4]


def test_only_a_run_whose_tests_ran_and_failed_is_red():
    """A mutant counts as caught only when pytest ran the red tests and one failed (status 1); an error before
    any test, a timeout, a pass or a skip proves nothing about the guard (scripts/mutation-check)."""
    check = MUTATION_CHECK
    assert check.is_red(check.Run(status=1, tests=3, failures=1, skipped=0, seconds=1.0))
    for status, failures, skipped in ((0, 0, 0), (2, 1, 0), (4, 0, 0), (5, 0, 0), (None, 0, 0), (0, 0, 3)):
        assert not check.is_red(check.Run(status=status, tests=3, failures=failures, skipped=skipped, seconds=1.0))


def test_every_layer_edit_names_tests_that_cite_its_invariant():
    """Each further guard of scripts/mutation_check.py's LAYERS (a layer of docs/threat-model.md) names
    tests that exist, each a test function whose docstring names the layer's invariant, so the red run it
    asks for is that invariant's."""
    check = MUTATION_CHECK
    for layer in check.LAYERS:
        assert layer.invariant in DEFINED, layer
        for test in layer.tests:
            node = resolve(test.split("[")[0])
            assert isinstance(node, ast.FunctionDef) and node.name.startswith("test_"), f"{test} is not a test"
            assert layer.invariant in citations(ast.get_docstring(node) or ""), f"{test}'s docstring does not name {layer.invariant}"


def test_the_check_refuses_what_is_not_an_invariant_and_tells_its_usage():
    """F1: scripts/mutation-check given a name docs/design.md does not define exits 64 with one sentence
    naming it, before it copies or runs anything; --help prints its usage and exits 0."""
    script = ROOT / "scripts" / "mutation-check"
    refused = subprocess.run([str(script), "S3", "X9"], capture_output=True, text=True, timeout=60)
    assert (refused.returncode, refused.stdout) == (64, "")
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("scripts/mutation-check: X9 is not an invariant of docs/design.md")
    helped = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: scripts/mutation-check [INVARIANT...]")
