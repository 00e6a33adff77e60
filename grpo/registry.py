"""A small registry per independent choice: a dict, a decorator and a getter.

Like verl's ``register_policy_loss``: every member of one registry shares one signature, so no
caller special-cases a member. The first docstring line of each member is its tooltip; a line
``Paper: <url>`` in the docstring is its reference.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Generic, TypeVar

from grpo.errors import GrpoInputError

F = TypeVar("F", bound=Callable[..., object])


class Registry(Generic[F]):
    """Named functions of one kind (``objective``, ``kl_estimator``, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def decorate(fn: F) -> F:
            if name in self._entries:
                raise KeyError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = fn
            return fn

        return decorate

    def get(self, name: str) -> F:
        if name not in self._entries:
            raise GrpoInputError(self.kind, f"one of {', '.join(self.names())}", got=repr(name))
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def doc(self, name: str) -> str:
        """The first line of the member's docstring."""
        return (inspect.getdoc(self.get(name)) or "").splitlines()[0]

    def details(self, name: str) -> str:
        """The member's docstring without its first line and its ``Paper:`` line."""
        lines = (inspect.getdoc(self.get(name)) or "").splitlines()[1:]
        return "\n".join(ln for ln in lines if not ln.startswith("Paper:")).strip()

    def paper(self, name: str) -> str:
        """The URL on the member's ``Paper:`` docstring line ('' when there is none)."""
        for line in (inspect.getdoc(self.get(name)) or "").splitlines():
            if line.startswith("Paper:"):
                return line.removeprefix("Paper:").strip()
        return ""
