"""A small registry per independent choice: a dict, a decorator and a getter.

Like verl's ``register_policy_loss``: every member of one registry shares one signature, so no
caller special-cases a member. Each kind has its own entry type holding what the rest of the code
needs to know about its variants: every entry its function, display label, warnings and the
settings of its own (``Setting``: LossConfig's field table collects them); an objective also the
page's axis text, what its flat regions mean, the metrics it reports and its reading of each token;
an advantage estimator its reward spread and the batch fields it needs; a correction its level and
action. An entry's doc is the first line of the function's docstring (the tooltip), its details the
rest, its paper the ``Paper: <url>`` line. Nothing outside a registry compares a variant's name.

``FieldSpec`` is one setting as LossConfig's checks, the API's request model and the page see it, whether a
field of LossConfig or a setting a plugin's variant declares (``setting_spec``).
"""

from __future__ import annotations

import builtins
import dataclasses
import inspect
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, overload

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
class Setting:
    """A setting a variant declares in its registration: LossConfig's field table collects it (the checks,
    the API's request model, the CLI's ``--set``, the page's controls and ``/api/v1/options``)."""

    name: str
    default: Any
    doc: str
    """One line: the control's tooltip."""
    type: type = float
    """float, int, str or bool: the values it takes (None too when ``nullable``)."""
    nullable: bool = False
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] | None = None
    trl: str | None = None
    """The TRL GRPOConfig field it maps from (None: TRL has none)."""
    verl: str | None = None
    """The verl actor config field it maps from (None: verl has none)."""
    group: str = "policy"
    """The control panel it belongs to."""

    def bounds(self) -> dict[str, float]:
        """ge / gt / le, those given."""
        given = {"ge": self.ge, "gt": self.gt, "le": self.le}
        return {k: v for k, v in given.items() if v is not None}


@dataclass(frozen=True)
class Entry(Generic[F]):
    """One registered variant: what every kind knows about its variants."""

    name: str
    fn: F
    label: str
    """Display label (the page's select, the README table)."""
    warnings: Warnings = no_warnings
    settings: tuple[Setting, ...] = ()
    """The settings of the variant's own (LossConfig's field table collects them)."""

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

    def facts(self) -> dict[str, Any]:
        """The facts of this kind /api/v1/options lists beside the common ones."""
        return {"axis": "", "flat": "", "metrics": {}}

    def describe(self) -> dict[str, Any]:
        """What /api/v1/options lists for this entry."""
        own = {"settings": [s.name for s in self.settings]} if self.settings else {}
        common = {"name": self.name, "label": self.label, "doc": self.doc, "details": self.details}
        return common | {"paper": self.paper} | self.facts() | own


@dataclass(frozen=True)
class ObjectiveEntry(Entry[F]):
    """A policy objective."""

    axis: str = ""
    """The page's axis title for this objective's curves ('' where it draws none)."""
    flat: str = ""
    """What a token in a flat region means under this objective ('' when it has none)."""
    metrics: Mapping[str, Reduction] = field(default_factory=dict)
    """The trainer metrics this objective reports (keys of its flags), and how each reduces."""
    why: Why | None = None
    """What each token's code means (None: the region names, read as they are)."""

    def facts(self) -> dict[str, Any]:
        return {"axis": self.axis, "flat": self.flat, "metrics": dict(self.metrics)}


@dataclass(frozen=True)
class AdvantageEntry(Entry[F]):
    """An advantage estimator."""

    reward_std: Callable[[Tensor], Tensor] | None = None
    """The reward spread TRL logs as reward_std under this normalisation, from the rewards grouped (n_groups, G)."""
    needs: tuple[str, ...] = ()
    """The batch fields the estimator reads beyond the rewards (a batch without one is refused, naming it)."""
    per_token: bool = False
    """The estimator gives each token its own advantage, (B, T) (a discounted return)."""

    def facts(self) -> dict[str, Any]:
        return super().facts() | ({"needs": list(self.needs)} if self.needs else {})


@dataclass(frozen=True)
class KLEstimatorEntry(Entry[F]):
    """A per-token KL estimator: its function and docstring say all there is."""


@dataclass(frozen=True)
class AggregationEntry(Entry[F]):
    """An aggregation: its function, docstring and warnings say all there is."""


CorrectionLevel = Literal["token", "sequence"]
CorrectionAction = Literal["truncate", "mask"]


@dataclass(frozen=True)
class CorrectionEntry(Entry[F]):
    """A rollout correction mode: the level its weight is computed at and what it does where its bounds act."""

    level: CorrectionLevel | None = None
    """token: one weight per token (B, T); sequence: one per row (B, 1); None: no weight (no correction)."""
    action: CorrectionAction | None = None
    """truncate: the weight is clamped to the bounds; mask: a weight outside them becomes 0; None: nothing acts."""

    def facts(self) -> dict[str, Any]:
        return super().facts() | {"level": self.level, "action": self.action}


def _docstring(fn: object) -> str:
    return inspect.getdoc(fn) or ""


E = TypeVar("E", bound=Entry[Any])


class Registry(Generic[F]):
    """Named entries of one kind (``objective``, ``kl_estimator``, ...), each of ``entry_type``."""

    entry_type: type[Entry[Any]] = Entry
    registrations = 0
    """How many entries every registry together has had registered (what a table derived from them keys on)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[F]] = {}

    def register(self, name: str, *, label: str | None = None, **facts: Any) -> Callable[[F], F]:
        """Decorator: register ``fn`` under ``name`` with the facts of this kind's entry type."""
        known = {f.name for f in dataclasses.fields(self.entry_type)} - {"name", "fn", "label"}
        unknown = sorted(set(facts) - known)
        if unknown:
            raise TypeError(f"a {self.kind} entry has no {unknown[0]!r}: one of {', '.join(sorted(known))}")

        def decorate(fn: F) -> F:
            if name in self._entries:
                raise KeyError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = self.entry_type(name, fn, label or name, **facts)
            Registry.registrations += 1
            return fn

        return decorate

    def entry(self, name: str) -> Entry[F]:
        if name not in self._entries:
            raise GrpoInputError(self.kind, f"one of {', '.join(self.names())}", got=repr(name))
        return self._entries[name]

    def typed(self, name: str, entry_type: type[E]) -> E:
        """The entry of ``name``, as the kind's own entry type (what its subclass's ``entry`` returns)."""
        found = Registry.entry(self, name)
        assert isinstance(found, entry_type)
        return found

    def get(self, name: str) -> F:
        return self.entry(name).fn

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def entries(self) -> Iterator[Entry[F]]:
        return iter(tuple(self._entries.values()))

    def settings(self) -> Iterator[Setting]:
        """Every setting its entries declare, in registration order."""
        return (s for e in self.entries() for s in e.settings)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


class TypedRegistry(Registry[F], Generic[F, E]):
    """A registry whose ``entry`` and ``entries`` give its own entry type ``E`` (the facts beyond Entry's)."""

    entry_type: type[E]

    def entry(self, name: str) -> E:
        return self.typed(name, self.entry_type)

    def entries(self) -> Iterator[E]:
        return (self.entry(name) for name in self.names())


class AdvantageRegistry(TypedRegistry[F, AdvantageEntry[F]]):
    entry_type: type[AdvantageEntry[F]] = AdvantageEntry


class KLEstimatorRegistry(Registry[F]):
    entry_type = KLEstimatorEntry


class AggregationRegistry(Registry[F]):
    entry_type = AggregationEntry


class CorrectionRegistry(TypedRegistry[F, CorrectionEntry[F]]):
    entry_type: type[CorrectionEntry[F]] = CorrectionEntry


# --- a setting as the checks, the API's request model and the page see it (LossConfig's field table) ---------
MAX_MAGNITUDE = 1e30  # numbers past this overflow float32 once multiplied by a ratio or an advantage
MAX_INT = 2**31 - 1
Choices = Registry[Any] | tuple[str, ...]


TYPES = {str: "string", float: "number", int: "integer", bool: "boolean"}
BOUNDS = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<=")}


@dataclass(frozen=True)
class FieldSpec:
    """One LossConfig field as the checks, the request model and the page see it."""

    name: str
    type: str
    """string, number, integer or boolean."""
    python_type: builtins.type[Any]
    nullable: bool
    default: Any
    doc: str
    group: str
    bounds: dict[str, float]
    """ge / gt / le, from the field's metadata."""
    choices: Choices | None
    trl: str | None = None
    """The TRL config field it maps from, when its declaration names one."""
    verl: str | None = None
    """The verl config field it maps from, when its declaration names one."""

    def choice_names(self) -> tuple[str, ...]:
        """The valid names now (a registry's grow as plugins register)."""
        choices = self.choices
        return choices.names() if isinstance(choices, Registry) else tuple(choices or ())

    def check(self, value: Any) -> None:
        """Raise GrpoInputError naming the field unless ``value`` has its type and range."""
        if self.choices is not None:
            if value not in self.choice_names():
                raise GrpoInputError(self.name, f"one of {', '.join(self.choice_names())}", got=repr(value))
            return
        if value is None:
            if not self.nullable:
                raise GrpoInputError(self.name, f"a value of type {self.python_type.__name__}", got="None")
            return
        if self.type == "string":
            if not isinstance(value, str):
                raise GrpoInputError(self.name, "a string", got=repr(value))
            return
        if self.type == "boolean":
            if not isinstance(value, bool):
                raise GrpoInputError(self.name, "true or false", got=repr(value))
            return
        if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) <= MAX_MAGNITUDE:
            # NaN fails the comparison too; the bound keeps every value finite in float32 arithmetic
            raise GrpoInputError(self.name, f"a finite number within ±{MAX_MAGNITUDE:g}", got=repr(value))
        if self.type == "integer" and not (float(value).is_integer() and value <= MAX_INT):
            raise GrpoInputError(self.name, f"an integer up to {MAX_INT}", got=repr(value))
        for bound, limit in self.bounds.items():
            holds, words = BOUNDS[bound]
            if not holds(value, limit):
                raise GrpoInputError(self.name, f"a number {words} {limit}", got=repr(value))

    def describe(self) -> dict[str, Any]:
        """What /api/v1/options lists for this field."""
        entry: dict[str, Any] = {
            "name": self.name,
            "doc": self.doc,
            "group": self.group,
            "default": self.default,
            "nullable": self.nullable,
            "type": "choice" if self.choices is not None else self.type,
        }
        if self.choices is not None:
            entry["choices"] = list(self.choice_names())
        trainers = {k: v for k, v in (("trl", self.trl), ("verl", self.verl)) if v is not None}
        return entry | self.bounds | trainers


def setting_spec(setting: Setting) -> FieldSpec:
    """The field a variant's declared setting adds to the table (a plugin's: LossConfig has no field of it)."""
    return FieldSpec(
        name=setting.name,
        type=TYPES[setting.type],
        python_type=setting.type,
        nullable=setting.nullable,
        default=setting.default,
        doc=setting.doc,
        group=setting.group,
        bounds=setting.bounds(),
        choices=setting.choices,
        trl=setting.trl,
        verl=setting.verl,
    )


class Table(Sequence[Any]):
    """A tuple that grows with the plugins' settings: ``build()`` read on each use (equals a tuple of its items)."""

    def __init__(self, build: Callable[[], tuple[Any, ...]]) -> None:
        self._build = build

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Any, ...]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self._build()[index]

    def __len__(self) -> int:
        return len(self._build())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._build())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._build())
