"""Numbers inside sentences, each marked with the quantity it shows.

A sentence (an explanation, a warning, a description) writes each number with ``mark(quantity, value)``;
``plain`` gives the text a reader sees, ``parts_of`` its pieces and numbers ({quantity, value, text}) for the
page to tag. Here, apart from ``grpo.explain``, so that the modules that write warnings (``grpo.loss``, the
registries' entries) mark their numbers too without importing the explanation (which imports them).
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_DIGITS = 12  # a number never prints with more significant digits than this


def number(x: float, digits: int = 4) -> str:
    """``x`` with ``digits`` significant digits, or more where fewer would print a whole number it is
    not (1 + 4e-4 is "1.0004", never "1"). No "-0"."""
    x = float(x) + 0.0
    if not math.isfinite(x):
        return str(x)
    text = f"{x:.{digits}g}"
    while digits < MAX_DIGITS and "e" not in text and float(text) != x and float(text) == round(float(text)):
        digits += 1
        text = f"{x:.{digits}g}"
    return text


# A number inside a sentence, with the quantity it shows: START quantity SEP value SEP text END.
START, SEP, END = "\x02", "\x1f", "\x03"
_MARKED = re.compile(f"{START}([^{SEP}]*){SEP}([^{SEP}]*){SEP}([^{END}]*){END}")


def mark(quantity: str, value: float, digits: int = 4) -> str:
    """The number as a sentence prints it, marked with its quantity (the API's name for it)."""
    return f"{START}{quantity}{SEP}{float(value)!r}{SEP}{number(value, digits)}{END}"


def percent(quantity: str, share: float) -> str:
    """A share printed as a percentage ("20%", three significant digits), marked with the share itself."""
    return f"{START}{quantity}{SEP}{float(share)!r}{SEP}{number(100 * share, 3)}%{END}"


def mark_all(quantity: str, values: list[int]) -> str:
    """A list of integers as Python prints it ("[0, 2]"), each marked as ``quantity/k`` (its k-th item)."""
    return "[" + ", ".join(mark(f"{quantity}/{k}", v, MAX_DIGITS) for k, v in enumerate(values)) + "]"


def plain(text: str) -> str:
    return _MARKED.sub(lambda m: m[3], text)


def parts_of(text: str) -> list[str | dict[str, Any]]:
    """A marked sentence as text pieces and numbers: {"quantity", "value", "text"}."""
    out: list[str | dict[str, Any]] = []
    last = 0
    for m in _MARKED.finditer(text):
        if m.start() > last:
            out.append(text[last : m.start()])
        out.append({"quantity": m[1], "value": float(m[2]), "text": m[3]})
        last = m.end()
    if last < len(text):
        out.append(text[last:])
    return out
