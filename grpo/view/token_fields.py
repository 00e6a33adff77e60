"""The per-token fields an answer carries, one row each: every list of them is read off this table.

The answer's ``tokens`` arrays (``TOKEN_FIELDS``), the heatmaps and the value each is centred on
(``HEATMAP_CENTERS``: white there; a pooled cell keeps its block's token farthest from it), the numbers in a
heatmap cell's hover, the CSV export's columns and the per-token arrays the compare answer keeps all come
from ``TOKEN_FIELD_TABLE``; ``/api/v1/options`` sends it (``token_fields``) and the page builds its
heatmaps, hovers, CSV and compare charts from it. A new heatmap is one row with a ``centre``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenField:
    """One per-token array of the answer (``Breakdown.tokens.<name>``) and where the page shows it.

    ``heatmap``: the heatmap's title (None: no heatmap); ``centre``: the value its colour scale is white at
    (set exactly when ``heatmap`` is); ``colour_range``: the scale's ends where they are fixed (the ratio: 0
    to 2), else the data's; ``hover``: the number's label in a heatmap cell's hover (None: not there);
    ``csv``: a column of the CSV export (named ``name``); ``compare``: kept in each config's compare answer.
    """

    name: str
    label: str
    heatmap: str | None = None
    centre: float | None = None
    colour_range: tuple[float, float] | None = None
    hover: str | None = None
    csv: bool = False
    compare: bool = False

    def __post_init__(self) -> None:
        if (self.heatmap is None) != (self.centre is None):
            raise ValueError(f"token field {self.name!r}: a heatmap needs a centre, and a centre a heatmap")

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


TOKEN_FIELD_TABLE: tuple[TokenField, ...] = (
    TokenField(
        "ratio",
        "ratio π/π_old",
        heatmap="Importance ratio π/π_old (white at 1; the colour saturates outside 0 to 2)",
        centre=1.0,
        colour_range=(0.0, 2.0),
        csv=True,
    ),
    TokenField("clipped_ratio", "clipped ratio", csv=True),
    TokenField(
        "surrogate",
        "surrogate",
        heatmap="Surrogate: each token's objective term (white at 0)",
        centre=0.0,
        hover="surrogate",
        csv=True,
    ),
    TokenField(
        "kl",
        "KL estimate",
        heatmap="KL estimate to the reference (white at 0; blue = negative, which only k1 can be)",
        centre=0.0,
        hover="KL",
        csv=True,
    ),
    TokenField("weight", "aggregation weight", hover="weight", csv=True, compare=True),
    TokenField(
        "loss",
        "loss share",
        heatmap="Weighted loss share (sums to the loss; white at 0)",
        centre=0.0,
        hover="loss share",
        csv=True,
        compare=True,
    ),
    TokenField(
        "grad",
        "∂loss/∂logp",
        heatmap="Gradient ∂loss/∂logp (white at 0; blue, negative: descent raises the log-prob)",
        centre=0.0,
        hover="∂loss/∂logp",
        csv=True,
        compare=True,
    ),
    TokenField("grad_policy", "∂loss/∂logp, policy part", hover="its policy part", csv=True, compare=True),
    TokenField("grad_kl", "∂loss/∂logp, KL part", hover="its KL part", csv=True, compare=True),
    TokenField("log_ratio", "log ratio"),
    TokenField("policy_loss", "policy part"),
    TokenField("kl_loss", "KL part"),
)


# Each list is read off the table when it is used: a row changed or added (a plugin may rebind the table) is in
# all of them.
def token_field_names() -> tuple[str, ...]:
    """The answer's ``tokens`` arrays, in the table's order."""
    return tuple(f.name for f in TOKEN_FIELD_TABLE)


def heatmap_centers() -> dict[str, float]:
    """The heatmaps' fields and the value each is centred on."""
    return {f.name: f.centre for f in TOKEN_FIELD_TABLE if f.centre is not None}


def compare_fields() -> tuple[str, ...]:
    """The per-token arrays each config's compare answer keeps."""
    return tuple(f.name for f in TOKEN_FIELD_TABLE if f.compare)


def token_fields_json() -> list[dict[str, Any]]:
    """The table as ``/api/v1/options`` sends it (``token_fields``), in the answer's order: the page takes its
    heatmaps (a centre), hover numbers (a hover label) and CSV columns (csv) from it."""
    return [f.describe() for f in TOKEN_FIELD_TABLE]


# The built-in table's lists, as names to import.
TOKEN_FIELDS = token_field_names()
HEATMAP_CENTERS = heatmap_centers()
COMPARE_FIELDS = compare_fields()
