"""Estimators that read more than one reward per row: rewards per reward function (B, K) with reward_weights
(GDPO, TRL's multi_objective_aggregation), ReMax's greedy baselines, REINFORCE++'s per-token return.

Hand-derived values here; verl's own functions in tests/test_parity_verl_advantages.py.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from api_fixtures import client

import grpo
from grpo.advantages import ADVANTAGES
from grpo.lab import LabConfig

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

# Two reward functions, weights [1, 0.5], two groups of two:
#   group 0: f0 [1, 0], f1 [0, 1]; group 1: f0 [1, 0], f1 [1, 0]
# Per function and group, the normalised reward is ±a with a = 0.5 / (√0.5 + eps) (mean 0.5, unbiased std √0.5).
#   weighted sum per row: [a - 0.5a, -a + 0.5a, a + 0.5a, -a - 0.5a] = a·[0.5, -0.5, 1.5, -1.5]
# TRL normalize_then_sum: mean 0, unbiased std a·√((0.25 + 0.25 + 2.25 + 2.25) / 3) = a·√(5/3):
#   A = a·[0.5, -0.5, 1.5, -1.5] / (a·√(5/3) + eps)
# verl GDPO: each row's sum on its 3 tokens (N = 12), token mean 0, unbiased variance Σ 3·v² / (12 + 1e-8) · 12 / 11
#   = 15·a² / (12 + 1e-8) · 12 / 11: A = v / √(var + 1e-8)
# TRL sum_then_normalize (the default, any other estimator): Σ w·r = [1, 0.5, 1.5, 0], then GRPO per group:
#   group 0: mean 0.75, std √(2·0.25²) = 0.25·√2 -> ±0.25 / (0.25·√2 + eps); group 1: ±0.75 / (0.75·√2 + eps)
REWARDS = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
WEIGHTS = [1.0, 0.5]
EPS = 1e-4


def evaluate(advantage: str, **extra: Any) -> grpo.Breakdown:
    batch = grpo.Batch(
        per_token_logps=-torch.rand(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64),
        rewards=extra.pop("rewards", REWARDS),
        group_size=2,
        **({"reward_weights": WEIGHTS} | extra),
    )
    return grpo.evaluate(batch, grpo.LossConfig(advantage=advantage, advantage_epsilon=EPS, dtype="float64"))


def test_normalize_then_sum_by_hand() -> None:
    a = 0.5 / (math.sqrt(0.5) + EPS)
    v = [0.5 * a, -0.5 * a, 1.5 * a, -1.5 * a]
    expected = [x / (a * math.sqrt(5 / 3) + EPS) for x in v]
    assert evaluate("normalize-then-sum").advantages.tolist() == pytest.approx(expected, rel=1e-13)


def test_gdpo_by_hand() -> None:
    a = 0.5 / (math.sqrt(0.5) + EPS)
    v = [0.5 * a, -0.5 * a, 1.5 * a, -1.5 * a]
    expected = [x / math.sqrt(15 * a * a / (12 + 1e-8) * 12 / 11 + 1e-8) for x in v]
    assert evaluate("gdpo").advantages.tolist() == pytest.approx(expected, rel=1e-12)


def test_rewards_per_function_reach_other_estimators_summed_with_their_weights() -> None:
    """TRL's default sum_then_normalize: the weighted sum, then the estimator; the rows show the summed reward."""
    bd = evaluate("group")
    s2 = math.sqrt(2)
    expected = [
        0.25 / (0.25 * s2 + EPS),
        -0.25 / (0.25 * s2 + EPS),
        0.75 / (0.75 * s2 + EPS),
        -0.75 / (0.75 * s2 + EPS),
    ]
    assert bd.advantages.tolist() == pytest.approx(expected, rel=1e-13)
    assert bd.rows.reward is not None and bd.rows.reward.tolist() == [1.0, 0.5, 1.5, 0.0]
    assert bd.metrics["reward"] == 0.75  # TRL logs the mean of the weighted sum
    summed = grpo.Batch(per_token_logps=torch.zeros(4, 3) - 1, rewards=[1.0, 0.5, 1.5, 0.0], group_size=2)
    config = grpo.LossConfig(advantage="group", advantage_epsilon=EPS, dtype="float64")
    assert torch.equal(grpo.evaluate(summed, config).advantages, bd.advantages)


def test_one_function_is_one_reward_per_row() -> None:
    """(B, 1) rewards with no weights are the (B,) rewards, bit for bit, under every estimator that needs nothing
    more."""
    column = [[1.0], [0.0], [2.0], [2.0]]
    for entry in ADVANTAGES.entries():
        if entry.needs:
            continue
        flat = evaluate(entry.name, rewards=[r[0] for r in column], reward_weights=[1.0])
        assert torch.equal(evaluate(entry.name, rewards=column, reward_weights=[1.0]).advantages, flat.advantages)


def test_remax_is_the_reward_minus_the_greedy_reward() -> None:
    bd = evaluate("remax", rewards=[1.0, 0.0, 1.0, 0.5], reward_baselines=[0.5, 0.5, 1.0, 1.0], reward_weights=[1.0])
    assert bd.advantages.tolist() == [0.5, -0.5, 0.0, -0.5]


def test_reinforce_pp_discounts_each_token_by_the_tokens_after_it() -> None:
    """One row of 3 counted tokens, reward 1, γ = 0.5: returns [0.25, 0.5, 1] (γ^2, γ^1, γ^0), then whitened
    over the 3 tokens: mean 7/12, unbiased variance Σ(r - mean)² / 2."""
    batch = grpo.Batch(per_token_logps=[[-1.0, -1.0, -1.0]], rewards=[1.0])
    bd = grpo.evaluate(batch, grpo.LossConfig(advantage="reinforce-pp", gamma=0.5, dtype="float64"))
    r = [0.25, 0.5, 1.0]
    mean = sum(r) / (3 + 1e-8)
    var = sum((x - mean) ** 2 for x in r) / (3 + 1e-8) * 3 / 2
    assert bd.per_token_advantages
    assert bd.tokens.advantage[0].tolist() == pytest.approx([(x - mean) / math.sqrt(var + 1e-8) for x in r], rel=1e-12)


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"reward_weights": [1.0, 2.0, 3.0]}, "reward_weights", "2 weights, one per reward function"),
        ({"rewards": [[1.0, float("nan")], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]}, "rewards", "finite"),
        ({"advantage": "remax"}, "reward_baselines", "advantage remax reads it"),
    ],
    ids=["weights-length", "nan", "remax-without-baselines"],
)
def test_bad_multi_reward_input_names_the_field(changes: dict[str, Any], field: str, words: str) -> None:
    advantage = changes.pop("advantage", "gdpo")
    with pytest.raises(grpo.GrpoInputError, match=words) as err:
        evaluate(advantage, **changes)
    assert err.value.field == field


def test_the_api_takes_rewards_per_function_and_weights() -> None:
    api = client()
    body = {
        "per_token_logps": [[-1.0, -2.0], [-0.5], [-0.3, -0.2], [-1.0]],
        "rewards": REWARDS,
        "reward_weights": WEIGHTS,
        "group_size": 2,
        "config": {"advantage": "normalize-then-sum", "advantage_epsilon": EPS, "dtype": "float64"},
    }
    answer = api.post("/api/v1/loss", json=body).json()
    assert answer["rows"]["reward"] == [1.0, 0.5, 1.5, 0.0]
    a = 0.5 / (math.sqrt(0.5) + EPS)
    assert answer["advantages"][2] == pytest.approx(1.5 * a / (a * math.sqrt(5 / 3) + EPS), rel=1e-12)
    bad = api.post("/api/v1/loss", json={**body, "reward_weights": [1.0]})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:2] == ["body", "reward_weights"]
    remax = api.post("/api/v1/loss", json={**body, "config": {"advantage": "remax"}})
    assert remax.status_code == 422 and remax.json()["detail"][0]["loc"][:2] == ["body", "reward_baselines"]
    options = api.get("/api/v1/options").json()
    entries = {e["name"]: e for e in options["registries"]["advantage"]}
    assert entries["remax"]["needs"] == ["reward_baselines"]


def test_the_lab_refuses_what_it_cannot_supply_and_trains_the_rest() -> None:
    with pytest.raises(grpo.GrpoInputError, match="remax reads reward_baselines") as err:
        LabConfig(loss=grpo.LossConfig(advantage="remax"))
    assert err.value.field == "advantage"
    for entry in ADVANTAGES.entries():
        if not entry.needs:
            LabConfig(loss=grpo.LossConfig(advantage=entry.name))
    response = client().post("/api/v1/lab/runs", json={"config": {"advantage": "remax"}, "steps": 1})
    assert response.status_code == 422
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["body", "config", "advantage"] and "reward_baselines" in detail["msg"]


def test_options_say_what_is_not_reproduced_and_why() -> None:
    unsupported = client().get("/api/v1/options").json()["unsupported_advantages"]
    assert set(unsupported) == {"verl:gae", "verl:tir_optimal_token_baseline"}
    assert "critic" in unsupported["verl:gae"] and "turn layout" in unsupported["verl:tir_optimal_token_baseline"]


def test_the_logits_path_gives_sum_pi_squared_for_the_optimal_token_baseline() -> None:
    """Σπ² from the old logits when given (verl's actor computes it beside the old log-probs), else the current
    ones; a logits file carries it into the batch, and the lab supplies it (one step trains)."""
    g = torch.Generator().manual_seed(0)
    logits, old_logits = torch.randn(4, 5, 7, generator=g), torch.randn(4, 5, 7, generator=g)
    ids = torch.randint(0, 7, (4, 5), generator=g)
    out = grpo.token_logprobs(logits, ids, 2, old_logits=old_logits)
    assert out.sum_pi_squared is not None
    expected = torch.softmax(old_logits[:, 1:-1].float(), -1).square().sum(-1)
    torch.testing.assert_close(out.sum_pi_squared, expected, rtol=1e-6, atol=1e-7)
    from safetensors.torch import save

    from grpo.io import load_file

    data = save({"logits": logits, "old_logits": old_logits, "token_ids": ids, "rewards": torch.tensor([1.0, 0, 1, 0])})
    fields = load_file("batch.safetensors", data)
    assert fields["sum_pi_squared"].shape == (4, 4)  # prompt_length 1 by default
    batch = grpo.requests.batch_from_request({**fields, "group_size": 2})
    bd = grpo.evaluate(batch, grpo.LossConfig(advantage="optimal-token-baseline"))
    assert bd.per_token_advantages and torch.isfinite(bd.tokens.advantage).all()
    from grpo.lab import Trainer

    trainer = Trainer(LabConfig(loss=grpo.LossConfig(advantage="optimal-token-baseline"), steps=1, prompts_per_step=2))
    assert math.isfinite(trainer.step()["loss"])


def test_map_trl_picks_the_aggregation() -> None:
    from grpo.trainer_config import map_trl

    assert map_trl({"multi_objective_aggregation": "normalize_then_sum"}).config.advantage == "normalize-then-sum"
    assert map_trl(
        {"multi_objective_aggregation": "sum_then_normalize", "scale_rewards": "batch"}
    ).config.advantage == ("batch")
