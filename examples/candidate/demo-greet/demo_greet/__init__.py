"""casebox demo candidate: a wheel that depends on another (demo-core)."""

from demo_core import add


def greeting(name):
    """A greeting that counts the letters of ``name`` with demo_core."""
    letters = sum(add(0, 1) for char in name if char.isalpha())
    return f"hello, {name} ({letters} letters)"
