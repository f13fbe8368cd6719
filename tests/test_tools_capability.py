"""The tools capability (executor/attempt.py ``_tools``): casebox's sandboxed modules, with checked bytecode.

The capability is read-only in every sandbox, so a module without bytecode
there is compiled from source by every extract, resolve, fetch and install
op (issue 14). scripts/bootstrap and scripts/install compile the tools'
files checked-hash (``compile_tools``); ``_tools`` takes a .pyc only when
it is checked-hash bytecode of exactly the source it copies, so a stale
one never reaches a sandbox, and the op's interpreter checks it again.
"""

from __future__ import annotations

import importlib.util
import pathlib
import py_compile
import subprocess
import sys

import pytest

from executor import inside
from executor.attempt import _installed_bytecode
from executor.cases.runtime import choose_interpreter

RUNTIME = choose_interpreter()
TAG = subprocess.run([RUNTIME, "-I", "-S", "-c", "import sys; print(sys.implementation.cache_tag)"],
                     capture_output=True, text=True).stdout.strip()
WRITE_TOOLS = """
import os, sys
from executor.attempt import _tools, compile_tools
compile_tools()
for relative, data in _tools().items():
    path = os.path.join(sys.argv[1], relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as file:
        file.write(data)
"""


def _compiled(path: pathlib.Path, mode: py_compile.PycInvalidationMode) -> bytes:
    py_compile.compile(str(path), doraise=True, invalidation_mode=mode)
    return pathlib.Path(importlib.util.cache_from_source(str(path))).read_bytes()


def test_only_checked_bytecode_of_exactly_the_copied_source_is_taken(tmp_path):
    """issue 14 (a stale .pyc never runs): the installation's .pyc is taken when it is checked-hash bytecode
    of the very bytes copied; not a timestamp or unchecked one (the op's interpreter would trust those
    without its source), not one compiled from other source, and nothing when there is none."""
    module = tmp_path / "tool.py"
    source = b"WHO = 'the source'\n"
    module.write_bytes(source)
    assert _installed_bytecode(str(module), source) is None
    checked = _compiled(module, py_compile.PycInvalidationMode.CHECKED_HASH)
    assert _installed_bytecode(str(module), source) == checked
    assert _installed_bytecode(str(module), b"WHO = 'an edit since'\n") is None
    for mode in (py_compile.PycInvalidationMode.UNCHECKED_HASH, py_compile.PycInvalidationMode.TIMESTAMP):
        _compiled(module, mode)
        assert _installed_bytecode(str(module), source) is None, mode


@pytest.mark.skipif(TAG != sys.implementation.cache_tag, reason=f"the runtime {RUNTIME} is {TAG}: no bytecode of casebox's is its")
def test_a_tool_op_loads_every_casebox_module_from_the_capabilitys_bytecode(tmp_path):
    """issue 14: once compile_tools ran, every file of the capability has its checked-hash .pyc beside it, and
    the runtime, run as an op runs it (``-I -S -B``, the capability first on its path), loads each casebox
    module it imports from that .pyc and compiles none from source."""
    tools = tmp_path / "tools"
    written = subprocess.run([sys.executable, "-I", "-X", f"pycache_prefix={tmp_path / 'cache'}", "-c", WRITE_TOOLS,
                              str(tools)], capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    sources = sorted(path for path in tools.rglob("*.py"))
    assert {str(path.relative_to(tools)) for path in sources} >= set(inside.modules())
    for path in sources:
        pyc = path.parent / "__pycache__" / f"{path.stem}.{TAG}.pyc"
        assert pyc.read_bytes()[4:16] == (0b11).to_bytes(4, "little") + importlib.util.source_hash(path.read_bytes())
    boot = inside.BOOT.replace(repr(inside.TOOLS), repr(str(tools))).split("; from executor.inside")[0]
    code = boot + "; import executor.inside, executor.transport.extract, executor.deps.resolver, installer"
    shown = subprocess.run([RUNTIME, "-I", "-S", "-B", "-v", "-c", code], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    loaded = [line.removeprefix("# code object from ").strip("'") for line in shown.stderr.splitlines()
              if line.startswith("# code object from ") and str(tools) in line]
    from_source = [path for path in loaded if path.endswith(".py")]
    assert len(loaded) >= 10 and not from_source, from_source or loaded
