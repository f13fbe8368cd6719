"""`python -m demo_core`: import the package and show one result."""

from demo_core import VERSION, add

print(f"demo_core {VERSION}: add(2, 3) = {add(2, 3)}")
