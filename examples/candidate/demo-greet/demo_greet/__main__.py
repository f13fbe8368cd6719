"""`python -m demo_greet`: import the package and its dependency, and greet."""

from demo_greet import greeting

print(greeting("world"))
