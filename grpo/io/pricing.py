"""What a file's read fields would unpack to, priced from its headers before anything is unpacked."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from grpo.errors import GrpoInputError
from grpo.fields import ALIASES, BATCH_FIELDS

# Read beside ``logits`` only: they become log-probs (``grpo.logits.token_logprobs``).
LOGITS_FIELDS = ("logits", "token_ids", "ref_logits", "old_logits", "prompt_length", "temperature")
HELD_BYTES = 8
"""Bytes one value takes as the batch holds it (float64 or int64): a tensor read is priced at least this."""
STRING_BYTES = 80
"""A display string's Python object, beyond its characters."""
PICKLE_BYTES = 64
"""What one byte of a .pt file's pickle may make as it is read (about one Python object per opcode)."""


class UnpackLimitError(GrpoInputError):
    """A file whose read fields would unpack past the limit, refused before any is unpacked (the server
    answers 413); ``field`` names the entry that passed it."""

    def __init__(
        self, field: str, expected: str = "a smaller file once unpacked", row: int | None = None, got: str | None = None
    ):
        super().__init__(field, expected, row, got)


@dataclass
class Budget:
    """What a file's read entries would unpack to, added up against ``limit`` entry by entry."""

    limit: int
    total: int = 0

    def add(self, name: str, size: int, what: str) -> None:
        self.total += size
        if self.total > self.limit:
            expected = f"at most {self.limit} bytes once unpacked (a setting)"
            raise UnpackLimitError(name, expected, got=f"{self.total} bytes with {name} ({what})")


def price(values: int, nbytes: int) -> int:
    """A read tensor's cost: its bytes unpacked, or its values as the batch holds them, the larger."""
    return max(nbytes, values * HELD_BYTES)


def reads(name: str, names: Collection[str]) -> bool:
    """Whether the readers keep a file's tensor ``name``: a batch field or its alias, the display strings, the
    logits fields beside ``logits``. Any other is reported as ignored and never unpacked."""
    if name in LOGITS_FIELDS:
        return "logits" in names
    return name in BATCH_FIELDS or name in ALIASES or name == "tokens"
