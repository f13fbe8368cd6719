"""The serialized FFI cffi writes for a declaration: what the launcher's ABI-mode bindings must hold byte for byte."""

from __future__ import annotations

import pathlib

import pytest


def serialized(cdef: str, module: str, tmp_path: pathlib.Path) -> tuple[tuple, dict]:
    """(positional, keyword) arguments of the ``_cffi_backend.FFI(...)`` call cffi emits for ``cdef``."""
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(module, None)
    out = tmp_path / "abi.py"
    ffi.emit_python_code(str(out))
    text = out.read_text()
    constructor = text[text.index("_cffi_backend.FFI(") + len("_cffi_backend.FFI(") : text.rindex(")")]
    namespace: dict = {}
    exec(f"args = (lambda *a, **k: (a, k))({constructor})", namespace)
    return namespace["args"]
