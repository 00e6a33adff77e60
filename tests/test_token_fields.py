"""The per-token fields' table (grpo.view.token_fields): every list of them is read off it, ``/api/v1/options``
sends it, and one row more is a new heatmap, pooled path included. Its browser half (the page takes its heatmaps,
hover and CSV from the table) is tests/test_browser_token_fields.py."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from api_fixtures import client as api_client
from api_fixtures import ragged_body

import grpo
from grpo.view import token_fields
from grpo.view.answer import HEATMAP_MAX_TOKENS, breakdown_to_json
from grpo.view.token_fields import TOKEN_FIELD_TABLE, TokenField

# The log-ratio's row given a heatmap, white at 0 (π = π_old): the one edit a new heatmap takes.
LOG_RATIO_HEATMAP = tuple(
    dataclasses.replace(f, heatmap="log π/π_old per token", centre=0.0) if f.name == "log_ratio" else f
    for f in TOKEN_FIELD_TABLE
)


def _wide(width: int = 2 * HEATMAP_MAX_TOKENS + 100) -> tuple[grpo.Breakdown, list[int]]:
    """Two rows of ``width`` tokens (row 1 shorter), off-policy: a grid past the heatmap's pixels, pooled."""
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(2, width, generator=g) * 2 - 0.01
    new = (old + 0.3 * torch.randn(2, width, generator=g)).clamp(max=0)
    lengths = [width, width - 37]
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    batch = grpo.Batch(per_token_logps=new, old_per_token_logps=old, advantages=[1.0, -1.0], completion_mask=mask)
    return grpo.evaluate(batch, grpo.LossConfig.from_preset("trl-grpo")), lengths


def test_the_answer_carries_each_field_of_the_table_and_pools_each_heatmap() -> None:
    bd, lengths = _wide()
    answer = breakdown_to_json(bd, lengths, every_row=True, max_tokens=0)
    names = [f.name for f in TOKEN_FIELD_TABLE]
    assert [k for k in answer["tokens"] if k in names] == names  # the table's order
    assert list(answer["heatmap"]["fields"]) == [f.name for f in TOKEN_FIELD_TABLE if f.heatmap is not None]
    for f in TOKEN_FIELD_TABLE:
        assert getattr(bd.tokens, f.name).shape == bd.tokens.mask.shape  # each is a (B, T) array of the breakdown


def test_the_lists_read_off_the_table_are_the_ones_the_page_had() -> None:
    """The page's lists before the table (behaviour unchanged): the heatmaps white at 1 for the ratio (π = π_old)
    and 0 for the signed quantities; the CSV's nine columns; the seven hover numbers; compare's five arrays."""
    assert token_fields.heatmap_centers() == {"ratio": 1.0, "surrogate": 0.0, "kl": 0.0, "loss": 0.0, "grad": 0.0}
    csv = [f.name for f in TOKEN_FIELD_TABLE if f.csv]
    assert csv == ["ratio", "clipped_ratio", "surrogate", "kl", "weight", "loss", "grad", "grad_policy", "grad_kl"]
    hover = [f.name for f in TOKEN_FIELD_TABLE if f.hover is not None]
    assert hover == ["surrogate", "kl", "weight", "loss", "grad", "grad_policy", "grad_kl"]
    assert set(token_fields.compare_fields()) == {"weight", "grad", "grad_policy", "grad_kl", "loss"}
    assert token_fields.token_field_names() == token_fields.TOKEN_FIELDS
    assert grpo.answer.TOKEN_FIELDS == token_fields.TOKEN_FIELDS  # the old import path gives the same names


def test_a_heatmap_needs_a_centre() -> None:
    with pytest.raises(ValueError, match="'x': a heatmap needs a centre"):
        TokenField("x", "x", heatmap="X")
    with pytest.raises(ValueError, match="'x': a heatmap needs a centre"):
        TokenField("x", "x", centre=0.0)


def _pooled_by_loop(values: torch.Tensor, mask: torch.Tensor, ft: int, centre: float) -> list[list[float]]:
    """Per block of ``ft`` positions in a row: its counted value farthest from ``centre`` (the first on a tie)."""
    out = []
    for r in range(values.shape[0]):
        row = []
        for start in range(0, values.shape[1], ft):
            cells = [float(values[r, j]) for j in range(start, min(start + ft, values.shape[1])) if mask[r, j]]
            row.append(max(cells, key=lambda v: abs(v - centre)) if cells else math.nan)
        out.append(row)
    return out


def test_one_row_more_is_a_new_heatmap_pooled_path_included(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(token_fields, "TOKEN_FIELD_TABLE", LOG_RATIO_HEATMAP)
    bd, lengths = _wide()
    answer = breakdown_to_json(bd, lengths, every_row=True, max_tokens=0)
    pooled = answer["heatmap"]
    assert "log_ratio" in pooled["fields"] and pooled["factor_tokens"] == 3  # 1300 positions, at most 600 columns
    expected = _pooled_by_loop(bd.tokens.log_ratio.detach(), bd.tokens.mask, 3, 0.0)
    got = pooled["fields"]["log_ratio"].tolist()
    # float32 values kept as they are (a pick, no arithmetic): equal, NaN where a block counts no token
    assert [[g if not math.isnan(g) else None for g in row] for row in got] == [
        [float(torch.tensor(e, dtype=torch.float32)) if not math.isnan(e) else None for e in row] for row in expected
    ]
    sent = {f["name"]: f for f in token_fields.token_fields_json()}
    assert sent["log_ratio"]["centre"] == 0.0 and sent["log_ratio"]["heatmap"] == "log π/π_old per token"


def test_options_send_the_table(client: Any) -> None:
    answer = client.get("/api/v1/options").json()
    assert answer["token_fields"] == [
        {**f.describe(), "colour_range": list(f.colour_range) if f.colour_range else None} for f in TOKEN_FIELD_TABLE
    ]


def test_the_compare_answer_keeps_the_compare_fields(client: Any) -> None:
    body = {**ragged_body(1), "configs": [{"preset": "trl-grpo"}, {"preset": "verl-grpo"}]}
    answer = client.post("/api/v1/compare", json=body).json()
    for result in answer["results"]:
        assert set(result["tokens"]) == {*token_fields.compare_fields(), "region"}


@pytest.fixture
def client() -> Any:
    return api_client()
