"""The tool mask (TRL 1.16's multi-turn tool calls): a tool's output sits inside the completion but is not the
model's tokens; TRL's loss counts ``completion_mask · tool_mask`` everywhere (the per-token loss, the divisors,
the entropy mask's quantile, the metrics). The batch takes it as its own field, folds it into the counted mask
and keeps the tool's tokens apart, so the page can name them.

Parity: TRL's own ``GRPOTrainer._compute_loss`` (the one-process stand-in of tests/test_vespo.py) given
``inputs["tool_mask"]``, against grpo with the field, value and gradient to float64 round-off, and its metrics.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from reference import Inputs, random_inputs
from test_vespo import trl_compute_loss

import grpo
from app.main import create_app
from grpo.explain import TOOL_OUTPUT, explain_items, token_why
from grpo.trainer_config import map_trl

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test


def tool_mask_of(inputs: Inputs, seed: int) -> torch.Tensor:
    """0 on a run of 1-3 positions in most rows (a tool's answer between the model's turns), 1 elsewhere; 0s
    in the padding too (TRL pads with 1, but a 0 there must change nothing: it does not count either way)."""
    g = torch.Generator().manual_seed(100 + seed)
    B, T = inputs.mask.shape
    tool = torch.ones(B, T, dtype=torch.float64)
    for row in range(B):
        start = int(torch.randint(0, T, (1,), generator=g))
        tool[row, start : start + int(torch.randint(1, 4, (1,), generator=g))] = 0.0
    tool[:, -1] = 0.0  # the last position: padding in the short rows, a tool's token in the full ones
    return tool


def lens(inputs: Inputs, tool: torch.Tensor, settings: dict[str, Any], **fields: Any) -> grpo.Breakdown:
    mapping = map_trl(settings)
    assert not mapping.unsupported, mapping.unsupported
    config = grpo.LossConfig.resolve({"dtype": "float64"}, base=mapping.config)
    return grpo.evaluate(grpo.Batch(**inputs.batch_fields(), tool_mask=tool, **fields), config)


TRL_SETTINGS = [
    {"loss_type": "grpo"},
    {"loss_type": "dapo", "beta": 0.04},
    {"loss_type": "dr_grpo"},
    {"loss_type": "bnpo"},
    {"loss_type": "grpo", "importance_sampling_level": "sequence"},  # the row's ratio: a mean over its model tokens
    {"loss_type": "dapo", "top_entropy_quantile": 0.5},  # the quantile over the model's tokens only
    {"loss_type": "dapo", "entropy_coef": 0.1},
]


@pytest.mark.parametrize("settings", TRL_SETTINGS, ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trl_compute_loss_with_a_tool_mask(settings: dict[str, Any], seed: int) -> None:
    inputs = random_inputs(seed, B=8, T=9, noise=0.4)
    tool = tool_mask_of(inputs, seed)
    g = torch.Generator().manual_seed(seed)
    H = torch.rand(inputs.mask.shape, generator=g, dtype=torch.float64) * 3 * inputs.mask
    loss, grad, metrics, _ = trl_compute_loss(inputs, H, tool_mask=tool, **settings)
    bd = lens(inputs, tool, settings, entropies=H)
    scale = float(bd.tokens.loss.abs().sum()) + 1.0
    torch.testing.assert_close(bd.loss, loss, rtol=1e-11, atol=1e-14 * scale)
    torch.testing.assert_close(bd.tokens.grad, grad, rtol=1e-10, atol=1e-14 * scale)
    for name in ("clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean", "entropy", "kl"):
        if name in metrics:
            assert bd.metrics[name] == pytest.approx(float(metrics[name]), rel=1e-9, abs=1e-12), name
    # what the mask means: the same batch with the tool's tokens taken out of completion_mask by hand
    folded = grpo.Batch(**{**inputs.batch_fields(), "completion_mask": inputs.mask * tool}, entropies=H)
    by_hand = grpo.evaluate(folded, bd.config)
    assert torch.equal(bd.loss, by_hand.loss) and torch.equal(bd.tokens.grad, by_hand.tokens.grad)
    # and it changes the number: the tool's tokens would otherwise count
    plain = grpo.evaluate(grpo.Batch(**inputs.batch_fields(), entropies=H), bd.config)
    assert not torch.equal(plain.tokens.grad, bd.tokens.grad)


def test_the_tool_tokens_are_kept_apart_and_named() -> None:
    # row 0: completion of 5 after no prompt, positions 1 and 2 a tool's answer, position 5 padding (tool 0
    # there too); row 1: no tool. 8 completion tokens in all, 2 of them the tool's: the loss counts 6.
    batch = grpo.Batch(
        per_token_logps=[[-0.5, -1.0, -1.5, -0.2, -0.3, -0.4], [-0.5, -0.6, -0.7, -0.8, -0.9, -1.0]],
        completion_mask=[[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]],
        tool_mask=[[1, 0, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1]],
        advantages=[1.0, -1.0],
    )
    assert batch.mask.tolist() == [[True, False, False, True, True, False], [True, True, True, False, False, False]]
    assert batch.tool_output is not None
    assert batch.tool_output.nonzero().tolist() == [[0, 1], [0, 2]]  # not the padding's 0
    # rebuilt from its own fields, the batch is the same (the completion mask is kept as given)
    again = grpo.Batch(
        per_token_logps=batch.per_token_logps,
        completion_mask=batch.completion_mask,
        tool_mask=batch.extra["tool_mask"],
        advantages=batch.advantages,
    )
    assert torch.equal(again.mask, batch.mask) and torch.equal(again.tool_output, batch.tool_output)
    bd = grpo.evaluate(batch, grpo.LossConfig.from_preset("trl-dapo", dtype="float64"))
    # dapo: weight 1/6 on each counted token, 0 on the tool's; a tool token has no gradient
    assert bd.tokens.weight[0].tolist() == pytest.approx([1 / 6, 0, 0, 1 / 6, 1 / 6, 0])
    assert float(bd.tokens.grad[0, 1:3].abs().sum()) == 0.0
    why = token_why(bd)
    code = why.names.index(TOOL_OUTPUT)
    assert (why.codes == code).nonzero().tolist() == [[0, 1], [0, 2]]
    assert why.counts()[TOOL_OUTPUT] == 2 and TOOL_OUTPUT in why.masks and TOOL_OUTPUT in why.marked
    sentence = dict(explain_items(bd))["tool_mask"]
    assert sentence.startswith("2 of the completions' 8 tokens are a tool's output (tool_mask = 0)")
    assert sentence.endswith("the loss counts the other 6.")
    # without a tool mask nothing of it shows
    plain = grpo.evaluate(grpo.Batch(per_token_logps=batch.per_token_logps, advantages=[1.0, -1.0]))
    assert TOOL_OUTPUT not in token_why(plain).names and "tool_mask" not in dict(explain_items(plain))


def test_a_bad_tool_mask_is_named() -> None:
    with pytest.raises(grpo.GrpoInputError) as err:
        grpo.Batch(per_token_logps=[[-1.0, -1.0], [-1.0, -1.0]], tool_mask=[[1, 1], [1, 0.5]], advantages=[1, 2])
    assert err.value.field == "tool_mask" and err.value.row == 1
    with pytest.raises(grpo.GrpoInputError) as err:
        grpo.Batch(per_token_logps=[[-1.0, -1.0]], tool_mask=[[1, 1, 1]], advantages=[1])
    assert err.value.field == "tool_mask"


def test_the_api_takes_a_tool_mask_and_names_its_tokens() -> None:
    client = TestClient(create_app())
    body = {
        "per_token_logps": [[-0.5, -1.0, -1.5, -0.2], [-0.5, -0.6]],
        "tool_mask": [[1, 0, 0, 1], [1, 1]],
        "advantages": [1.0, -1.0],
        "config": {"preset": "trl-dapo"},
    }
    answer = client.post("/api/v1/loss", json=body).json()
    assert answer["metrics"]["lens/num_tokens"] == 4
    assert answer["why"]["counts"][TOOL_OUTPUT] == 2 and TOOL_OUTPUT in answer["why"]["marked"]
    assert "tool_mask" in answer["explanation_keys"]
    # the env_mask alias (TRL's rollout functions' name), and a bad value: a 422 naming the field and the row
    aliased = {"env_mask" if k == "tool_mask" else k: v for k, v in body.items()}
    assert client.post("/api/v1/loss", json=aliased).json()["why"]["counts"][TOOL_OUTPUT] == 2
    bad = client.post("/api/v1/loss", json={**body, "tool_mask": [[1, 0, 0, 1], [1, 2]]})
    assert bad.status_code == 422
    detail = bad.json()["detail"][0]
    assert detail["loc"] == ["body", "tool_mask", 1, 1] and "less than or equal to 1" in detail["msg"]
