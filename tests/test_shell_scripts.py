"""The shell scripts name casebox's modules by dotted path (``python -m executor.X``, ``from executor.X import
Y``), where no import check sees them: each must still resolve, or a module move breaks the guest's steps
(scripts/platform-guest runs only in the qemu guest, docs/platforms.md) without any host test going red."""

from __future__ import annotations

import importlib
import importlib.util
import re

import pytest

from conftest import REPO

SHELL_SCRIPTS = sorted(path for path in (REPO / "scripts").iterdir()
                       if path.is_file() and path.read_bytes().startswith(b"#!/usr/bin/env bash"))
RUN_MODULE = re.compile(r"-m ((?:executor|journal|steward|launcher)(?:\.\w+)+)")
FROM_IMPORT = re.compile(r"from ((?:executor|journal|steward|launcher)(?:\.\w+)*) import ([\w, ]+)")


def references() -> list[tuple[str, str, tuple[str, ...]]]:
    found = []
    for path in SHELL_SCRIPTS:
        text = path.read_text()
        found += [(path.name, module, ()) for module in RUN_MODULE.findall(text)]
        found += [(path.name, module, tuple(name.strip() for name in names.split(","))) for module, names in FROM_IMPORT.findall(text)]
    return found


def test_the_scripts_name_some_modules():
    """The scan is not vacuous: platform-guest builds the demo's wheels and reads its designed table."""
    assert {name for name, _, _ in references()} >= {"platform-guest"}


@pytest.mark.parametrize("script, module, names", references())
def test_every_module_a_shell_script_names_exists(script, module, names):
    assert importlib.util.find_spec(module) is not None, f"scripts/{script} names {module}, which does not exist"
    loaded = importlib.import_module(module)
    for name in names:
        assert hasattr(loaded, name), f"scripts/{script} imports {name} from {module}, which has none"
