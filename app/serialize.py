"""Requests to grpo calls and breakdowns to JSON: the one place where the app touches tensors."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel

import grpo
from app.errors import CONFIG_FIELDS, LimitError, config_error
from app.schemas import BatchRequest
from app.settings import Settings
from grpo.io import breakdown_to_json, dumps
from grpo.requests import batch_from_request, row_lengths

__all__ = ["compare_json", "dumps", "loss_json", "resolve_config"]


def resolve_config(
    request: BaseModel | None, settings: Settings, loc: tuple[str | int, ...] = ("body", "config")
) -> grpo.LossConfig:
    """A LossConfig from a preset and the fields the request set (null included); errors name
    the field under ``loc``, where the request holds this config."""
    fields: dict[str, Any] = {}
    if request is not None:
        fields = request.model_dump(exclude_unset=True) | dict(request.model_extra or {})
    preset = fields.pop("preset", None) or "article"
    if fields.get("device", "auto") == "auto":  # the server's batches arrive on the CPU: auto picks the GPU
        fields["device"] = "cuda" if settings.device == "auto" and torch.cuda.is_available() else settings.device
    try:
        return grpo.LossConfig.from_preset(preset, **fields)
    except grpo.GrpoInputError as exc:
        raise config_error([*loc], exc) from exc


def check_size(num_positions: int, settings: Settings, loc: str = "per_token_logps") -> None:
    if num_positions > settings.max_tokens:
        raise LimitError(
            ["body", loc], f"{num_positions} token positions; at most {settings.max_tokens} per request (a setting)"
        )


def _check_tokens(tokens: list[list[str]] | None, lengths: list[int]) -> None:
    if tokens is None:
        return
    if len(tokens) != len(lengths):
        raise grpo.GrpoInputError("tokens", f"{len(lengths)} rows like per_token_logps", got=f"{len(tokens)}")
    for i, (row, n) in enumerate(zip(tokens, lengths, strict=True)):
        if len(row) != n:
            raise grpo.GrpoInputError("tokens", f"{n} strings like per_token_logps[{i}]", row=i, got=f"{len(row)}")


def loss_json(
    fields: dict[str, Any],
    config: grpo.LossConfig,
    settings: Settings,
    tokens: list[list[str]] | None = None,
    token_rows: list[int] | None = None,
) -> dict[str, Any]:
    """Evaluate request-shaped ``fields`` under ``config``: the /api/v1/loss response."""
    lengths = row_lengths(fields)
    check_size(sum(lengths), settings)
    _check_tokens(tokens, lengths)
    if token_rows is not None and any(r >= len(lengths) for r in token_rows):
        bad = next(i for i, r in enumerate(token_rows) if r >= len(lengths))
        raise grpo.GrpoInputError("token_rows", f"row numbers below {len(lengths)}", row=bad)
    bd = grpo.evaluate(batch_from_request(fields), config)
    return breakdown_to_json(bd, lengths, tokens, rows=token_rows, max_tokens=settings.full_token_limit)


def compare_json(request: BatchRequest, configs: list[grpo.LossConfig], settings: Settings) -> dict[str, Any]:
    """One batch under several configs: summaries, rows and per-token weights and gradients."""
    fields = request.batch_fields()
    lengths = row_lengths(fields)
    check_size(sum(lengths) * len(configs), settings)
    _check_tokens(request.tokens, lengths)
    batch = batch_from_request(fields)
    results = []
    for i, config in enumerate(configs):
        try:
            bd = grpo.evaluate(batch, config)
        except grpo.GrpoInputError as exc:  # a config this machine cannot run (device): name which one
            if exc.field not in CONFIG_FIELDS:
                raise
            raise config_error(["body", "configs", i], exc) from exc
        full = breakdown_to_json(bd, lengths, None, max_tokens=settings.full_token_limit)
        tokens = full["tokens"]
        full["tokens"] = {k: tokens[k] for k in ("weight", "grad", "grad_policy", "grad_kl", "loss", "region")}
        results.append(full)
    return {"results": results, "lengths": lengths, "text": request.tokens}
