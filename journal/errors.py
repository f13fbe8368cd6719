"""The one refusal type every casebox layer raises for bad input.

It lives in the lowest layer so that journal/, executor/ and steward/ share
it; the front end turns it into exit 64 and its sentence (DESIGN F1).
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` safe for one terminal line: every unprintable character escaped.

    A file name or a message can hold a newline or a terminal escape; shown
    raw, it would split the one-sentence answer or rewrite the screen.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)


class Refused(Exception):
    """Input broke a closed rule. ``where`` names the path or field, ``rule`` the rule."""

    def __init__(self, where: str, rule: str) -> None:
        super().__init__(where, rule)
        self.where = where
        self.rule = rule

    def sentence(self) -> str:
        text = one_line(f"{self.where}: {self.rule}" if self.where else self.rule)
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
