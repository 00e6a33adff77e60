"""The /loss answer carries the rollout correction per token (the off-policy correction): the sampler-vs-old log-ratio,
the weight applied, what the correction did (codes into ``correction_names``), and the loss without it."""

from __future__ import annotations

import math

from api_fixtures import client, library, ragged_body

from grpo.corrections import CORRECTION_CODES


def with_sampler(shift: float) -> dict[str, object]:
    body = ragged_body(3)
    old = body.get("old_per_token_logps") or body["per_token_logps"]
    # every token scored shift nats lower by the sampler: each row's sequence ratio is exp(shift · length)
    body["sampling_per_token_logps"] = [[v - shift for v in row] for row in old]
    return body


def test_a_sequence_mask_is_shown_per_token_with_the_loss_without_it() -> None:
    body = with_sampler(0.3)
    config = {"preset": "trl-dapo", "rollout_correction": "sequence_mask", "rollout_is_max": 1.5}
    answer = client().post("/api/v1/loss", json={**body, "config": config}).json()
    bd = library(body, "trl-dapo", rollout_correction="sequence_mask", rollout_is_max=1.5)
    assert answer["correction_names"] == list(CORRECTION_CODES)
    assert math.isclose(answer["loss_without_correction"], float(bd.loss_without_correction), rel_tol=1e-6)
    names = [[answer["correction_names"][c] for c in row] for row in answer["tokens"]["correction"]]
    assert names == [row[: len(row)] for row in _ragged(bd.tokens.correction_names(), body)]
    # a row's ratio exp(0.3 · counted tokens) passes 1.5 from 2 counted tokens on (exp(0.6) = 1.82; exp(0.3) = 1.35)
    tokens = answer["tokens"]
    for row, weights, gaps in zip(names, tokens["is_weight"], tokens["sampler_log_ratio"], strict=True):
        counted = [i for i, name in enumerate(row) if name != "not_counted"]
        assert set(row) - {"not_counted"} == ({"masked"} if len(counted) >= 2 else {"kept"} if counted else set())
        # sequence_mask keeps the row's weight exp(Σ) inside the bounds, 0 outside (TRL's vllm_is_ratio)
        kept_weight = 0.0 if len(counted) >= 2 else math.exp(0.3)
        assert all(math.isclose(weights[i], kept_weight, rel_tol=1e-5, abs_tol=1e-7) for i in counted)
        assert all(math.isclose(gaps[i], 0.3, rel_tol=1e-5) for i in counted)


def test_without_the_sampler_nothing_changes_in_the_tokens() -> None:
    answer = client().post("/api/v1/loss", json=ragged_body(3)).json()
    assert "sampler_log_ratio" not in answer["tokens"] and "correction" not in answer["tokens"]
    assert answer["loss_without_correction"] == answer["loss"]


def _ragged(rows: list[list[str]], body: dict[str, object]) -> list[list[str]]:
    lengths = [len(r) for r in body["per_token_logps"]]  # type: ignore[attr-defined]
    return [row[:n] for row, n in zip(rows, lengths, strict=True)]
