"""A small registry per independent choice: a dict, a decorator and a getter.

Like verl's ``register_policy_loss``: every member of one registry shares one signature, so no
caller special-cases a member. An entry carries everything the rest of the code needs to know
about its variant: its function, a display label, the page's axis text, what its flat regions
mean, the metrics it reports and how they reduce, and its warnings. Its doc is the first line of
the function's docstring (the tooltip), its details the rest, its paper the ``Paper: <url>`` line.
Nothing outside a registry compares a variant's name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from torch import Tensor

from grpo.errors import GrpoInputError

F = TypeVar("F", bound=Callable[..., object])


class Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)


def by_name(items: Iterable[N]) -> dict[str, N]:
    """A table of ``items`` (scenarios, tasks, comparisons) keyed by their names, in their order; a name
    given twice is a bug: ValueError."""
    table: dict[str, N] = {}
    for item in items:
        if item.name in table:
            raise ValueError(f"{item.name!r} is named twice")
        table[item.name] = item
    return table


Reduction = Literal["trl", "tokens"]
"""How an objective's 0/1 flags become a metric. ``trl``: TRL's masked_batch_mean (the mean over
rows when the flags are per row, as at sequence level; else over the counted tokens). ``tokens``:
verl's masked mean over the counted tokens, always."""


@dataclass(frozen=True)
class Why:
    """An objective's reading of each token: one code per token and one sentence per code.

    ``codes(ratio, advantages, region, config)`` maps the (B, T) token ratio, the (B, T) advantages
    and the (B, T) int region codes to (B, T) int indices into ``names``. ``texts`` are templates
    whose ``{placeholders}`` are filled from ``values(config)``: the numbers of the config on screen,
    never a literal. ``no_gradient``: the codes whose tokens get no policy gradient.
    """

    names: tuple[str, ...]
    codes: Callable[[Tensor, Tensor, Tensor, Any], Tensor]
    texts: Mapping[str, str]
    values: Callable[[Any], Mapping[str, float | None]]
    no_gradient: frozenset[str] = frozenset()
    selected: str | None = None
    """The code of the tokens the objective's own rule picked (ObjectiveTerms.selected: Clip-Cov's cut,
    KL-Cov's penalised), whatever their region; None: the objective picks none."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """How the page's summary and legends name a group of tokens by their code (a code without one: its name)."""


Warnings = Callable[[Any, int], list[str]]
"""warnings(config, longest_row) -> sentences: what this variant's settings get wrong for a batch
whose longest counted row has ``longest_row`` tokens."""


def no_warnings(config: Any, longest_row: int) -> list[str]:
    return []


@dataclass(frozen=True)
class Entry(Generic[F]):
    """One registered variant and what the rest of the code knows about it."""

    name: str
    fn: F
    label: str
    """Display label (the page's select, the README table)."""
    axis: str = ""
    """The page's axis title for this variant's curves ('' where it draws none)."""
    flat: str = ""
    """What a token in a flat region means under this variant ('' when it has none)."""
    metrics: Mapping[str, Reduction] = field(default_factory=dict)
    """The trainer metrics this variant reports (keys of its flags), and how each reduces."""
    warnings: Warnings = no_warnings
    reward_std: Callable[[Tensor], Tensor] | None = None
    """Advantages only: the reward spread TRL logs as reward_std under this normalisation, from
    the rewards grouped (n_groups, G)."""
    needs: tuple[str, ...] = ()
    """Advantages only: the batch fields the estimator reads beyond the rewards (a batch without one is
    refused, naming it)."""
    per_token: bool = False
    """Advantages only: the estimator gives each token its own advantage, (B, T) (a discounted return)."""
    why: Why | None = None
    """Objectives only: what each token's code means (None: the region names, read as they are)."""

    @property
    def doc(self) -> str:
        """The first line of the function's docstring."""
        return next(iter(_docstring(self.fn).splitlines()), "")

    @property
    def details(self) -> str:
        """The docstring without its first line and its ``Paper:`` line."""
        lines = _docstring(self.fn).splitlines()[1:]
        return "\n".join(ln for ln in lines if not ln.startswith("Paper:")).strip()

    @property
    def paper(self) -> str:
        """The URL on the ``Paper:`` docstring line ('' when there is none)."""
        for line in _docstring(self.fn).splitlines():
            if line.startswith("Paper:"):
                return line.removeprefix("Paper:").strip()
        return ""

    def describe(self) -> dict[str, Any]:
        """What /api/v1/options lists for this entry."""
        return {
            "name": self.name,
            "label": self.label,
            "doc": self.doc,
            "details": self.details,
            "paper": self.paper,
            "axis": self.axis,
            "flat": self.flat,
            "metrics": dict(self.metrics),
            **({"needs": list(self.needs)} if self.needs else {}),
        }


def _docstring(fn: object) -> str:
    return inspect.getdoc(fn) or ""


class Registry(Generic[F]):
    """Named entries of one kind (``objective``, ``kl_estimator``, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[F]] = {}

    def register(
        self,
        name: str,
        *,
        label: str | None = None,
        axis: str = "",
        flat: str = "",
        metrics: Mapping[str, Reduction] | None = None,
        warnings: Warnings = no_warnings,
        reward_std: Callable[[Tensor], Tensor] | None = None,
        why: Why | None = None,
        needs: tuple[str, ...] = (),
        per_token: bool = False,
    ) -> Callable[[F], F]:
        """Decorator: register ``fn`` under ``name`` with what the rest of the code needs to know."""

        def decorate(fn: F) -> F:
            if name in self._entries:
                raise KeyError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = Entry(
                name,
                fn,
                label or name,
                axis,
                flat,
                dict(metrics or {}),
                warnings,
                reward_std=reward_std,
                why=why,
                needs=needs,
                per_token=per_token,
            )
            return fn

        return decorate

    def entry(self, name: str) -> Entry[F]:
        if name not in self._entries:
            raise GrpoInputError(self.kind, f"one of {', '.join(self.names())}", got=repr(name))
        return self._entries[name]

    def get(self, name: str) -> F:
        return self.entry(name).fn

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def entries(self) -> Iterator[Entry[F]]:
        return iter(tuple(self._entries.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._entries
