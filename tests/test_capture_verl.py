"""grpo.capture.verl around verl 0.9.1's own functions, called as its actor calls them.

verl's actor loss is ``verl.workers.utils.losses.ppo_loss(config, model_output, data)``: it sets the
global batch info, calls the registered policy loss, ``kl_penalty`` and ``agg_loss``. These tests call
that function itself on padded micro-batches (log-probs flattened per sequence the way verl's
no-padding layout holds them), capture it, and check the run: every micro-batch's loss and metrics
must be what ppo_loss returned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import grpo
import grpo.capture
import grpo.trainer_config
from grpo.check import check_run
from grpo.runs import load_run, load_step

pytest.importorskip("verl")
pytest.importorskip("PIL")


def actor_config(**fields: Any) -> Any:
    from verl.workers.config import ActorConfig, PolicyLossConfig

    loss_mode = fields.pop("loss_mode", "vanilla")
    return ActorConfig(
        strategy="fsdp",
        rollout_n=4,
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=4,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        **fields,
    )


def micro_batch(seed: int, B: int = 4, P: int = 3, T: int = 6) -> dict[str, torch.Tensor]:
    """Ragged rows (one of length 1), off-policy log-probs with ratios past the clip bounds."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    lengths[-1] = 1
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    old = -torch.rand(B, T, generator=g) * 2 - 0.05
    logp = (old + 0.4 * torch.randn(B, T, generator=g)).clamp(max=-1e-3)
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    return {
        "lengths": lengths,
        "mask": mask,
        "old": old,
        "logp": logp,
        "ref": old - 0.3 * torch.rand(B, T, generator=g),
        "advantages": advantages[:, None] * mask,  # verl broadcasts and masks the row's advantage
        "prompt_length": torch.tensor(P),
    }


def call_ppo_loss(config: Any, mb: dict[str, torch.Tensor], batch_info: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """verl's actor loss on one micro-batch, with the model output in verl's no-padding layout."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    B, T = mb["mask"].shape
    P = int(mb["prompt_length"])
    flat = []
    for i in range(B):  # each sequence is prompt + response; position t scores token t + 1
        n = int(mb["lengths"][i])
        segment = torch.zeros(P + n)
        segment[P - 1 : P - 1 + n] = mb["logp"][i, :n]
        flat.append(segment)
    data = TensorDict(
        {
            "prompts": torch.ones(B, P, dtype=torch.long),
            "responses": torch.ones(B, T, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(B, P), mb["mask"]], 1).long(),
            # after the driver's rejection (verl's rollout_rs) the response mask has holes the attention has not
            "response_mask": mb.get("response_mask", mb["mask"]),
            "old_log_probs": mb["old"],
            "advantages": mb["advantages"],
            "ref_log_prob": mb["ref"],
            **({"rollout_is_weights": mb["rollout_is_weights"]} if "rollout_is_weights" in mb else {}),
        },
        batch_size=[B],
    )
    tu.assign_non_tensor(data, **batch_info)
    loss, metrics = ppo_loss(config, {"log_probs": torch.cat(flat)}, data)
    return float(loss), metrics


CASES = {
    # GRPO recipe: seq-mean-token-mean, low_var_kl, local normalisers
    "grpo": ({"loss_agg_mode": "seq-mean-token-mean", "use_kl_loss": True, "kl_loss_coef": 0.04}, False),
    # DAPO: clip-higher, token-mean over the mini-batch's tokens (two micro-batches add up to it)
    "dapo": ({"loss_agg_mode": "token-mean", "clip_ratio_high": 0.28}, True),
    # Dr. GRPO: seq-mean-token-sum-norm with a constant and the nominal batch size
    "dr_grpo": (
        {
            "loss_agg_mode": "seq-mean-token-sum-norm",
            "loss_scale_factor": 16,
            "use_kl_loss": True,
            "kl_loss_type": "k2",
        },
        True,
    ),
    "gspo": (
        {"loss_mode": "gspo", "loss_agg_mode": "seq-mean-token-mean", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
        True,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_verl_actor_loss_is_captured_and_checks(case: str, tmp_path: Path) -> None:
    fields, global_info = CASES[case]
    config = actor_config(**fields)
    returned: list[float] = []
    with grpo.capture.verl(tmp_path / "run", micro_batches_per_step=2):
        for step in range(2):
            batches = [micro_batch(10 * step + m) for m in range(2)]
            tokens = int(sum(mb["mask"].sum() for mb in batches))
            info = {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": 8} if global_info else {}
            info = {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None} | info
            for mb in batches:
                returned.append(call_ppo_loss(config, mb, info)[0])

    run = load_run(tmp_path / "run")
    assert run.info["source"] == "verl" and run.info["status"] == "done"
    assert [(s.step, s.micro) for s in run.steps] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for ref, loss in zip(run.steps, returned, strict=True):
        info = load_step(ref.path)[2]
        assert info["meta"]["loss"] == pytest.approx(loss, rel=1e-6, abs=1e-9)  # what ppo_loss returned
        assert "actor/pg_clipfrac" in info["meta"]["metrics"]
        # the passes over each rollout (the actor's ppo_epochs); which rollout, the loss functions do not see
        assert info["meta"]["rollout"] == {"iterations": config.ppo_epochs}
    check = check_run(run)
    assert check.ok, [
        (m.step, m.micro, m.rel_error, {k: v.diff for k, v in m.metrics.items() if not v.ok}) for m in check.micro
    ]
    assert all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)
    compared = set().union(*(m.metrics for m in check.micro))
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/pg_loss"} <= compared
    assert any(m.metrics["actor/pg_clipfrac"].trainer > 0 for m in check.micro)  # the clip acted


def test_the_registry_and_functions_are_restored(tmp_path: Path) -> None:
    from verl.trainer.ppo import core_algos
    from verl.workers.utils import losses

    before = (dict(core_algos.POLICY_LOSS_REGISTRY), core_algos.agg_loss, core_algos.kl_penalty, losses.agg_loss)
    with pytest.raises(RuntimeError), grpo.capture.verl(tmp_path / "run"):
        assert core_algos.agg_loss is not before[1]
        raise RuntimeError("the trainer crashed")
    after = (dict(core_algos.POLICY_LOSS_REGISTRY), core_algos.agg_loss, core_algos.kl_penalty, losses.agg_loss)
    assert after == before
    assert load_run(tmp_path / "run").info["status"] == "failed"


def test_from_verl_maps_the_actor_config() -> None:
    config = grpo.LossConfig.from_verl(actor_config(**CASES["grpo"][0]))
    assert config == grpo.LossConfig.from_preset("verl-grpo", beta=0.04, preset=None)
    mapping = grpo.trainer_config.map_verl(actor_config(entropy_coeff=0.01, kl_loss_type="full", use_kl_loss=True))
    assert set(mapping.unsupported) == {"kl_loss_type"}  # the entropy bonus is mapped (tests/test_entropy_bonus.py)
    assert mapping.config.entropy_coef == 0.01
    with pytest.raises(grpo.GrpoInputError, match="kl_loss_type"):
        grpo.LossConfig.from_verl(actor_config(kl_loss_type="full", use_kl_loss=True), strict=True)
