"""casebox demo candidate: the wheel the others build on."""

VERSION = "1.0.0"


def add(left, right):
    """The sum of two numbers."""
    return left + right
