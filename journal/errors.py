"""The one refusal type every casebox layer raises for bad input.

It lives in the lowest layer so that journal/, executor/ and steward/ share
it; the front end turns it into exit 64 and its sentence (DESIGN F1).
"""

from __future__ import annotations

from journal.untrusted import escape

# A refusal names a path, a member or a field that may be as long as its own cap: the sentence keeps this
# much of where, and of the rule, so the rule is never cut off by a long name.
WHERE_LIMIT = 1_000
SENTENCE_LIMIT = 2_000


class Refused(Exception):
    """Input broke a closed rule. ``where`` names the path or field, ``rule`` the rule."""

    def __init__(self, where: str, rule: str) -> None:
        super().__init__(where, rule)
        self.where = where
        self.rule = rule

    def sentence(self) -> str:
        rule = escape(self.rule, limit=SENTENCE_LIMIT)
        text = f"{escape(self.where, limit=WHERE_LIMIT)}: {rule}" if self.where else rule
        return text if text.endswith(".") else text + "."

    def under(self, outer: str) -> "Refused":
        """The same refusal, located inside ``outer`` (a file, a member, a message)."""
        where = f"{outer} at {self.where}" if self.where else outer
        clone = type(self).__new__(type(self))
        Exception.__init__(clone, where, self.rule)
        clone.__dict__.update(self.__dict__)
        clone.where = where
        return clone

    def __str__(self) -> str:
        return self.sentence()
