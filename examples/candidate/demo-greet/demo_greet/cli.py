"""The `demo-greet NAME...` console script."""

import sys

from demo_greet import greeting


def main():
    names = sys.argv[1:] or ["world"]
    for name in names:
        print(greeting(name))
    return 0
