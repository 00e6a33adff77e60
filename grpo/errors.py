"""The one exception type for bad input: it names the tensor, the row and what was expected."""

from __future__ import annotations

SHOWN_CHARACTERS = 200
"""The most characters of a given value (or an unknown field's name) an error message repeats: a request's 1 MB
string is named, not echoed back whole."""


def shown(text: str) -> str:
    """``text`` as an error message repeats it: whole up to ``SHOWN_CHARACTERS``, else cut, with its length."""
    if len(text) <= SHOWN_CHARACTERS:
        return text
    return f"{text[:SHOWN_CHARACTERS]}... ({len(text)} characters)"


class GrpoInputError(ValueError):
    """Bad input to the grpo library.

    ``field`` is the tensor or config field at fault (``per_token_logps``, ``epsilon_low``),
    ``row`` the batch row when one is to blame, ``expected`` what would have been valid.
    """

    def __init__(self, field: str, expected: str, row: int | None = None, got: str | None = None):
        self.field = field
        self.row = row
        self.expected = expected
        self.got = got
        where = shown(field) if row is None else f"{shown(field)}[{row}]"
        message = f"{where}: expected {expected}"
        if got is not None:
            message += f", got {shown(got)}"
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        # the default rebuilds from ``args`` (the message alone), which this __init__ cannot take: a pool
        # worker's error would fail to unpickle in the parent and kill the pool's result thread (a hang)
        return type(self), (self.field, self.expected, self.row, self.got), self.__dict__
