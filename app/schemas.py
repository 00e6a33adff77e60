"""Request models: validation lives here, in pydantic, so routes stay thin.

Field names follow TRL; verl's and the article's names are accepted as aliases. Each token
value is checked by pydantic (finite, a log-prob <= 0, a mask 0 or 1), so an error's ``loc``
names the field, the row and the position. Cross-field checks (row lengths, exactly one of
rewards/advantages, config values) are the grpo library's, mapped to the same error shape.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, create_model

import grpo
from grpo.config import MAX_INT, MAX_MAGNITUDE, FieldSpec
from grpo.examples import ARTICLE_EXAMPLE
from grpo.io import ALIASES

LogProb = Annotated[float, Field(le=0, allow_inf_nan=False)]
# A reward or an advantage is a JSON number: a strict float takes ints, never true/false (the schema says
# "number"). Per-token rows stay lax like the vectorised reader, which reads true as 1 (tests/test_ingest.py).
Finite = Annotated[float, Field(allow_inf_nan=False, strict=True)]
MaskValue = Annotated[int, Field(ge=0, le=1)]
Entropy = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0)]
# Lists stop at their first bad entry (fail_fast): one error per field, not one per number, so a
# million positive log-probs cost one error, not seconds and hundreds of MB of them.
FAIL_FAST = Field(fail_fast=True)
Row = Annotated[list[LogProb], Field(min_length=1, fail_fast=True)]
Rows = Annotated[list[Row], Field(min_length=1, fail_fast=True)]
LogProbRows = Annotated[list[Annotated[list[LogProb], FAIL_FAST]], FAIL_FAST]
MaskRows = Annotated[list[Annotated[list[MaskValue], FAIL_FAST]], FAIL_FAST]
EntropyRows = Annotated[list[Annotated[list[Entropy], FAIL_FAST]], FAIL_FAST]
TextRows = Annotated[list[Annotated[list[str], FAIL_FAST]], FAIL_FAST]
Numbers = Annotated[list[Finite], FAIL_FAST]
Counts = Annotated[list[Count], FAIL_FAST]


def _aliases(name: str) -> AliasChoices:
    return AliasChoices(name, *(alias for alias, target in ALIASES.items() if target == name))


# Config numbers are used as float32 scalars (1 + epsilon_high, clamp bounds): past float32's
# range torch refuses them, so the request model bounds them as LossConfig does (grpo.config).
CONFIG_TYPES: dict[str, Any] = {
    "string": str,
    "number": Annotated[float, Field(ge=-MAX_MAGNITUDE, le=MAX_MAGNITUDE, allow_inf_nan=False)],
    "integer": Annotated[int, Field(ge=-MAX_INT, le=MAX_INT)],
    "boolean": bool,
}


def _config_field(spec: FieldSpec) -> tuple[Any, Any]:
    """The pydantic (type, Field) of one LossConfig field, from grpo's field table. Ranges and
    choices are checked by LossConfig itself, so their errors read the same from every entry point."""
    kind = CONFIG_TYPES[spec.type]
    preset = spec.name == "preset"
    return (
        kind | None if spec.nullable else kind,
        Field("article" if preset else None, description=spec.doc + ("" if preset else " (default: the preset's)")),
    )


# Every LossConfig field, optional: a field left out keeps the preset's value.
ConfigRequest: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "ConfigRequest",
    __config__=ConfigDict(extra="allow"),
    __doc__="A preset plus any LossConfig field that overrides it (null turns an optional clamp off).",
    **{spec.name: _config_field(spec) for spec in grpo.FIELDS},
)


class BatchRequest(BaseModel):
    """One training batch: ragged rows of per-token log-probs, and rewards or advantages."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    per_token_logps: Rows = Field(
        validation_alias=_aliases("per_token_logps"),
        description="Current policy log-probs, one list per completion (ragged). Aliases: log_prob, pi_logprob.",
    )
    old_per_token_logps: LogProbRows | None = Field(
        None,
        validation_alias=_aliases("old_per_token_logps"),
        description="Old (sampling) policy log-probs; default: the current ones (ratio 1).",
    )
    ref_per_token_logps: LogProbRows | None = Field(
        None,
        validation_alias=_aliases("ref_per_token_logps"),
        description="Reference policy log-probs; default: the current ones (KL 0).",
    )
    completion_mask: MaskRows | None = Field(
        None, validation_alias=_aliases("completion_mask"), description="0/1 per token; default all 1."
    )
    prompt_lengths: Count | Counts | None = Field(
        None,
        validation_alias=_aliases("prompt_lengths"),
        description="Leading positions of each row that are prompt (excluded). Alias: input_len.",
    )
    rewards: Numbers | None = Field(None, description="One reward per row (give this or advantages).")
    advantages: Numbers | None = Field(None, description="One advantage per row (give this or rewards).")
    group_size: Annotated[int, Field(ge=1)] | None = Field(
        None, description="Consecutive rows per prompt; default: all rows are one group."
    )
    entropies: EntropyRows | None = Field(None, description="Per-token entropies, for the entropy metric.")
    tokens: TextRows | None = Field(None, description="Display strings, one per token.")

    def batch_fields(self) -> dict[str, Any]:
        return self.model_dump(exclude={"tokens", "config", "token_rows", "heatmap_rows", "configs"}, exclude_none=True)


HeatmapRows = Literal["shown", "all"]
HEATMAP_ROWS = (
    "The rows the answer's `heatmap` grid covers. 'shown': the rows whose per-token arrays it carries, and "
    "only when that grid has more cells than a heatmap has pixels (it comes pooled; else null). 'all': every "
    "row of the batch, also past the per-token limit (pooled where needed; about 0.1 s per million positions)."
)


class LossRequest(BatchRequest):
    """``POST /api/v1/loss``: a batch and the config to evaluate it under."""

    model_config = ConfigDict(json_schema_extra={"examples": [{**ARTICLE_EXAMPLE, "config": {"preset": "article"}}]})

    config: ConfigRequest | None = Field(None, description="A preset and overrides; default: the article's loss.")
    token_rows: Counts | None = Field(
        None, description="Rows whose per-token arrays to return in full when the batch is past the token limit."
    )
    heatmap_rows: HeatmapRows = Field("shown", description=HEATMAP_ROWS)


class CompareRequest(BatchRequest):
    """``POST /api/v1/compare``: one batch under several configs."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{**ARTICLE_EXAMPLE, "configs": [{"preset": "article"}, {"preset": "verl-grpo"}]}]
        }
    )

    configs: list[ConfigRequest] = Field(min_length=1, description="Presets and overrides to compare, side by side.")


class UploadForm(BaseModel):
    """``POST /api/v1/upload``'s form fields beside the file, each given as JSON text."""

    model_config = ConfigDict(extra="forbid")

    config: ConfigRequest | None = Field(None, description="A preset and overrides (over the file's own config).")
    token_rows: Counts | None = Field(None, description="Rows whose per-token arrays to return in full.")
    heatmap_rows: HeatmapRows = Field("shown", description=HEATMAP_ROWS)


class ErrorDetail(BaseModel):
    loc: list[str | int] = Field(description="Where: body, the field, the row (and position).")
    msg: str = Field(description="What was expected, and what was given.")
    type: str


class ErrorResponse(BaseModel):
    """The API's one error shape (FastAPI's), for 404, 413 and 422 alike."""

    detail: list[ErrorDetail]
