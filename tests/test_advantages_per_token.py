"""Advantages per token (B, T) as an input: the loss, the rows, the why, the answer, the verl capture.

verl hands its policy losses (B, T) advantages and TRL's ``_compute_loss`` accepts them from subclasses
(it unsqueezes only a (B,) tensor). A batch may give them per row (B,) or per token (B, T) (ragged rows in
a request, like the log-probs); every objective broadcasts them as the trainers do.

- property: a (B, T) input constant over each row gives the (B,) input's loss, gradient and per-token terms
  bit for bit, under every preset;
- parity: verl 0.9.1's registered policy losses called with (B, T) advantages that differ per token equal
  GRPO Lens's value and gradient to float64 round-off, with verl's metrics;
- the rows table: a row's advantage is its value when its tokens agree, else their mean with the range;
- the API: ragged per-token advantages in, a 4xx naming the field and the row for a bad shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from api_fixtures import client
from reference import Inputs, leaf, random_inputs

import grpo
import grpo.capture
from grpo.answer import breakdown_to_json
from grpo.config import PRESETS
from grpo.explain import ZERO_ADVANTAGE, explain_items, token_why
from grpo.loss import row_values
from grpo.requests import batch_from_request
from grpo.trainer_config import VERL_LOSS_MODES, map_verl

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

# Presets whose trainer reduces a per-row clip flag differently from a per-token one: TRL's (and verl's)
# sequence-level flags are (B, 1) with (B,) advantages (a mean over rows) and (B, T) with (B, T) ones (a mean
# over tokens); VESPO's phi is (B, 1) or (B, T) the same way. Their loss and gradient still agree bit for bit.
SHAPE_DEPENDENT_METRICS = {"trl-gspo", "verl-gspo", "trl-vespo"}


def per_token(inputs: Inputs, varying: bool, seed: int = 0) -> torch.Tensor:
    """(B, T) advantages: each row's on its tokens (constant), or that plus noise per token; garbage (NaN)
    where nothing counts, which the batch must zero."""
    a = inputs.advantages[:, None].expand_as(inputs.mask).clone()
    if varying:
        g = torch.Generator().manual_seed(seed)
        a = a + torch.randn(a.shape, generator=g, dtype=a.dtype)
        a[:, 0] = 0.0  # some tokens with A = 0 (no policy gradient)
    return a.masked_fill(inputs.mask == 0, float("nan"))


def fields(inputs: Inputs, advantages: torch.Tensor) -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    entropies = torch.rand(inputs.mask.shape, generator=g, dtype=torch.float64)
    return {**inputs.batch_fields(), "advantages": advantages, "entropies": entropies}


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("seed", [0, 1])
def test_constant_per_token_advantages_equal_per_row_ones_bit_for_bit(preset: str, seed: int) -> None:
    inputs = random_inputs(seed, B=6, T=7, noise=0.5)  # one empty row
    config = grpo.LossConfig.from_preset(preset, dtype="float64")
    rows = grpo.evaluate(grpo.Batch(**fields(inputs, inputs.advantages)), config)
    tokens = grpo.evaluate(grpo.Batch(**fields(inputs, per_token(inputs, varying=False))), config)
    assert not rows.per_token_advantages and tokens.per_token_advantages
    assert torch.equal(rows.loss, tokens.loss)
    for name in ("grad", "grad_policy", "loss", "surrogate", "ratio", "clipped_ratio", "weight", "region", "advantage"):
        assert torch.equal(getattr(rows.tokens, name), getattr(tokens.tokens, name)), name
    counted = rows.rows.length > 0  # an empty row's advantage exists per row only: per token it is 0
    assert torch.equal(rows.advantages[counted], tokens.advantages[counted])
    assert float(tokens.advantages[~counted].abs().sum()) == 0
    assert torch.equal(token_why(rows).codes, token_why(tokens).codes)
    if preset not in SHAPE_DEPENDENT_METRICS:
        differ = {k for k, v in rows.metrics.items() if not k.startswith("lens/advantage") and tokens.metrics[k] != v}
        assert not differ


def test_row_values_keep_a_constant_row_exactly_and_average_a_varying_one() -> None:
    # row 0: 0.1 on its three tokens -> 0.1 exactly (a mean would give 0.30000000000000004 / 3 = 0.10000000000000002)
    # row 1: [1, -2] on two counted tokens -> mean -0.5; row 2: no counted token -> 0
    a = torch.tensor([[0.1, 0.1, 0.1], [1.0, -2.0, 9.0], [5.0, 5.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]], dtype=torch.float64)
    assert row_values(a, mask).tolist() == [0.1, -0.5, 0.0]


def test_each_token_is_scaled_by_its_own_advantage_by_hand() -> None:
    """On-policy (ratio 1), token-mean over 3 tokens: loss = -Σ A_t / 3, d loss / d logp_t = -A_t / 3
    (the clipped surrogate's gradient at ratio 1 is A_t, times the weight 1/3)."""
    batch = grpo.Batch(per_token_logps=[[-1.0, -2.0, -0.5]], advantages=[[1.5, -3.0, 0.0]])
    bd = grpo.evaluate(batch, grpo.LossConfig.from_preset("trl-dapo", dtype="float64"))
    assert float(bd.loss) == pytest.approx(-(1.5 - 3.0 + 0.0) / 3, abs=1e-15)
    assert bd.tokens.grad[0].tolist() == pytest.approx([-0.5, 1.0, 0.0], abs=1e-15)
    assert bd.advantages.tolist() == [pytest.approx(-0.5)]  # the row's mean: its tokens differ
    why = token_why(bd)
    assert [why.names[c] for c in why.codes[0].tolist()] == ["trust", "trust", ZERO_ADVANTAGE]
    signs = breakdown_to_json(bd)["curves"]["points"]["sign"]
    assert signs.tolist() == [1, -1, 0]  # the clip view places each token by its own sign


# --- parity: verl's registered policy losses with advantages that differ per token ---------------------
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def verl_actor(loss_mode: str, agg: str) -> Any:
    from verl.workers.config import ActorConfig, PolicyLossConfig

    policy = {"dro_beta": 0.3} if loss_mode == "dro" else {}
    return ActorConfig(
        strategy="fsdp",
        rollout_n=3,
        ppo_mini_batch_size=6,
        ppo_micro_batch_size_per_gpu=6,
        loss_agg_mode=agg,
        clip_ratio_high=0.28,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, **policy),
    )


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("mode", sorted(VERL_LOSS_MODES))
@pytest.mark.parametrize("seed", [0, 1])
def test_verl_losses_with_per_token_advantages(mode: str, agg: str, seed: int) -> None:
    inputs = random_inputs(seed, B=6, T=7, noise=0.7)
    advantages = per_token(inputs, varying=True, seed=seed)
    config = verl_actor(mode, agg)
    lp = leaf(inputs.logp)
    torch.manual_seed(seed)  # clip_cov's torch.randperm
    loss, metrics = core_algos.get_policy_loss_fn(mode)(
        old_log_prob=inputs.old.nan_to_num(0.0),
        log_prob=lp,
        advantages=advantages.nan_to_num(0.0),  # verl's advantages hold 0 past each response
        response_mask=inputs.mask,
        loss_agg_mode=agg,
        config=config,
    )
    (grad,) = torch.autograd.grad(loss, lp)
    mapping = map_verl(config)
    assert not mapping.unsupported, mapping.unsupported
    lens_config = grpo.LossConfig.resolve({"dtype": "float64", "clip_cov_seed": seed}, base=mapping.config)
    bd = grpo.evaluate(grpo.Batch(**fields(inputs, advantages)), lens_config)
    scale = float(bd.tokens.policy_loss.abs().sum()) + 1.0
    torch.testing.assert_close(bd.loss, loss.detach(), rtol=1e-11, atol=1e-13 * scale)
    torch.testing.assert_close(bd.tokens.grad, grad, rtol=1e-10, atol=1e-13 * scale)
    for name, value in metrics.items():
        assert bd.metrics[name] == pytest.approx(float(value), rel=1e-9, abs=1e-12), name


# --- the answer and the API --------------------------------------------------------------------------
def test_the_answer_shows_a_varying_rows_mean_and_range_and_a_constant_rows_value() -> None:
    batch = grpo.from_rows([[-1.0, -1.0], [-0.5, -0.2, -0.3]], advantages=[[0.5, 0.5], [1.0, -2.0, 4.0]])
    answer = breakdown_to_json(grpo.evaluate(batch, grpo.LossConfig.from_preset("trl-dapo")), lengths=[2, 3])
    spread = answer["advantage_per_token"]
    assert answer["rows"]["advantage"].tolist() == pytest.approx([0.5, 1.0])  # row 1: (1 - 2 + 4) / 3
    assert spread["min"].tolist() == [0.5, -2.0] and spread["max"].tolist() == [0.5, 4.0]
    assert spread["varies"] == [False, True]
    assert [row.tolist() for row in answer["tokens"]["advantage"]] == [[0.5, 0.5], [1.0, -2.0, 4.0]]
    plain = breakdown_to_json(grpo.evaluate(grpo.from_rows([[-1.0]], advantages=[1.0]), grpo.LossConfig()))
    assert plain["advantage_per_token"] is None and "advantage" not in plain["tokens"]


BODY = {"per_token_logps": [[-1.0, -2.0], [-0.5]], "old_per_token_logps": [[-1.1, -1.5], [-0.7]]}


@pytest.mark.parametrize("json_body", [True, False], ids=["json", "dict"])
def test_the_api_takes_ragged_per_token_advantages(json_body: bool) -> None:
    api = client()
    body = {**BODY, "advantages": [[1.0, -1.0], [0.5]], "config": {"preset": "trl-dapo", "dtype": "float64"}}
    answer = api.post("/api/v1/loss", json=body).json()
    expected = grpo.evaluate(grpo.from_rows(**{k: v for k, v in body.items() if k != "config"}), _dapo64())
    assert answer["loss"] == pytest.approx(float(expected.loss), rel=1e-12)
    assert answer["advantage_per_token"]["varies"] == [True, False]
    assert answer["tokens"]["advantage"] == [[1.0, -1.0], [0.5]]
    # the same rows as one number each (the second row's tokens agree): the same loss on every token it shares
    per_row = api.post("/api/v1/loss", json={**body, "advantages": [0.0, 0.5]}).json()
    assert per_row["tokens"]["loss"][1] == answer["tokens"]["loss"][1]


def _dapo64() -> grpo.LossConfig:
    return grpo.LossConfig.from_preset("trl-dapo", dtype="float64")


@pytest.mark.parametrize(
    ("advantages", "loc", "words"),
    [
        ([[1.0, -1.0], [0.5, 0.2]], ["body", "advantages", 1], ["1 values like per_token_logps[1]"]),
        ([[1.0, -1.0]], ["body", "advantages"], ["2 rows"]),
        ([[1.0, -1.0], 0.5], ["body", "advantages", 1], ["not both"]),
        ([[1.0, None], [0.5]], ["body", "advantages", 0], []),
        ([[1.0, "x"], [0.5]], ["body", "advantages", 0], []),
    ],
    ids=["row-length", "row-count", "mixed", "null", "string"],
)
def test_bad_per_token_advantages_are_a_422_naming_field_and_row(
    advantages: Any, loc: list[Any], words: list[str]
) -> None:
    response = client().post("/api/v1/loss", json={**BODY, "advantages": advantages})
    assert response.status_code == 422, response.text
    first = response.json()["detail"][0]
    assert first["loc"][: len(loc)] == loc, first
    for word in words:
        assert word in first["msg"], first


def test_a_non_finite_counted_advantage_is_refused_and_padding_is_not_read() -> None:
    logp = torch.tensor([[-1.0, -2.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    ok = grpo.Batch(per_token_logps=logp, completion_mask=mask, advantages=[[1.0, 2.0, float("inf")]])
    assert ok.advantages is not None and ok.advantages.tolist() == [[1.0, 2.0, 0.0]]
    with pytest.raises(grpo.GrpoInputError, match=r"advantages\[0\]: expected finite.*nan at position 1"):
        grpo.Batch(per_token_logps=logp, completion_mask=mask, advantages=[[1.0, float("nan"), 0.0]])
    wrong = r"one number per row \(1\) or one per token, shape \(1, 3\).*got shape \(1, 2\)"
    with pytest.raises(grpo.GrpoInputError, match=wrong):
        grpo.Batch(per_token_logps=logp, advantages=[[1.0, 2.0]])


def test_exports_keep_per_token_advantages() -> None:
    from grpo.export import export_batch
    from grpo.io import load_file

    body = {**BODY, "advantages": [[1.0, -1.0], [0.5]]}
    for fmt in ("json", "jsonl", "safetensors", "npz"):
        data = export_batch(body, fmt)
        fields = load_file(f"batch.{fmt}", data)
        batch = batch_from_request(fields)
        assert batch.advantages is not None and batch.advantages.tolist()[0] == [1.0, -1.0], fmt


# --- the verl capture keeps (B, T) ---------------------------------------------------------------------
def test_the_verl_capture_keeps_per_token_advantages_and_checks(tmp_path: Path) -> None:
    """verl's ppo_loss on micro-batches whose advantages differ per token: the capture stores them (B, T) as
    verl handed them, check-run reproduces every micro-batch, and the run view's request carries them per token."""
    pytest.importorskip("PIL")
    from test_capture_verl import actor_config, call_ppo_loss, micro_batch

    from app.runview import step_batch
    from grpo.check import check_run
    from grpo.runs import load_run, load_step

    config = actor_config(loss_agg_mode="seq-mean-token-mean", use_kl_loss=True, kl_loss_coef=0.04)
    info = {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None}
    with grpo.capture.verl(tmp_path / "run", micro_batches_per_step=2):
        for m in range(2):
            mb = micro_batch(m)
            g = torch.Generator().manual_seed(m)
            mb["advantages"] = (mb["advantages"] + torch.randn(mb["mask"].shape, generator=g)) * mb["mask"]
            call_ppo_loss(config, mb, info)
    run = load_run(tmp_path / "run")
    batch = load_step(run.steps[0].path)[0]
    assert batch.advantages is not None and batch.advantages.dim() == 2
    check = check_run(run)
    assert check.ok and all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)
    fields, stored, _ = step_batch(run, 1, 0)
    assert isinstance(fields["advantages"][0], list)  # ragged rows, one value per token
    replayed = grpo.evaluate(batch_from_request(fields), stored)
    torch.testing.assert_close(replayed.loss, grpo.evaluate(batch, stored).loss)


def test_the_sentence_says_how_many_rows_vary_and_the_range() -> None:
    """Rows 0 and 2 vary (row 1's tokens agree; row 2's masked last token is not read): 2 of 3, from -2 to 1."""
    batch = grpo.from_rows(
        [[-1.0, -1.0], [-0.5], [-0.5, -0.2, -0.3]],
        advantages=[[0.5, -0.5], [0.25], [1.0, -2.0, 9.0]],
        completion_mask=[[1, 1], [1], [1, 1, 0]],
        old_per_token_logps=[[-1.2, -0.8], [-0.4], [-0.6, -0.1, -0.3]],
    )
    items = dict(explain_items(grpo.evaluate(batch, grpo.LossConfig.from_preset("verl-grpo"))))
    assert items["per_token_advantages"].startswith(
        "The advantages come per token: 2 of 3 rows carry different ones on their tokens (from -2 to 1 over the batch)"
    )
    constant = grpo.from_rows([[-1.0, -1.0]], advantages=[[0.5, 0.5]])
    assert "per_token_advantages" not in dict(explain_items(grpo.evaluate(constant)))


# --- parity: TRL's _compute_loss with (B, T) advantages (a subclass's; TRL unsqueezes only a (B,) tensor) -----
TRL_CASES = [(t, "token") for t in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")] + [
    ("grpo", "sequence"),
    ("dapo", "sequence"),
]


@pytest.mark.parametrize(("loss_type", "level"), TRL_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_trl_compute_loss_with_per_token_advantages(loss_type: str, level: str, seed: int) -> None:
    """TRL 1.16's own _compute_loss (tests/test_vespo.py's one-process stand-in) on advantages that differ per
    token: GRPO Lens's value, gradient and TRL's logged metrics under map_trl of the same GRPOConfig. At sequence
    level TRL's gradient goes through the row's mean log-ratio: map_trl keeps sequence_ratio_gradient="mean"."""
    pytest.importorskip("trl")
    from test_vespo import trl_compute_loss

    from grpo.trainer_config import map_trl

    inputs = random_inputs(seed, B=6, T=7, noise=0.5)
    advantages = per_token(inputs, varying=True, seed=seed).nan_to_num(0.0)
    given = Inputs(inputs.logp, inputs.old, inputs.ref, inputs.mask, advantages, inputs.rewards, inputs.group_size)
    settings = {"loss_type": loss_type, "importance_sampling_level": level, "beta": 0.04}
    loss, grad, metrics, trainer = trl_compute_loss(given, **settings)
    config = map_trl(trainer.args).config.replace(dtype="float64")
    assert config.sequence_ratio_gradient == "mean"
    bd = grpo.evaluate(grpo.Batch(**given.batch_fields()), config)
    scale = float(bd.tokens.loss.abs().sum()) + 1.0
    # sapo: TRL's torch.where(A > 0, 1.0, 1.05) of Python floats is a float32 tensor, so its 1.05 is float32's
    # (a relative 2e-8 off): a few 1e-8 of the loss; everything else is float64 round-off
    rtol, atol = (1e-6, 1e-9) if loss_type == "sapo" else (1e-11, 1e-13 * scale)
    torch.testing.assert_close(bd.loss, loss, rtol=rtol, atol=atol)
    torch.testing.assert_close(bd.tokens.grad, grad, rtol=max(rtol, 1e-10), atol=atol)
    for name, value in metrics.items():
        if name != "entropy":  # TRL's from the stand-in's zero entropies; the batch gives none
            assert bd.metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
