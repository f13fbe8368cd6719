"""The unprivileged side of casebox: the CLI, transport, plans, receipts and the evaluator."""

# The casebox version every receipt and report carries, and `casebox --version` prints; pyproject.toml
# holds the same string (tests/test_version.py compares them).
VERSION = "0.1.0"
