"""`python -m demo_extra`: import the package and its third-party dependency."""

import six

from demo_extra import as_text

print(f"demo_extra with six {six.__version__}: {as_text(b'resolved offline')}")
