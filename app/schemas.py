"""Request models: validation lives here, in pydantic, so routes stay thin.

Field names follow TRL; verl's and the article's names are accepted as aliases. Each token
value is checked by pydantic (finite, a log-prob <= 0, a mask 0 or 1), so an error's ``loc``
names the field, the row and the position. Cross-field checks (row lengths, exactly one of
rewards/advantages, config values) are the grpo library's, mapped to the same error shape.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, create_model

import grpo
from grpo.fields import BATCH_FIELDS, BatchField, names_of
from grpo.registry import MAX_INT, MAX_MAGNITUDE, FieldSpec
from grpo.view.examples import ARTICLE_EXAMPLE

Count = Annotated[int, Field(ge=0)]
# Lists stop at their first bad entry (fail_fast): one error per field, not one per number, so a
# million positive log-probs cost one error, not seconds and hundreds of MB of them.
FAIL_FAST = Field(fail_fast=True)
TextRows = Annotated[list[Annotated[list[str], FAIL_FAST]], FAIL_FAST]
Counts = Annotated[list[Count], FAIL_FAST]


def _bounds(spec: BatchField) -> dict[str, Any]:
    """pydantic's bounds for one value of a batch field (grpo's table)."""
    number = int if spec.dtype in ("mask", "int") else float
    return {
        **({"ge": number(spec.low)} if spec.low > -math.inf else {}),
        **({"le": number(spec.high)} if spec.high < math.inf else {}),
    }


def _value_type(spec: BatchField) -> Any:
    """One value: a mask 0/1 or an int within bounds (1.0 accepted: a float tensor's ``tolist``); a float within
    bounds (finite unless NaN is allowed), a JSON number: never true/false or a string, which the schema does
    not allow (the vectorised readers refuse them too)."""
    if spec.dtype in ("mask", "int"):
        return Annotated[int, Field(**_bounds(spec))]
    number = Annotated[float, Field(allow_inf_nan=spec.nan_ok, strict=True, **_bounds(spec))]
    return number | None if spec.nan_ok else number  # null: JSON's "not scored", read as NaN


def _request_type(spec: BatchField) -> Any:
    """A batch field's JSON: ragged rows per token, a list per row (or one number for all), a number."""
    value = _value_type(spec)
    if spec.shape == "token":
        length: dict[str, Any] = {"min_length": 1} if spec.required else {}
        row = Annotated[list[value], Field(fail_fast=True, **length)]  # type: ignore[valid-type]
        return Annotated[list[row], Field(fail_fast=True, **length)]
    if spec.shape == "row":
        if spec.per_token_ok or spec.columns_ok:  # each row one number, or a list of them (per token, per function)
            token = Annotated[float, Field(allow_inf_nan=False, strict=True, **_bounds(spec))]  # numbers, not true
            entry = value | Annotated[list[token], FAIL_FAST]
            return Annotated[list[entry], FAIL_FAST]  # type: ignore[valid-type]
        rows = Annotated[list[value], FAIL_FAST]  # type: ignore[valid-type]
        return value | rows if spec.scalar_ok else rows
    if spec.vector_ok:  # one number, or one per reward function
        return value | Annotated[list[value], FAIL_FAST]  # type: ignore[valid-type]
    return value


def _batch_field(spec: BatchField) -> tuple[Any, Any]:
    """The pydantic (type, Field) of one batch field: its aliases accepted, its doc the description."""
    aliases = f" Aliases: {', '.join(spec.aliases)}." if spec.aliases else ""
    kind = _request_type(spec)
    return (
        kind if spec.required else kind | None,
        Field(
            ... if spec.required else None,
            validation_alias=AliasChoices(*names_of(spec.name)),
            description=spec.doc + aliases,
        ),
    )


# Config numbers are used as float32 scalars (1 + epsilon_high, clamp bounds): past float32's
# range torch refuses them, so the request model bounds them as LossConfig does (grpo.config).
CONFIG_TYPES: dict[str, Any] = {
    "string": str,
    "number": Annotated[float, Field(ge=-MAX_MAGNITUDE, le=MAX_MAGNITUDE, allow_inf_nan=False, strict=True)],
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


# Every batch field of grpo's table (a plugin's too), with its aliases, bounds and doc.
BatchFields: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "BatchFields",
    __config__=ConfigDict(extra="forbid", populate_by_name=True),
    **{name: _batch_field(spec) for name, spec in BATCH_FIELDS.items()},
)


class BatchRequest(BatchFields):
    """One training batch: ragged rows of per-token log-probs, and rewards or advantages."""

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
