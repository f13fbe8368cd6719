"""casebox demo candidate: a wheel whose dependency comes from the find-links index (six)."""

import six


def as_text(data):
    """``data`` as text, through the third-party dependency."""
    return six.ensure_text(data, encoding="utf-8")
